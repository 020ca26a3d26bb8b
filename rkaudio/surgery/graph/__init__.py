"""ONNX passes, each one `ModelProto -> ModelProto`: fold, cut at the VITS seam, fold flips, mask the decoder,
polyphase the last levels, cap conv pads, band the relative attention, swap the fp16 rounding shift; and for any
user graph (`convert build --fix`): Sin as a polynomial, InstanceNormalization through GlobalAveragePool, constant
computations (a weight norm) folded."""
