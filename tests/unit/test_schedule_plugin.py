"""tests/plugins/schedule.py: the workers get the longest modules first, each module's tests in order."""

from __future__ import annotations

from dataclasses import dataclass

from plugins.schedule import COSTS, TESTS, heaviest_first, load_costs


@dataclass
class Item:
    nodeid: str


def test_longest_module_first_each_module_in_its_own_order():
    items = [
        Item("tests/unit/test_a.py::one"),
        Item("tests/system/test_slow.py::first"),
        Item("tests/unit/test_a.py::two"),
        Item("tests/system/test_slow.py::second"),
        Item("tests/cli/test_known.py::x"),
        Item("tests/system/test_new.py::y"),
    ]
    costs = {"tests/system/test_slow.py": 500.0, "tests/cli/test_known.py": 90.0}
    order = [item.nodeid for item in heaviest_first(items, costs)]  # type: ignore[arg-type]
    assert order == [
        "tests/system/test_slow.py::first",
        "tests/system/test_slow.py::second",
        "tests/cli/test_known.py::x",
        "tests/system/test_new.py::y",  # unknown system module: a minute
        "tests/unit/test_a.py::one",
        "tests/unit/test_a.py::two",
    ]


def test_every_costed_module_exists():
    """A renamed or removed module left in the file would silently lose its place."""
    missing = [name for name in load_costs(COSTS) if not (TESTS.parent / name).is_file()]
    assert missing == []
