"""rocmdoctor: get vLLM running on AMD ROCm hosts and keep it running."""

__version__ = "0.1.0"
