"""Rendering for people and for Prometheus: data in, text out, apart from the logic that made the data."""
