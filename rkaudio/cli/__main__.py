"""`python -m rkaudio.cli`: the `convert` command (what the Makefile and the tests run)."""
from rkaudio.cli import main

main()
