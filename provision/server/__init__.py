"""The vLLM server: its arguments, the layouts a host allows, the systemd units that run it, `serve` in the
foreground, Lemonade Server as another place the same settings go."""
