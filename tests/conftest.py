"""Shared test configuration.

In CI (CI=true) a skipped test is a failure: the tests that need a real component (the vLLM
engine, sshd, systemd-nspawn) must run there, so a skip would hide that they did not.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
HOSTS = FIXTURES / "hosts"

# Shared fixtures for real components (tests/ is on the path through pyproject's `pythonpath`, so
# `harness` and `plugins` import from every test module). tests/unit/test_conftest_plugins.py checks
# that every module in tests/plugins/ is named here (or loaded by `-p` in pyproject's addopts).
pytest_plugins = [
    "plugins.engine",
    "plugins.fleet",
    "plugins.install",
    "plugins.schedule",
    "plugins.serve",
    "plugins.smoke",
]


# Fixtures that start or need the real vLLM CPU engine: a test using one is an `engine` test, so
# `-m "not engine"` runs everything else, whatever the test module's own marks say.
ENGINE_FIXTURES = frozenset(
    {"vllm_engine", "vllm_engine_key_file", "tiny_model", "crashing_model", "installed_prefix"}
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if in_ci() and skipped:
        for report in skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            reporter.write_line(f"CI forbids skips: {report.nodeid}: {reason}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
