"""tune under a latency limit keeps a margin and confirms its winner (issue 35: one run in four picked a
setting that broke the limit when measured again; the same setting varies by about 10 % run to run).

The points are the ones a real tune run measured on the vLLM CPU engine (tests/cli/test_tune.py's
RECORDED); a confirmation answers with that setting measured again, its latency moved by the drift the
issue saw (a TPOT p50 of 7 ms measured 8.9 ms again: +27 %), so the decision is tested on both sides of
the limit without an engine. The engine path itself runs in tests/system/test_tune_engine.py."""

from __future__ import annotations

import dataclasses

import pytest

from rocmdoctor.provision.tune import search as ts
from rocmdoctor.provision.tune import session
from rocmdoctor.provision.tune.workload import synthetic

RECORDED = {  # max-num-seqs -> (output tokens/s, ttft p50, p95, p99 ms), tests/cli/test_tune.py
    1: (451.8, 139.0, 149.9, 155.2),
    2: (842.3, 150.3, 161.2, 170.1),
}
DRIFT = 1.27


def point(seqs: int, scale: float = 1.0) -> ts.Measurement:
    tput, p50, p95, p99 = RECORDED[seqs]
    ttft = {"p50": p50 * scale, "p95": p95 * scale, "p99": p99 * scale}
    return ts.Measurement(ts.Setting(seqs), tput, requests=16, latency_ms={"ttft": ttft})


def trial(slo: str, confirm: int = 2, margin: float = 0.1) -> session.Trial:
    return session.Trial(
        [], {}, None, 512, 4096, synthetic(16, 8, 0), [1, 2], [None], ts.parse_slo(slo), "adaptive", 16, 0.0,
        confirm=confirm, margin=margin,
    )  # fmt: skip


class Remeasure:
    """Each setting measured again: `drifted` settings come back with the issue's drift."""

    def __init__(self, drifted: set[int]) -> None:
        self.drifted, self.asked = drifted, []

    def __call__(self, setting: ts.Setting) -> ts.Measurement:
        self.asked.append(setting.max_num_seqs)
        return point(setting.max_num_seqs, DRIFT if setting.max_num_seqs in self.drifted else 1.0)


def test_a_winner_whose_confirmation_breaks_the_limit_is_never_picked():
    # 2 meets 190 ms with 10 % to spare (161.2 <= 171), then measures 204.7 ms: rejected; 1 holds.
    remeasure = Remeasure(drifted={2})
    choice = session.confirm(trial("ttft:p95<=190ms"), [point(1), point(2)], remeasure)
    assert choice.winner is not None and choice.winner.setting.max_num_seqs == 1
    assert remeasure.asked == [2, 1, 1]  # 2 broke at its first confirmation; 1 confirmed twice
    record = choice.confirmation
    assert record is not None and record["times"] == 2 and record["margin"] == 0.1
    assert [r["max_num_seqs"] for r in record["rejected"]] == [2] and "> 190 ms" in record["rejected"][0][
        "why"
    ]
    assert len(record["runs"]) == 2 and "confirmed by 2 more measurement(s)" in choice.reason


def test_when_every_confirmation_breaks_the_limit_there_is_no_winner():
    choice = session.confirm(trial("ttft:p95<=180ms"), [point(1), point(2)], Remeasure(drifted={1, 2}))
    assert choice.winner is None and choice.best_seen is not None
    assert choice.reason.startswith("no setting held ttft p95 <= 180 ms when measured again")


def test_the_margin_keeps_a_setting_at_the_edge_of_the_limit_out():
    # 2's p95 161.2 ms is under 165 ms but not with 10 % to spare (148.5 ms): 1 (149.9) neither; no winner
    edge = session.confirm(trial("ttft:p95<=165ms", confirm=0), [point(1), point(2)], Remeasure(set()))
    assert edge.winner is None and "with 10% to spare" in edge.reason
    bare = session.confirm(
        trial("ttft:p95<=165ms", confirm=0, margin=0), [point(1), point(2)], Remeasure(set())
    )
    assert bare.winner is not None and bare.winner.setting.max_num_seqs == 2


@pytest.mark.parametrize("confirm", [0, 3])
def test_without_a_limit_nothing_is_measured_again(confirm):
    remeasure = Remeasure(set())
    plain = dataclasses.replace(trial("ttft:p95<=1s", confirm=confirm), slo=None)
    choice = session.confirm(plain, [point(1), point(2)], remeasure)
    assert choice.winner is not None and remeasure.asked == [] and choice.confirmation is None
