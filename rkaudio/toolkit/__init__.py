"""rknn-toolkit2 itself: which versions build (the targets are rkaudio.board.soc), where each converter venv
is, the child script that runs in that venv (`rkaudio.toolkit.child`) and its parent half (`rkaudio.toolkit.session`), shared by
the engine build and the simulator backend. Imports nothing: the converter-venv child imports `rkaudio.toolkit.child` alone."""
