"""Provisioning: fetch, verify, extract and activate the vllm-rocm bundle; compute the server's
arguments, run it in the foreground, and write the systemd unit that runs it.

Modules here act on the machine (start processes, write files) and use relative imports only.
"""
