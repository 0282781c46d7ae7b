"""Every shared-fixture module in tests/plugins/ is registered (a new one that is not would silently not load)."""

from __future__ import annotations

import pytest

import conftest
from conftest import REPO


def plugins_in_addopts(config: pytest.Config) -> set[str]:
    """The plugins pyproject's addopts loads with `-p` (before conftest.py: tests/plugins/kinds.py says why)."""
    words = config.getini("addopts")
    return {value for flag, value in zip(words, words[1:], strict=False) if flag == "-p"}


def test_every_plugin_module_is_registered(pytestconfig):
    on_disk = {f"plugins.{p.stem}" for p in (REPO / "tests" / "plugins").glob("*.py") if p.stem != "__init__"}
    from_conftest, from_addopts = set(conftest.pytest_plugins), plugins_in_addopts(pytestconfig)
    assert from_addopts == {"plugins.kinds"}
    assert not from_conftest & from_addopts, "a plugin registered twice"
    assert from_conftest | from_addopts == on_disk
