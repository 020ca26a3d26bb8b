"""`python -m converters.cli`: the `convert` command (what the Makefile and the tests run)."""
from converters.cli import main

main()
