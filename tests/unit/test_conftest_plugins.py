"""Every shared-fixture module in tests/plugins/ is registered (a new one that is not would silently not load)."""

from __future__ import annotations

import conftest
from conftest import REPO


def test_every_plugin_module_is_registered(pytestconfig):
    on_disk = {f"plugins.{p.stem}" for p in (REPO / "tests" / "plugins").glob("*.py") if p.stem != "__init__"}
    # or with `-p` in pyproject's addopts, before conftest.py (plugins.kinds: tests/plugins/kinds.py says why)
    words = pytestconfig.getini("addopts")
    by_option = {value for flag, value in zip(words, words[1:], strict=False) if flag == "-p"}
    assert by_option == {"plugins.kinds"}
    assert set(conftest.pytest_plugins) | by_option == on_disk
