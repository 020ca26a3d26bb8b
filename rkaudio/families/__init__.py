"""One folder (or module) per model family, each ending in its declaration `FAMILY = Family(...)`; the CLI and
the recipes find them by listing this package, so adding a family adds one folder here."""
