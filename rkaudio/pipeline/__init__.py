"""A family's declaration (`declaration`), its schema, the export records, ladders, and the one pipeline that
exports, gates and builds every family alike (`pipeline.run`)."""
