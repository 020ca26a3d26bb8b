"""rknn-toolkit2 itself: which versions build (the targets are runtime.board.soc), where each converter venv
is, the child script that runs in that venv (`toolkit.child`) and its parent half (`toolkit.session`), shared by
the engine build and the simulator backend. Imports nothing: the converter-venv child imports `toolkit.child` alone."""
