"""Several nodes serving one model or one replica set on vLLM's own distributed engine: each node's facts
(read through the Host), their comparison into one pre-flight report, the documents nodes exchange, and
the per-node layout (head, headless workers, the ports between them)."""
