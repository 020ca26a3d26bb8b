"""The vocabulary every host layer shares (errors, the ONNX contract, artifact paths, ONNX graph lookups, the
manifest). Imports nothing of rkaudio but `rkaudio.board`, the closed folder below it that the board kit ships
(SetupError, the package file names, the numerics); its modules import only the stdlib and numpy at module level
(onnx where a module is about ONNX graphs)."""
