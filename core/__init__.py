"""The bottom room: the vocabulary every layer shares (errors, the ONNX contract, artifact paths, ONNX graph
lookups). Imports nothing from the rest of rkaudio; its modules import only the stdlib at module level
(onnx where a module is about ONNX graphs), so the board kit can use errors, contract and paths with numpy alone."""
