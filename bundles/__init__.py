"""Data only: the pinned description of the vllm-rocm bundles (manifest and lock), shipped in the wheel."""
