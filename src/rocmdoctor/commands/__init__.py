"""One module per command group; each command parses, calls core code, renders."""
