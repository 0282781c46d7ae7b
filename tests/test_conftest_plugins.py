"""Every shared-fixture module in tests/plugins/ is registered (a new one that is not would silently not load)."""

from __future__ import annotations

import conftest
from conftest import REPO


def test_every_plugin_module_is_registered():
    on_disk = {f"plugins.{p.stem}" for p in (REPO / "tests" / "plugins").glob("*.py") if p.stem != "__init__"}
    assert set(conftest.pytest_plugins) == on_disk
