"""Host diagnosis: one module per subsystem, each registering its checks on REGISTRY.

Check modules never touch the system themselves: they read through `ctx.host` only
(tests/test_conformance.py enforces it), return a Result, and never print.
"""

from __future__ import annotations

from typing import Any

from ..registry import Context, Registry

REGISTRY = Registry()
check = REGISTRY.check

# Registration happens on import; the list is explicit so a new module that is not named here
# fails the conformance test instead of silently not running.
from . import system  # noqa: E402
from . import deep  # noqa: E402  (the GPU probe runs last: it is the slow one)

MODULES = (system, deep)


def load_registry() -> Registry:
    REGISTRY.validate()
    return REGISTRY


def host_facts(ctx: Context) -> dict[str, Any]:
    """The report's `host` section: what the checks found, independent of any verdict."""
    return system.host_facts(ctx)
