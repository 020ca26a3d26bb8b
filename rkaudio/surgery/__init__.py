"""Rewrites that make a graph NPU-friendly and stay exact, each knowing nothing of the family that uses it:
`rkaudio.surgery.graph` holds ONNX passes (`ModelProto -> ModelProto`), `rkaudio.surgery.modules` torch passes
(`nn.Module -> nn.Module`, applied before tracing). Surgery rewrites; it never judges (gates do)."""
