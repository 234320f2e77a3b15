"""accelkit: from one GPU to many, on top of HuggingFace Accelerate and PyTorch."""

__version__ = "0.1.0"
