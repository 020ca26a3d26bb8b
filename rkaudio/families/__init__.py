"""One module per model family. Each defines `register(app)` that adds its typer sub-command;
the CLI discovers them by listing this package, so adding a family adds one module here."""
