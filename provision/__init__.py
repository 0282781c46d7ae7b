"""Provisioning: what acts on the machine (writes files, starts processes), always through the write seam.

`bundle/` fetches, verifies, qualifies and activates the vllm-rocm bundle; `server/` computes the server's
arguments and writes the units that run it; `verify/` proves it serves and measures it.
"""
