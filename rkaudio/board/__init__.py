"""The board kit: what a package ships to run its own self-test on a board (Python 3.8, numpy, rknnlite).
Imports nothing outside this folder but numpy and the stdlib (tests/structure checks it)."""
