"""Torch passes, each one `nn.Module -> nn.Module` applied before tracing: fold weight norm, polyphase
upsampling, masked GAP instance norm, the Snake sine in NPU forms."""
