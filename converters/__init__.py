"""Orchestration and the top of the house, in rooms bottom up: `build/` (the engine build, the child analysis,
diagnose, the build-time self-test goldens), `family/` (the one family pipeline and the family declaration),
`release/` (recipes, the scheduler and lock, packages, the model card, the kit's host side, publish), then the
families (`families/<name>/`) and the CLI (`cli/`). Imports nothing itself, so importing a family does not pull
in the others."""
