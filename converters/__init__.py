"""Orchestration and the top of the house: the engine build (`engine`), the one family pipeline (`pipeline`),
recipes and packaging, the shared CLI options; above them the families (`families/<name>/`) and the CLI
(`commands`, `cli`). Imports nothing itself, so importing a family does not pull in the others."""
