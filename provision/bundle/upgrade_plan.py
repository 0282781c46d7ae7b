"""The upgrade's pure parts: its steps, the state a run records before each, where a rerun picks up,
the batches of units, and the regression gate. No I/O here: `upgrade.py` reads and writes through the
seams and asks these what to do.

A host's upgrade: stage the new bundle beside `current` (installed and qualified, not activated),
record the baseline if the host has none, then per batch of units (one unit at a time unless
`--all-at-once`): drain, switch `current` (the first batch), restart, readiness, smoke, measure. A
failed gate or a regression rolls `current` back to the bundle it came from and restarts the units
already on the new one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from rocmdoctor.model import SCHEMA_VERSION

STATE_FILE = ".upgrade.json"  # under the prefix, beside `current`
STATE_LIMIT = 256 * 1024
# In run order; the state names the step a run was about to take when it stopped.
STEPS = ("stage", "baseline", "drain", "switch", "restart", "ready", "smoke", "measure")
ROLLBACK = "rollback"
DONE = "done"
MOVED = "moved"
ROLLED_BACK = "rolled-back"
DEFAULT_MAX_REGRESSION_PCT = 10.0
# The workload measured when a host has no recorded baseline (`bench --json` of the old bundle
# otherwise): small enough to take seconds on a busy server, with a concurrent level for the p95.
DEFAULT_WORKLOAD = {"concurrency": [1, 4], "requests": 16, "prompt_tokens": 64, "max_tokens": 32}


class UpgradeState(msgspec.Struct, forbid_unknown_fields=False):
    """What a run recorded before its latest step (written atomically through the HostWriter)."""

    target: str
    origin: str | None
    step: str
    units_done: list[str] = []
    batch: list[str] = []
    outcome: str | None = None
    reason: str | None = None
    schema_version: int = SCHEMA_VERSION


@dataclass(frozen=True)
class Unit:
    """One systemd unit of the host's server and the address it answers on."""

    name: str
    url: str


def batches(units: Sequence[Unit], all_at_once: bool) -> list[list[Unit]]:
    """One unit at a time, so a host with several instances keeps serving with the rest."""
    return [list(units)] if all_at_once else [[unit] for unit in units]


def resume_point(state: UpgradeState | None, current: str | None, target: str) -> str:
    """Where a run starts: "current" (nothing to do), "start", "resume" (an interrupted run after the
    bundle was staged: switch if needed, then the units not yet done) or "rollback" (a rollback was
    interrupted: finish it). Never anything that leaves `current` and the units on different bundles."""
    if state is None or state.target != target:
        return "current" if current == target else "start"
    if state.step == DONE:
        # A finished upgrade that moved changes nothing; one that rolled back is tried again.
        return "current" if current == target and state.outcome == MOVED else "start"
    if state.step == ROLLBACK:
        return "rollback"
    if state.step in ("stage", "baseline"):
        return "start"
    return "resume"


@dataclass(frozen=True)
class Figures:
    """What the gate compares: output tokens/s and p95 end-to-end latency at one concurrency."""

    concurrency: int
    tokens_per_s: float
    p95_ms: float | None

    def to_json(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "tokens_per_s": self.tokens_per_s, "p95_ms": self.p95_ms}


class BaselineError(ValueError):
    """A baseline document that is not a bench report with a measured level."""


def workload(report: dict[str, Any]) -> dict[str, Any]:
    """The workload a bench report measured (`settings`), to run again on the new bundle."""
    settings = report.get("settings")
    if not isinstance(settings, dict):
        raise BaselineError("it has no 'settings': record it with `rocmdoctor bench --json > FILE`")
    wanted = {}
    for key in ("concurrency", "requests", "prompt_tokens", "max_tokens"):
        value = settings.get(key)
        ok = isinstance(value, list) and value and all(isinstance(v, int) and v > 0 for v in value)
        if not (ok if key == "concurrency" else isinstance(value, int) and value > 0):
            raise BaselineError(f"its settings.{key} is missing or not a positive number")
        wanted[key] = value
    return wanted


def figures(report: dict[str, Any]) -> Figures:
    """The figures of a bench report's highest concurrency level."""
    levels = report.get("levels")
    if not isinstance(levels, list) or not levels or not all(isinstance(lv, dict) for lv in levels):
        raise BaselineError("it has no measured levels")
    top = max(levels, key=lambda lv: lv.get("concurrency") or 0)
    rate, e2el = top.get("output_tokens_per_s"), top.get("e2el_ms")
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or rate <= 0:
        raise BaselineError(f"its level at concurrency {top.get('concurrency')} measured no throughput")
    p95 = e2el.get("p95") if isinstance(e2el, dict) else None
    return Figures(
        int(top.get("concurrency") or 0),
        float(rate),
        float(p95) if isinstance(p95, (int, float)) and not isinstance(p95, bool) else None,
    )


def change_pct(before: float, after: float) -> float:
    return round((after - before) / before * 100, 1) if before else 0.0


def regression(baseline: Figures, measured: Figures, max_pct: float) -> str | None:
    """Why the measured figures are a regression (throughput down or p95 latency up by more than
    `max_pct` percent), or None."""
    reasons = []
    throughput = change_pct(baseline.tokens_per_s, measured.tokens_per_s)
    if -throughput > max_pct:
        reasons.append(
            f"throughput {measured.tokens_per_s:g} tok/s against {baseline.tokens_per_s:g} "
            f"({throughput:+g} %)"
        )
    if baseline.p95_ms is not None and measured.p95_ms is not None:
        latency = change_pct(baseline.p95_ms, measured.p95_ms)
        if latency > max_pct:
            reasons.append(f"p95 latency {measured.p95_ms:g} ms against {baseline.p95_ms:g} ({latency:+g} %)")
    if not reasons:
        return None
    return f"at concurrency {measured.concurrency}: " + "; ".join(reasons) + f" (allowed: {max_pct:g} %)"


def comparison(baseline: Figures, measured: Figures) -> dict[str, Any]:
    """The figures of one unit for the report: before, after and the change of each."""
    latency = (
        change_pct(baseline.p95_ms, measured.p95_ms)
        if baseline.p95_ms is not None and measured.p95_ms is not None
        else None
    )
    return {
        "baseline": baseline.to_json(),
        "measured": measured.to_json(),
        "throughput_change_pct": change_pct(baseline.tokens_per_s, measured.tokens_per_s),
        "p95_change_pct": latency,
    }
