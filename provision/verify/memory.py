"""A running vLLM server's memory diagnosis, from /metrics sampled over a short window.

vLLM exports (vllm/v1/metrics/loggers.py): `vllm:kv_cache_usage_perc` (0..1), `vllm:num_requests_running`,
`vllm:num_requests_waiting` (gauges), `vllm:num_preemptions_total`, `vllm:prefix_cache_queries_total`,
`vllm:prefix_cache_hits_total` (counters) and `vllm:cache_config_info` (labels: block_size,
num_gpu_blocks, ...). Every read is bounded: a body cap, a per-read timeout and one total deadline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rocmdoctor.model import envelope
from rocmdoctor.provision import bounded_http
from rocmdoctor.provision.verify import prometheus

MAX_METRICS_BYTES = 8 << 20
MAX_WINDOW_S = 120.0
USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
CACHE_INFO = "vllm:cache_config_info"
# Headroom under the KV cache when choosing a --max-num-seqs that stops preemption.
SEQS_HEADROOM = 0.9


class MetricsError(RuntimeError):
    """/metrics could not be read or is not vLLM's; the message says what to check."""


@dataclass(frozen=True)
class Snapshot:
    at: float
    usage: float
    running: float
    waiting: float
    preemptions: float
    prefix_queries: float | None
    prefix_hits: float | None


def read_metrics(url: str, timeout_s: float, session=None) -> str:
    """GET /metrics through the one bounded client: `timeout_s` is the total deadline (connect, headers
    and body), the body is capped."""
    try:
        answer = bounded_http.get(
            url,
            deadline=bounded_http.Deadline(timeout_s),
            limit=MAX_METRICS_BYTES,
            session=session,
            connect_s=timeout_s,
            read_s=timeout_s,
        )
    except bounded_http.HttpTimeout:
        raise MetricsError(f"GET {url}: the answer did not arrive within {timeout_s:g} s") from None
    except bounded_http.HttpError as exc:
        raise MetricsError(f"cannot read {url}: {exc}") from None
    if answer.status != 200:
        raise MetricsError(
            f"GET {url} answered HTTP {answer.status}; is this vLLM's address "
            "(rocmdoctor plan --url http://HOST:PORT)?"
        )
    if len(answer.body) > MAX_METRICS_BYTES:
        raise MetricsError(
            f"GET {url}: the body is larger than {MAX_METRICS_BYTES} bytes; not vLLM's /metrics"
        )
    return answer.body.decode("utf-8", errors="replace")


def _gauge(
    samples: list[prometheus.Sample], name: str, url: str, per_engine: Callable[[list[float]], float] = sum
) -> float:
    """A gauge over the server's engines: request counts add up, a ratio such as the KV cache usage
    is per engine (`per_engine=max`: the fullest cache, never the sum of data-parallel engines)."""
    values = [s.value for s in prometheus.matching(samples, name)]
    value = per_engine(values) if values else None
    if value is None or math.isnan(value):
        raise MetricsError(f"{url} has no {name}: not a vLLM (V1 engine) server, or its metrics are off")
    if not math.isfinite(value):
        # vLLM's gauges and counters are finite; an infinite one cannot be reasoned about (and would
        # overflow the arithmetic of the diagnosis)
        raise MetricsError(f"{url}: {name} is {value}, not a finite number; is this vLLM's /metrics?")
    return value


def _finite(value: float | None) -> float | None:
    """An optional counter: an infinite or NaN one counts as absent (no hit rate is derived from it)."""
    return value if value is not None and math.isfinite(value) else None


def snapshot(text: str, url: str) -> tuple[Snapshot, dict[str, str]]:
    try:
        samples = prometheus.parse(text)
    except prometheus.MetricsFormatError as exc:
        raise MetricsError(f"{url} is not Prometheus text: {exc}") from None
    info = next((s.labels for s in samples if s.name == CACHE_INFO), {})
    return Snapshot(
        at=time.monotonic(),
        usage=_gauge(samples, USAGE, url, per_engine=max),
        running=_gauge(samples, RUNNING, url),
        waiting=_gauge(samples, WAITING, url),
        preemptions=_gauge(samples, PREEMPTIONS, url),
        prefix_queries=_finite(prometheus.counter_sum(samples, PREFIX_QUERIES)),
        prefix_hits=_finite(prometheus.counter_sum(samples, PREFIX_HITS)),
    ), info


@dataclass
class Diagnosis:
    url: str
    window_s: float
    samples: int
    usage_peak: float
    usage_mean: float
    running_peak: float
    waiting_peak: float
    preemptions: float
    prefix_hit_rate: float | None
    num_gpu_blocks: int | None
    block_size: int | None
    verdict: str  # "ok" | "preempting" | "queueing" | "near-full" | "idle"
    findings: list[str] = field(default_factory=list)
    changes: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return envelope(
            url=self.url,
            window_s=round(self.window_s, 1),
            samples=self.samples,
            kv_cache_usage_peak=round(self.usage_peak, 4),
            kv_cache_usage_mean=round(self.usage_mean, 4),
            running_peak=self.running_peak,
            waiting_peak=self.waiting_peak,
            preemptions=self.preemptions,
            prefix_cache_hit_rate=None if self.prefix_hit_rate is None else round(self.prefix_hit_rate, 4),
            num_gpu_blocks=self.num_gpu_blocks,
            block_size=self.block_size,
            verdict=self.verdict,
            findings=list(self.findings),
            changes=list(self.changes),
        )


def _int_label(info: dict[str, str], key: str) -> int | None:
    try:
        number = float(info.get(key, ""))
    except ValueError:
        return None
    # inf/nan (int() of them raises) and absurd sizes are no block count or block size
    return int(number) if math.isfinite(number) and 0 < number <= 2**40 else None


def diagnose(snaps: list[Snapshot], info: dict[str, str], url: str) -> Diagnosis:
    first, last = snaps[0], snaps[-1]
    usage_peak = max(s.usage for s in snaps)
    running_peak = max(s.running for s in snaps)
    waiting_peak = max(s.waiting for s in snaps)
    preemptions = max(0.0, last.preemptions - first.preemptions)
    hit_rate = None
    if None not in (first.prefix_queries, last.prefix_queries, first.prefix_hits, last.prefix_hits):
        queries = last.prefix_queries - first.prefix_queries  # type: ignore[operator]
        if queries > 0:
            hit_rate = (last.prefix_hits - first.prefix_hits) / queries  # type: ignore[operator]
    blocks, block_size = _int_label(info, "num_gpu_blocks"), _int_label(info, "block_size")
    d = Diagnosis(
        url,
        last.at - first.at,
        len(snaps),
        usage_peak,
        sum(s.usage for s in snaps) / len(snaps),
        running_peak,
        waiting_peak,
        preemptions,
        hit_rate,
        blocks,
        block_size,
        "ok",
    )
    capacity = blocks * block_size if blocks and block_size else None
    d.findings.append(
        f"KV cache usage peaked at {usage_peak:.0%} (mean {d.usage_mean:.0%}) over {d.window_s:.0f} s; "
        f"up to {running_peak:.0f} running and {waiting_peak:.0f} waiting requests"
        + (f"; the cache holds {capacity} tokens ({blocks} blocks of {block_size})" if capacity else "")
    )
    if preemptions > 0:
        d.verdict = "preempting"
        per_seq = None
        seqs = max(1, math.floor(running_peak * SEQS_HEADROOM))
        if capacity and running_peak > 0 and usage_peak > 0:
            per_seq = usage_peak * capacity / running_peak
            seqs = max(1, math.floor(capacity * SEQS_HEADROOM / per_seq))
        # Preemption means the cache was full while `running_peak` sequences ran, even when no sample
        # caught it full (samples a second apart miss the moment): fewer must run than did.
        seqs = max(1, min(seqs, math.ceil(running_peak) - 1))
        d.findings.append(
            f"{preemptions:.0f} preemptions in {d.window_s:.0f} s: the running sequences outgrew the "
            f"KV cache (usage {usage_peak:.0%}) and vLLM evicted some to recompute them later"
        )
        d.changes.append(
            {
                "flag": f"--max-num-seqs {seqs}",
                "why": f"{running_peak:.0f} sequences ran at once"
                + (f", about {per_seq:.0f} tokens each" if per_seq else "")
                + f"; {seqs} keep {SEQS_HEADROOM:.0%} of the cache in use without preempting",
            }
        )
        d.changes.append(
            {
                "flag": "--kv-cache-dtype fp8",
                "why": "halves the bytes per token of a 16-bit KV cache: twice the tokens in the same memory",
            }
        )
        d.changes.append(
            {
                "flag": "--max-model-len <shorter>",
                "why": "fewer blocks reserved per request; `rocmdoctor plan --model M` gives the figure",
            }
        )
    elif waiting_peak > 0 and usage_peak < 0.8:
        d.verdict = "queueing"
        d.findings.append(
            f"requests waited (up to {waiting_peak:.0f}) while the KV cache was at most "
            f"{usage_peak:.0%} used: the --max-num-seqs cap ({running_peak:.0f} running), not memory, "
            "held them back"
        )
        more = math.floor(running_peak * min(4.0, SEQS_HEADROOM / max(usage_peak, 0.01)))
        d.changes.append(
            {
                "flag": f"--max-num-seqs {max(more, int(running_peak) + 1)}",
                "why": f"{usage_peak:.0%} of the KV cache served {running_peak:.0f} sequences; there is "
                "room for more",
            }
        )
    elif usage_peak >= 0.9:
        d.verdict = "near-full"
        d.findings.append(
            f"the KV cache reached {usage_peak:.0%} without preempting yet: one burst more and it will"
        )
        d.changes.append({"flag": "--kv-cache-dtype fp8", "why": "twice the tokens in the same memory"})
    elif running_peak == 0 and waiting_peak == 0:
        d.verdict = "idle"
        d.findings.append("no request ran during the window: send load (rocmdoctor bench) and diagnose again")
    if hit_rate is not None:
        d.findings.append(
            f"prefix cache hit rate {hit_rate:.0%} in the window"
            + (
                "; prompts share little prefix: the cache mostly holds unique context"
                if hit_rate < 0.1
                else ""
            )
        )
    return d


def diagnose_url(
    base_url: str,
    window_s: float = 10.0,
    interval_s: float = 1.0,
    timeout_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Diagnosis:
    """Sample `base_url`/metrics for `window_s` seconds (at least twice) and diagnose."""
    if not base_url.startswith(("http://", "https://")):
        raise MetricsError(f"--url must start with http:// or https://, not {base_url!r}")
    if not 0 < window_s <= MAX_WINDOW_S:
        raise MetricsError(f"--window must be in (0, {MAX_WINDOW_S:.0f}] seconds, not {window_s}")
    url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    end = time.monotonic() + window_s
    snaps: list[Snapshot] = []
    info: dict[str, str] = {}
    while True:
        snap, info = snapshot(read_metrics(url, timeout_s), url)
        snaps.append(snap)
        left = end - time.monotonic()
        if left <= 0 and len(snaps) >= 2:
            break
        sleep(max(0.0, min(interval_s, left)))
    return diagnose(snaps, info, url)
