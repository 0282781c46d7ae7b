"""Fixtures for the smoke and bench tests."""

from __future__ import annotations

import pytest

from harness.engine import free_port


@pytest.fixture
def unused_port() -> int:
    """A loopback port that nothing listens on (bound, then released)."""
    return free_port()
