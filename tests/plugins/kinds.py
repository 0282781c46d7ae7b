"""The test kinds, one folder each: tests/unit, tests/cli, tests/system (README, "Tests").

Everything under tests/system/ is marked `system`, and so is every test elsewhere that needs a real
component (marked `engine`, `ssh` or `nspawn`, by hand or from the fixtures it uses), so
`-m "not system"` is the fast suite wherever a test lives. A test in another folder that needs a real
component none of those names (vLLM's environment without its engine) carries `system` by hand.

Loaded with `-p plugins.kinds` from pyproject's addopts, not from conftest's `pytest_plugins`: a plugin
named there is registered after conftest.py, so its hook would run before conftest's and miss the
`engine` marker that conftest adds from the fixtures. Registered before conftest.py, this hook runs
after it and still before pytest's own `-m` deselection.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
# Where each kind of test lives; a test module anywhere else under tests/ is refused by
# tests/unit/test_suite_layout.py.
KIND_DIRS = {
    "unit": TESTS / "unit",  # pure logic in-process: no subprocess of the CLI, no server
    "cli": TESTS / "cli",  # the rocmdoctor command line against fixtures and loopback stand-in servers
    "system": TESTS / "system",  # real components: vLLM, systemd-nspawn, sshd/Ansible, GNU tar, builds
}
REAL_COMPONENT_MARKERS = ("engine", "ssh", "nspawn")


def is_system(item: pytest.Item) -> bool:
    return item.path.is_relative_to(KIND_DIRS["system"]) or any(
        item.get_closest_marker(name) is not None for name in REAL_COMPONENT_MARKERS
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_system(item):
            item.add_marker(pytest.mark.system)
