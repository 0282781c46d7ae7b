"""The upgrade's pure decisions: the regression gate, where a rerun picks up, the batches."""

from __future__ import annotations

import pytest

from rocmdoctor.provision.bundle import upgrade_plan as up

BASE = up.Figures(4, 600.0, 200.0)


@pytest.mark.parametrize(
    ("measured", "verdict"),
    [
        (up.Figures(4, 600.0, 200.0), None),
        (up.Figures(4, 541.0, 219.0), None),  # -9.8 % and +9.5 %: inside 10 %
        (up.Figures(4, 539.0, 200.0), "throughput 539 tok/s against 600 (-10.2 %)"),
        (up.Figures(4, 600.0, 221.0), "p95 latency 221 ms against 200 (+10.5 %)"),
        (up.Figures(4, 900.0, 100.0), None),  # faster is never a regression
        (up.Figures(4, 600.0, None), None),  # no latency measured: throughput alone
    ],
)
def test_the_regression_gate(measured: up.Figures, verdict: str | None):
    why = up.regression(BASE, measured, 10.0)
    assert (why is None) == (verdict is None), why
    if verdict:
        assert verdict in why and why.startswith("at concurrency 4: ") and why.endswith("(allowed: 10 %)")


def test_the_threshold_is_the_users():
    slower = up.Figures(4, 450.0, 200.0)  # -25 %
    assert up.regression(BASE, slower, 10.0) is not None
    assert up.regression(BASE, slower, 30.0) is None


def state(step: str, outcome: str | None = None, target: str = "new") -> up.UpgradeState:
    return up.UpgradeState(target, "old", step, outcome=outcome)


@pytest.mark.parametrize(
    ("recorded", "current", "point"),
    [
        (None, "old", "start"),
        (None, "new", "current"),
        (state("stage"), "old", "start"),  # nothing switched yet: start over
        (state("baseline"), "old", "start"),
        (state("drain"), "old", "resume"),
        (state("restart"), "new", "resume"),  # switched, units half restarted: go on
        (state("measure"), "new", "resume"),
        (state("rollback"), "new", "rollback"),  # a rollback killed midway is finished first
        (state("done", up.MOVED), "new", "current"),  # a rerun after a finished upgrade: nothing
        (state("done", up.ROLLED_BACK), "old", "start"),  # after a rollback: tried again
        (state("measure", target="other"), "old", "start"),
    ],
)
def test_where_a_run_picks_up(recorded: up.UpgradeState | None, current: str, point: str):
    assert up.resume_point(recorded, current, "new") == point


def test_batches_are_one_unit_at_a_time_unless_all_at_once():
    units = [up.Unit(f"vllm@{n}", f"http://127.0.0.1:800{n}") for n in range(3)]
    assert up.batches(units, all_at_once=False) == [[u] for u in units]
    assert up.batches(units, all_at_once=True) == [units]


@pytest.mark.parametrize(
    ("report", "message"),
    [
        ({}, "no 'settings'"),
        ({"settings": {"concurrency": [1], "requests": 0, "prompt_tokens": 1, "max_tokens": 1}}, "requests"),
        (
            {"settings": {"concurrency": [], "requests": 1, "prompt_tokens": 1, "max_tokens": 1}},
            "concurrency",
        ),
    ],
)
def test_a_baseline_that_is_no_bench_report_is_refused(report: dict, message: str):
    with pytest.raises(up.BaselineError, match=message):
        up.workload(report)


def test_figures_are_the_highest_levels():
    report = {
        "levels": [
            {"concurrency": 1, "output_tokens_per_s": 100.0, "e2el_ms": {"p95": 50.0}},
            {"concurrency": 8, "output_tokens_per_s": 500.0, "e2el_ms": {"p95": 90.0}},
        ]
    }
    assert up.figures(report) == up.Figures(8, 500.0, 90.0)
    with pytest.raises(up.BaselineError, match="no throughput"):
        up.figures({"levels": [{"concurrency": 1, "output_tokens_per_s": 0}]})
