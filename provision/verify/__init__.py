"""Proof that a served model works and what it costs: smoke, bench, health from /metrics, and the OpenAI
client and answer shapes they share."""
