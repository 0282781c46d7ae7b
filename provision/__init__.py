"""Provisioning: fetch, verify, extract and activate the vllm-rocm bundle (no host diagnosis here)."""
