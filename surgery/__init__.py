"""Pure ONNX rewrites, each `ModelProto -> ModelProto`, each knowing nothing of the family using it."""
