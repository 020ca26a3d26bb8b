"""What only the host runs: the onnxruntime and simulator backends, the consumer's exec_plan rules, WAV I/O, the
hearing of a check, and the host halves of family runtimes."""
