"""Provisioning: server arguments, the foreground runner and the systemd unit.

Modules here act on the machine (start processes, write files) and use relative imports only.
"""
