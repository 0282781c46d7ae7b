"""`rocmdoctor tune`'s search and objective, pure: no server, no clock, testable on recorded curves.

The search asks for one setting at a time (`Search.propose`) and is told what it measured
(`Search.record`), so the runner, the state file (known points are answered without a server) and the
unit tests drive the same code.

- Phase 1, `--max-num-seqs`: from the smallest candidate, double (the next candidate at least twice the
  last) while the latency limit holds, until FLAT_STEPS doublings in a row added less than RISE_SHARE. vLLM's batch throughput
  is concave in the batch size until a resource saturates, so doubling brackets the knee in log2(range)
  starts.
- Phase 2, refine: bisect between the best point and its measured neighbours (the one that broke the
  limit, or the one where throughput stopped rising) until no untried candidate lies between them or
  the interval is narrower than REFINE_SHARE of the best value.
- Phase 3, `--max-num-batched-tokens` (only when several candidates are given): hill-climb from the
  first candidate at the chosen max-num-seqs, moving while throughput rises by RISE_SHARE.

The objective: the most output tokens/s among the points that meet the limit (`--slo`); without a limit,
the knee: the smallest max-num-seqs within KNEE_SHARE of the best throughput measured.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

METRICS = {"ttft": "time to first token", "itl": "inter-token latency", "tpot": "time per output token",
           "e2el": "end-to-end latency"}  # fmt: skip
PERCENTILES = (50, 95, 99)
# Throughput that rises by less than this share is "stopped rising" (run-to-run noise on a shared
# host is a few per cent).
RISE_SHARE = 0.03
FLAT_STEPS = 2
# Refinement stops once the bracket is narrower than this share of the best value.
REFINE_SHARE = 0.125
KNEE_SHARE = 0.95
_SLO = re.compile(r"^\s*(ttft|itl|tpot|e2el)\s*:\s*p(50|95|99)\s*<=?\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s)\s*$")


class SloError(ValueError):
    """A --slo that cannot be parsed; the message shows the form."""


@dataclass(frozen=True)
class Slo:
    metric: str  # one of METRICS
    percentile: int  # one of PERCENTILES
    limit_ms: float

    @property
    def key(self) -> str:
        return f"p{self.percentile}"

    def describe(self) -> str:
        return f"{self.metric} p{self.percentile} <= {self.limit_ms:g} ms"

    def value_ms(self, point: Measurement) -> float | None:
        return (point.latency_ms.get(self.metric) or {}).get(self.key)

    def met(self, point: Measurement, margin: float = 0.0) -> bool:
        """The point meets the limit, with `margin` (a share of the limit) to spare."""
        value = self.value_ms(point)
        return point.failures == 0 and value is not None and value <= self.limit_ms * (1.0 - margin)

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "percentile": self.percentile, "limit_ms": self.limit_ms}


def parse_slo(text: str) -> Slo:
    """'ttft:p95<=2s', 'itl:p99<=50ms', 'e2el:p50<=1.5s'."""
    match = _SLO.match(text.lower())
    if not match:
        raise SloError(
            f"--slo {text!r}: write METRIC:pPCT<=LIMIT with METRIC one of {', '.join(METRICS)}, PCT one of "
            f"{', '.join(map(str, PERCENTILES))} and LIMIT in ms or s, e.g. ttft:p95<=2s or itl:p99<=50ms"
        )
    metric, pct, number, unit = match.groups()
    limit_ms = float(number) * (1000 if unit == "s" else 1)
    if limit_ms <= 0:
        raise SloError(f"--slo {text!r}: the limit must be positive (METRIC:pPCT<=LIMIT, e.g. ttft:p95<=2s)")
    return Slo(metric, int(pct), limit_ms)


@dataclass(frozen=True, order=True)
class Setting:
    max_num_seqs: int
    max_num_batched_tokens: int | None = None  # None: vLLM's default

    def flags(self) -> list[str]:
        out = ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens is not None:
            out += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        return out

    def label(self) -> str:
        tokens = "default" if self.max_num_batched_tokens is None else str(self.max_num_batched_tokens)
        return f"max-num-seqs {self.max_num_seqs}, max-num-batched-tokens {tokens}"

    def to_json(self) -> dict[str, Any]:
        return {"max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens}


@dataclass
class Measurement:
    setting: Setting
    output_tokens_per_s: float
    requests: int = 0
    failures: int = 0
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # metric -> {"p50": ms, ...}
    seconds: float = 0.0  # the measuring itself
    start_seconds: float | None = None  # the server start it needed (None: shared or known)
    source: str = "measured"  # or "state" (a known point from an earlier run)
    error: str = ""  # the server could not be started or measured with this setting

    def to_json(self) -> dict[str, Any]:
        return {
            **self.setting.to_json(),
            "output_tokens_per_s": round(self.output_tokens_per_s, 3),
            "requests": self.requests,
            "failures": self.failures,
            "latency_ms": self.latency_ms,
            "seconds": round(self.seconds, 2),
            "start_seconds": None if self.start_seconds is None else round(self.start_seconds, 1),
            "source": self.source,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Measurement:
        return cls(
            Setting(int(doc["max_num_seqs"]), doc.get("max_num_batched_tokens")),
            float(doc["output_tokens_per_s"]),
            int(doc.get("requests", 0)),
            int(doc.get("failures", 0)),
            {m: {k: float(v) for k, v in d.items()} for m, d in (doc.get("latency_ms") or {}).items()},
            float(doc.get("seconds", 0.0)),
            None,
            "state",
            str(doc.get("error", "")),
        )


def usable(point: Measurement) -> bool:
    return not point.error and point.failures == 0 and point.output_tokens_per_s > 0


def feasible(point: Measurement, slo: Slo | None, margin: float = 0.0) -> bool:
    return usable(point) and (slo is None or slo.met(point, margin))


@dataclass
class Choice:
    winner: Measurement | None  # None: nothing measured met the limit
    best_seen: Measurement | None  # the best throughput measured, limit or not
    reason: str
    confirmation: dict[str, Any] | None = None  # the winner measured again (session.confirm)


def limit_words(slo: Slo, margin: float) -> str:
    return slo.describe() + (f" with {margin:.0%} to spare" if margin else "")


def candidates(points: Sequence[Measurement], slo: Slo, margin: float) -> list[Measurement]:
    """The settings that meet the limit with the margin, the most output tokens/s first."""
    ok = [p for p in points if feasible(p, slo, margin)]
    return sorted(ok, key=lambda p: (-p.output_tokens_per_s, p.setting.max_num_seqs))


def choose(points: Sequence[Measurement], slo: Slo | None, margin: float = 0.0) -> Choice:
    ok = [p for p in points if feasible(p, slo, margin)]
    measured = [p for p in points if usable(p)]
    best_seen = max(measured, key=lambda p: p.output_tokens_per_s, default=None)
    if not ok:
        why = (
            f"no setting met {limit_words(slo, margin)}"
            if slo and measured
            else "no setting could be measured"
        )
        return Choice(None, best_seen, why)
    best = max(ok, key=lambda p: (p.output_tokens_per_s, -p.setting.max_num_seqs))
    if slo is not None:
        return Choice(best, best_seen, f"the most output tokens/s that meets {limit_words(slo, margin)}")
    threshold = KNEE_SHARE * best.output_tokens_per_s
    knee = min(
        (p for p in ok if p.output_tokens_per_s >= threshold),
        key=lambda p: (p.setting.max_num_seqs, -p.output_tokens_per_s),
    )
    return Choice(
        knee,
        best_seen,
        f"the knee: the smallest max-num-seqs within {round(KNEE_SHARE * 100)}% of the best throughput "
        f"({best.output_tokens_per_s:.1f} tokens/s at {best.setting.label()})",
    )


class Search:
    """Ask-tell search over `seqs` (sorted candidates of --max-num-seqs) and `batched` (candidates of
    --max-num-batched-tokens, the first one used while searching max-num-seqs)."""

    def __init__(self, seqs: Sequence[int], batched: Sequence[int | None], slo: Slo | None) -> None:
        if not seqs or not batched:
            raise ValueError("no candidates to search")
        self.seqs = sorted(set(seqs))
        self.batched = list(dict.fromkeys(batched))
        self.slo = slo
        self.points: dict[Setting, Measurement] = {}
        self._plan = self._steps()
        self._pending: Setting | None = None

    # The search as a generator: it yields the next setting and is sent what it measured.
    def _steps(self):
        base = self.batched[0]
        seen = self.points

        def at(seqs: int, batched: int | None = base) -> Setting:
            return Setting(seqs, batched)

        def tput(setting: Setting) -> float:
            point = seen.get(setting)
            return point.output_tokens_per_s if point and feasible(point, self.slo) else -1.0

        # Phase 1: doubling, until the limit breaks or FLAT_STEPS doublings in a row add less than
        # RISE_SHARE (one flat step on a shared host is as often noise as a knee).
        value = self.seqs[0]
        best = value
        flat = 0
        while True:
            if at(value) not in seen:
                yield at(value)
            point = seen[at(value)]
            if not feasible(point, self.slo):
                break
            rising = tput(at(value)) >= tput(at(best)) * (1 + RISE_SHARE) or value == best
            if tput(at(value)) > tput(at(best)):
                best = value
            flat = 0 if rising else flat + 1
            if flat >= FLAT_STEPS:
                break
            bigger = [c for c in self.seqs if c >= 2 * value]
            if not bigger:
                if value != self.seqs[-1]:
                    value = self.seqs[-1]
                    continue
                break
            value = bigger[0]
        # Phase 2: refine. Under a limit: bisect between the best point and the next larger one tried
        # (where the limit broke or the curve flattened). For the knee: bisect between the smallest
        # point within KNEE_SHARE of the best and the next smaller one tried.
        while tput(at(best)) >= 0:
            tried = sorted(s.max_num_seqs for s in seen if s.max_num_batched_tokens == base)
            if self.slo is None:
                top = max(tput(at(v)) for v in tried)
                anchor = min(v for v in tried if tput(at(v)) >= KNEE_SHARE * top)
                edge = next((v for v in reversed(tried) if v < anchor), None)
            else:
                anchor = best
                edge = next((v for v in tried if v > best), None)
            if edge is None or abs(edge - anchor) <= REFINE_SHARE * anchor:
                break
            inside = [c for c in self.seqs if min(edge, anchor) < c < max(edge, anchor)]
            if not inside:
                break
            middle = (edge + anchor) / 2
            probe = min(inside, key=lambda c: (abs(c - middle), c))
            yield at(probe)
            if tput(at(probe)) > tput(at(best)):
                best = probe
        if self.slo is None and tput(at(best)) >= 0:
            top = max(tput(at(s.max_num_seqs)) for s in seen if s.max_num_batched_tokens == base)
            best = min(
                s.max_num_seqs
                for s in seen
                if s.max_num_batched_tokens == base and tput(at(s.max_num_seqs)) >= KNEE_SHARE * top
            )
        # Phase 3: hill-climb --max-num-batched-tokens at the chosen max-num-seqs.
        if len(self.batched) < 2 or tput(at(best)) < 0:
            return
        index = 0
        while index + 1 < len(self.batched):
            candidate = at(best, self.batched[index + 1])
            if candidate not in seen:
                yield candidate
            if tput(candidate) < tput(at(best, self.batched[index])) * (1 + RISE_SHARE):
                break
            index += 1

    def propose(self) -> Setting | None:
        """The next setting to measure; None when the search is done."""
        if self._pending is not None:
            return self._pending
        try:
            self._pending = next(self._plan)
        except StopIteration:
            return None
        return self._pending

    def record(self, point: Measurement) -> None:
        self.points[point.setting] = point
        if point.setting == self._pending:
            self._pending = None


def run_search(search: Search, measure: Callable[[Setting], Measurement]) -> list[Measurement]:
    """Drive `search` with `measure` to the end; the points in the order measured."""
    order = []
    while (setting := search.propose()) is not None:
        point = measure(setting)
        search.record(point)
        order.append(point)
    return order


def exhaustive(seqs: Sequence[int], batched: Sequence[int | None]) -> list[Setting]:
    """Every point of the grid (the sweep tune is compared with)."""
    return [Setting(s, b) for b in dict.fromkeys(batched) for s in sorted(set(seqs))]


def seqs_candidates(low: int, high: int) -> list[int]:
    """Every integer of [low, high]: the search picks among them, a grid would measure them all."""
    return list(range(low, high + 1))
