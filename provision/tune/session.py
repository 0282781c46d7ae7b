"""One tune run, apart from its command line: what it searches (the plan), what the state file keys its
known points by (the context), the search itself, and the report every output renders."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rocmdoctor.facts.installed_bundle import InstalledBundle
from rocmdoctor.model import envelope
from rocmdoctor.provision.tune import search as ts
from rocmdoctor.provision.tune.state import context_key, stable_argv
from rocmdoctor.provision.tune.workload import Workload
from rocmdoctor.vllm.memory_plan import ConfigError, EngineSettings, Memory, ModelPlan, plan_from_files

SEQS_LIMIT = 4096


class SeqsError(ValueError):
    """A --seqs the search cannot take; the message says what it takes."""


def parse_seqs(text: str, upper: int) -> list[int]:
    """'1:64' (every value, searched), '1:auto' (up to what the KV cache holds: `upper`), '1,2,4,8'."""
    spec = text.strip()
    try:
        if ":" in spec:
            low_text, high_text = spec.split(":", 1)
            low = int(low_text)
            high = min(upper, SEQS_LIMIT) if high_text.strip() == "auto" else int(high_text)
            values = ts.seqs_candidates(low, high) if high <= SEQS_LIMIT else []
        else:
            values = sorted({int(v) for v in spec.split(",") if v.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1 or values[-1] > SEQS_LIMIT or len(values) > SEQS_LIMIT:
        raise SeqsError(
            f"--seqs {text!r}: give LOW:HIGH (e.g. 1:64, or 1:auto for up to what the KV cache holds: "
            f"{upper}) or a list (1,2,4,8), values from 1 to {SEQS_LIMIT}"
        )
    return values


def searchable_seqs(text: str, kv_cache_tokens: int | None, workload: Workload) -> list[int]:
    """The --max-num-seqs values to search: a list may not ask for more requests than the KV cache holds
    (a range is clipped by the search itself)."""
    upper = kv_requests(kv_cache_tokens, workload)
    values = parse_seqs(text, upper)
    over = [v for v in values if v > upper]
    if over and ":" not in text:
        raise SeqsError(
            f"--seqs {','.join(map(str, over))}: the KV cache holds {upper} requests of "
            f"{workload.typical_len()} tokens ({kv_cache_tokens} tokens, rocmdoctor plan); search at most that"
        )
    return values


class Unfit(ValueError):
    """The model's memory plan does not let tune measure; the message says what to do."""


def fitting_plan(
    files: Any,
    memory: Memory,
    settings: EngineSettings,
    max_model_len: int | None,
    typical_len: int,
    model: str,
) -> ModelPlan:
    """The model's memory plan for the search, only when it says the model fits: tune measures a
    server start per setting, and a model that cannot load would fail every one of them."""
    try:
        plan = plan_from_files(
            files,
            memory,
            settings=settings,
            max_model_len=max_model_len,
            typical_len=typical_len,
            model=model,
        )
    except ConfigError as exc:
        raise Unfit(f"{files.location}: {exc}") from None
    if plan.fits is None:
        raise Unfit(
            f"the plan cannot tell whether {model} fits here: {plan.memory_null_reason}; tune measures "
            "only a model the plan says fits (give the model's safetensors files, or --kv-cache-memory)"
        )
    if not plan.fits:
        remedies = "; ".join(f"{r.action} ({r.flag}: {r.figure})" for r in plan.remedies) or "a larger GPU"
        raise Unfit(
            f"{model} does not fit: {'; '.join(plan.reasons)}. Try: {remedies} "
            "(rocmdoctor plan --model ... shows the whole plan); tune measures only a model that fits"
        )
    return plan


def bundle_identity(bundle: InstalledBundle) -> str:
    """The current bundle's tag and digest (over every part: `facts.installed_bundle`'s one meaning): a
    new bundle is a new server."""
    if bundle.tag is None:
        return "none"
    return f"{bundle.tag}@{bundle.digest}" if bundle.digest else bundle.tag


def model_revision(model: str, config: bytes | None) -> str:
    """A local model directory: its config's digest (a new checkpoint is a new model); else the id."""
    return f"sha256:{hashlib.sha256(config).hexdigest()[:16]}" if config is not None else model


@dataclass(frozen=True)
class Trial:
    """What every trial server shares, and what is searched."""

    base_argv: list[str]  # the server's arguments without the tuned flags
    environment: dict[str, str]
    gpu_memory_utilization: str | None
    max_model_len: int | None
    kv_cache_tokens: int | None
    workload: Workload
    seqs: list[int]
    batched: list[int | None]
    slo: ts.Slo | None
    search: str  # "adaptive" (the curve-guided search) or "exhaustive"
    requests: int
    min_seconds: float
    # Under a latency limit the winner must meet it with `margin` (a share of the limit) to spare, and
    # then meet it (the limit itself) in each of `confirm` more measurements: the same setting varies
    # by about 10 % from run to run on a shared host, so one measurement cannot be trusted near it.
    confirm: int = 2
    margin: float = 0.1


# Settings confirmed at most, best first, before tune says that none held its limit.
MAX_CANDIDATES = 3


def kv_requests(kv_cache_tokens: int | None, workload: Workload) -> int:
    """How many of the workload's typical requests the KV cache holds at once (at least one)."""
    return max(1, (kv_cache_tokens or 0) // max(1, workload.typical_len()))


def plan_document(trial: Trial, host: str, bundle: str, model: str, revision: str) -> dict[str, Any]:
    """The plan `--plan-only` prints and the report carries, with the context known points are keyed by."""
    context = {
        "host": host,
        "bundle": bundle,
        "model": model,
        "model_revision": revision,
        "server_argv": stable_argv(trial.base_argv),
        "environment": dict(sorted(trial.environment.items())),
        "workload": trial.workload.digest(),
        "requests": trial.requests,
        "min_seconds": trial.min_seconds,
    }
    return {
        "server_argv": trial.base_argv,
        "gpu_memory_utilization": trial.gpu_memory_utilization,
        "max_model_len": trial.max_model_len,
        "kv_cache_tokens": trial.kv_cache_tokens,
        "kv_requests": kv_requests(trial.kv_cache_tokens, trial.workload),
        "seqs": trial.seqs,
        "batched_tokens": trial.batched,
        "slo": trial.slo.to_json() if trial.slo else None,
        "workload": trial.workload.to_json(),
        "context": context,  # what the state file keys its known points by
        "context_key": context_key(context),
        "search": trial.search,
        "confirm": trial.confirm,
        "margin": trial.margin,
    }


def run(
    trial: Trial,
    known: dict[ts.Setting, ts.Measurement],
    measure: Callable[[ts.Setting], ts.Measurement],
) -> tuple[list[ts.Measurement], ts.Choice]:
    """Every point the search asked for (known ones from the state file, without a server) and the choice."""

    def answer(setting: ts.Setting) -> ts.Measurement:
        return known[setting] if setting in known else measure(setting)

    if trial.search == "exhaustive":
        points = [answer(setting) for setting in ts.exhaustive(trial.seqs, trial.batched)]
    else:
        points = ts.run_search(ts.Search(trial.seqs, trial.batched, trial.slo), answer)
    return points, confirm(trial, points, measure)


def confirm(
    trial: Trial, points: list[ts.Measurement], measure: Callable[[ts.Setting], ts.Measurement]
) -> ts.Choice:
    """The choice, under a limit confirmed: the best setting that met it with the margin is measured
    `trial.confirm` more times and must meet the limit every time; one that does not is rejected and
    the next best is tried (MAX_CANDIDATES at most). Never a setting whose confirmation broke the limit."""
    slo = trial.slo
    if slo is None:
        return ts.choose(points, None)
    first = ts.choose(points, slo, trial.margin)
    if trial.confirm == 0 or first.winner is None:
        return first
    record: dict[str, Any] = {"times": trial.confirm, "margin": trial.margin, "runs": [], "rejected": []}
    for candidate in ts.candidates(points, slo, trial.margin)[:MAX_CANDIDATES]:
        runs: list[ts.Measurement] = []
        for _ in range(trial.confirm):
            runs.append(measure(candidate.setting))
            if not ts.feasible(runs[-1], slo):
                break  # broken once is enough: the next candidate
        broken = [r for r in runs if not ts.feasible(r, slo)]
        if not broken:
            worst = max(v for v in (slo.value_ms(r) for r in [candidate, *runs]) if v is not None)
            record["runs"] = [r.to_json() for r in runs]
            return ts.Choice(
                candidate,
                first.best_seen,
                f"the most output tokens/s that meets {ts.limit_words(slo, trial.margin)}, confirmed by "
                f"{len(runs)} more measurement(s) (worst {slo.metric} p{slo.percentile} {worst:.1f} ms)",
                record,
            )
        value = slo.value_ms(broken[0])
        why = broken[0].error or (
            f"{slo.metric} p{slo.percentile} {value:.1f} ms > {slo.limit_ms:g} ms" if value else "no latency"
        )
        record["rejected"].append({**candidate.setting.to_json(), "runs": len(runs), "why": why})
    return ts.Choice(
        None,
        first.best_seen,
        f"no setting held {slo.describe()} when measured again ({len(record['rejected'])} tried, "
        f"{trial.confirm} more measurement(s) each)",
        record,
    )


def report(
    plan: dict[str, Any],
    points: list[ts.Measurement],
    choice: ts.Choice,
    slo: ts.Slo | None,
    seconds: float,
    starts: int,
) -> dict[str, Any]:
    return envelope(
        command="tune",
        plan=plan,
        points=[p.to_json() for p in points],
        winner=choice.winner.to_json() if choice.winner else None,
        best_seen=choice.best_seen.to_json() if choice.best_seen else None,
        reason=choice.reason,
        confirmation=choice.confirmation,
        slo=slo.to_json() if slo else None,
        server_starts=starts,
        known_points_used=sum(1 for p in points if p.source == "state"),
        seconds=round(seconds, 1),
        exit_code=0 if choice.winner else 1,
    )
