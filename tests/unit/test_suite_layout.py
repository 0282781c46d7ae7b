"""The split by kind stays: every test module lives in tests/unit, tests/cli or tests/system, and the
`system` marker (tests/plugins/kinds.py) makes `-m "not system"` the fast suite."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO
from plugins.kinds import KIND_DIRS, TESTS

# Test modules by pytest's default name patterns (python_files is not configured).
TEST_MODULE_PATTERNS = ("test_*.py", "*_test.py")


def test_every_test_module_is_in_a_kind_folder():
    modules = {p for pattern in TEST_MODULE_PATTERNS for p in TESTS.rglob(pattern)}
    misplaced = sorted(
        str(p.relative_to(REPO)) for p in modules if not any(p.is_relative_to(d) for d in KIND_DIRS.values())
    )
    assert not misplaced, (
        f"test modules outside tests/unit, tests/cli and tests/system: {misplaced}; move each one into the "
        "folder of its kind (tests/plugins/kinds.py says which kind goes where)"
    )
    for kind, folder in KIND_DIRS.items():
        assert any(folder.glob("test_*.py")), f"tests/{kind}/ holds no test module"


def test_tests_conftest_is_the_only_conftest():
    # Test modules import `conftest` by name (tests/ is on pythonpath); a second conftest.py would be
    # imported under the same name and replace it in sys.modules.
    assert sorted(TESTS.rglob("conftest.py")) == [TESTS / "conftest.py"]
    # and no package marker: a kind folder is a plain directory, its modules import as top-level names
    assert not [d for d in KIND_DIRS.values() if (d / "__init__.py").exists()]


# Collects the given paths in a fresh pytest (the repository's configuration), then prints each test's
# node id, its final markers and whether `-m` kept it.
COLLECT = """
import json, sys
import pytest

class Record:
    def __init__(self):
        self.kept, self.dropped = [], []
    def pytest_deselected(self, items):
        self.dropped += items
    def pytest_collection_finish(self, session):
        self.kept = list(session.items)

record = Record()
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[record])
marks = lambda item: sorted({m.name for m in item.iter_markers()})
print("RESULT " + json.dumps({"code": int(code),
    "kept": {i.nodeid: marks(i) for i in record.kept},
    "dropped": {i.nodeid: marks(i) for i in record.dropped}}))
"""


def collect(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", COLLECT, *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(lines[0].removeprefix("RESULT "))
    assert result["code"] == 0, proc.stdout[-3000:]
    return result


def test_not_system_leaves_out_the_system_folder_and_every_real_component_test():
    # One module of each kind; tests/cli/test_smoke.py holds both engine and stand-in-server tests.
    result = collect(
        "-m", "not system", "tests/unit/test_core.py", "tests/cli/test_smoke.py", "tests/system/test_lint.py"
    )
    kept, dropped = result["kept"], result["dropped"]
    assert any(n.startswith("tests/unit/test_core.py::") for n in kept)
    assert any(n.startswith("tests/cli/test_smoke.py::") for n in kept), (
        "the smoke tests without the engine stay"
    )
    assert not [n for n in kept if n.startswith("tests/system/")]
    assert not [n for n, marks in kept.items() if {"system", "engine", "ssh", "nspawn"} & set(marks)]
    assert any(n.startswith("tests/system/test_lint.py::") for n in dropped)
    assert any(
        n.startswith("tests/cli/test_smoke.py::") and "engine" in marks for n, marks in dropped.items()
    )
    assert all("system" in marks for marks in dropped.values())
