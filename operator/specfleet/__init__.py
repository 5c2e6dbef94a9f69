"""specfleet: a Kubernetes operator that guards speculative decoding and quantization."""

__version__ = "0.1.0"
