"""One poll loop for the tests that wait on a machine, a server or a process to reach a state."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `predicate` every half second until it is truthy (its value is returned); AssertionError
    naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)
