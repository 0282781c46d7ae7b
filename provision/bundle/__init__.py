"""The vllm-rocm bundle: choose a release, fetch and verify its parts, extract, qualify on this host,
activate atomically, roll back and prune."""
