"""`rocmdoctor bench`: what concurrency buys on this server, and where it stops paying.

The same request set runs sequentially and at each concurrency level, streamed, timed with vLLM's
own definitions (`vllm bench serve`): TTFT = first chunk with choices - send; ITL = gaps between
chunks; E2EL = last content chunk - send; TPOT = (E2EL - TTFT) / (output tokens - 1). Output tokens
are the server's own `usage.completion_tokens`, and their total is checked against the growth of
`vllm:generation_tokens_total` over the run. Every prompt of a run opens with a number drawn for
the run, so neither a rerun nor another level finds its prefill in vLLM's prefix cache; the server's
own prefix-cache counters over the levels say whether any prompt token was served from it.

`--timeout` bounds every request from connect to the last byte of its stream (not only each
silence), and an answer of the wrong shape or size ends the run: a server that answers something
else than the OpenAI API cannot be measured.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, TypeVar

from rocmdoctor import __version__
from rocmdoctor.model import envelope
from rocmdoctor.provision.verify import openai_client as oc
from rocmdoctor.provision.verify.smoke import LOG_HINT

SEED_TEXT = (
    "The server answers every request in order, streams one chunk per token and measures "
    "the latency of each reply under load. "
)
PERCENTILES = (50, 90, 95, 99)  # p95: the upgrade's latency gate
T = TypeVar("T")
# The knee: the smallest concurrency that reaches this share of the best throughput measured.
KNEE_SHARE = 0.9
# Errors that every later request would repeat: stop the run instead of waiting them out.
FATAL_KINDS = (oc.UNREACHABLE, oc.TIMEOUT, oc.UNAUTHORIZED, oc.MODEL_NOT_FOUND, oc.BAD_RESPONSE)
COUNTER = "vllm:generation_tokens_total"
# vLLM's prefix cache (vllm/v1/metrics/loggers.py), in prompt tokens: queries looked it up, hits were
# served from it.
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
# Every run draws its number from this many; a prompt opens with it (see unique_prompts).
RUN_IDS = 1 << 32
METRICS_SETTLE_S = 5.0


class BenchAborted(Exception):
    """The server cannot be benchmarked at all (gone, stalled, wrong key or model)."""

    def __init__(self, error: oc.ServerError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True)
class BenchOptions:
    url: str
    model: str = "auto"
    api_key: str | None = None
    timeout_s: float = 60.0
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    requests: int = 32
    prompt_tokens: int = 128
    max_tokens: int = 128


@dataclass
class RequestResult:
    ok: bool
    output_tokens: int = 0
    ttft_s: float | None = None
    e2el_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.output_tokens <= 1 or self.ttft_s is None or self.e2el_s is None:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution_ms(values_s: list[float]) -> dict[str, float] | None:
    if not values_s:
        return None
    ms = [v * 1000 for v in values_s]
    summary = {"mean": statistics.fmean(ms)}
    summary.update({f"p{p}": percentile(ms, p) for p in PERCENTILES})
    return {k: round(v, 3) for k, v in summary.items()}


async def _one_request(client: oc.Client, body: dict[str, Any]) -> RequestResult:
    try:
        streamed = await client.stream("/v1/completions", body)
    except oc.ServerError as exc:
        if exc.kind in FATAL_KINDS:
            raise BenchAborted(exc) from None
        return RequestResult(ok=False, error=str(exc))
    times = streamed.chunk_times
    if not times or streamed.output_tokens is None:
        return RequestResult(ok=False, error="the stream carried no tokens or no usage")
    return RequestResult(
        ok=True,
        output_tokens=streamed.output_tokens,
        ttft_s=times[0] - streamed.start,
        e2el_s=times[-1] - streamed.start,
        itl_s=[b - a for a, b in pairwise(times)],
    )


async def run_level(client: oc.Client, bodies: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    results, duration = await run_requests(client, bodies, concurrency)
    return summarize_level(concurrency, results, duration)


async def run_requests(
    client: oc.Client, bodies: list[dict[str, Any]], concurrency: int
) -> tuple[list[RequestResult], float]:
    """Every request, at most `concurrency` in flight: the results and the wall time they took."""
    gate = asyncio.Semaphore(concurrency)

    async def gated(body: dict[str, Any]) -> RequestResult:
        async with gate:
            return await _one_request(client, body)

    started = time.perf_counter()
    tasks = [asyncio.ensure_future(gated(body)) for body in bodies]
    try:
        results = await asyncio.gather(*tasks)
    except BenchAborted:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return list(results), time.perf_counter() - started


def summarize_level(concurrency: int, results: list[RequestResult], duration_s: float) -> dict[str, Any]:
    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    errors = sorted({r.error for r in results if not r.ok})
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "completed": len(done),
        "failures": len(results) - len(done),
        "duration_s": round(duration_s, 4),
        "output_tokens": output_tokens,
        "output_tokens_per_s": round(output_tokens / duration_s, 3),
        "requests_per_s": round(len(done) / duration_s, 4),
        "speedup": None,  # filled in once the sequential level is known
        "ttft_ms": distribution_ms([r.ttft_s for r in done if r.ttft_s is not None]),
        "tpot_ms": distribution_ms([t for r in done if (t := r.tpot_s) is not None]),
        "itl_ms": distribution_ms([gap for r in done for gap in r.itl_s]),
        "e2el_ms": distribution_ms([r.e2el_s for r in done if r.e2el_s is not None]),
        "errors": errors[:5],
    }


def find_knee(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """The smallest concurrency within KNEE_SHARE of the best throughput; levels past the best that
    fall below that share are where more concurrency hurts."""
    clean = [lv for lv in levels if lv["failures"] == 0] or levels
    best = max(clean, key=lambda lv: lv["output_tokens_per_s"])
    threshold = KNEE_SHARE * best["output_tokens_per_s"]
    knee = next(lv for lv in clean if lv["output_tokens_per_s"] >= threshold)
    hurting = [
        lv["concurrency"]
        for lv in levels
        if lv["concurrency"] > best["concurrency"] and lv["output_tokens_per_s"] < threshold
    ]
    at_limit = knee["concurrency"] == max(lv["concurrency"] for lv in levels)
    if at_limit:
        advice = (
            f"throughput still rises at concurrency {knee['concurrency']}, the largest tested: "
            "rerun with higher --concurrency levels to find the knee"
        )
    else:
        advice = (
            f"start vLLM with --max-num-seqs {knee['concurrency']}: more concurrent sequences add "
            f"less than {round((1 - KNEE_SHARE) * 100)}% throughput"
        )
        if hurting:
            advice += f" and throughput falls at concurrency {', '.join(map(str, hurting))}"
    return {
        "concurrency": knee["concurrency"],
        "output_tokens_per_s": knee["output_tokens_per_s"],
        "best_concurrency": best["concurrency"],
        "best_output_tokens_per_s": best["output_tokens_per_s"],
        "hurting_at": hurting,
        "reached_limit": at_limit,
        "recommended_max_num_seqs": None if at_limit else knee["concurrency"],
        "advice": advice,
    }


async def _prompt_ids(client: oc.Client, model: str) -> list[int] | None:
    """The seed text's token ids, from which every prompt is made (exact token counts); None when
    the server has no /tokenize (then words are sent)."""
    try:
        ids = await client.tokenize({"model": model, "prompt": SEED_TEXT})
    except oc.ServerError as exc:
        if exc.kind in FATAL_KINDS and exc.kind != oc.MODEL_NOT_FOUND:
            raise BenchAborted(exc) from None
        return None
    return ids or None


prompt_ids = _prompt_ids  # tune makes its synthetic prompts the same way


def _width(n: int, values: int) -> int:
    """How many base-n digits write every number below `values`."""
    width = 1
    while n > 1 and n**width < values:
        width += 1
    return width


def _digits(units: Sequence[T], value: int, width: int) -> list[T]:
    n = len(units)
    return [units[(value // n**d) % n] for d in range(width)]


def new_run_id() -> int:
    return secrets.randbelow(RUN_IDS)


def unique_prompts(
    units: Sequence[T], length: int, start: int, count: int, run_id: int | None = None
) -> list[list[T]]:
    """Prompts number start .. start+count-1 of a run, `length` units each, no two alike from their
    first units on: prompt j opens with j and then the run's number (when given), written in base
    len(units) (the digits are units), then the seed rotated by j. vLLM's prefix cache matches whole
    blocks from a prompt's start, so no prompt finds another's prefill to skip, within a level or
    across levels (a rotation alone repeats after len(units) prompts, and a level reusing the
    previous level's prompts is all cache hits), nor across runs when each run has its number (a
    rerun of the same prompts is all cache hits: 96% of the prompt tokens of a second run of 400-token
    prompts on the CPU engine, docs/performance.md)."""
    n = len(units)
    run = [] if run_id is None or n < 2 else _digits(units, run_id, _width(n, RUN_IDS))
    width = _width(n, start + count)
    return [
        (_digits(units, j, width) + run + [units[(j + k) % n] for k in range(length)])[:length]
        for j in range(start, start + count)
    ]


def prompt_bodies(
    model: str,
    ids: list[int] | None,
    options: BenchOptions,
    start: int,
    count: int,
    run_id: int | None = None,
) -> list[dict[str, Any]]:
    """The request bodies for prompts start .. start+count-1 of run `run_id` (token ids, or words
    without /tokenize)."""
    words = SEED_TEXT.split()
    prompts: list[Any] = (
        unique_prompts(ids, options.prompt_tokens, start, count, run_id)
        if ids is not None
        else [" ".join(p) for p in unique_prompts(words, options.prompt_tokens, start, count, run_id)]
    )
    return [
        {"model": model, "prompt": p, "max_tokens": options.max_tokens, "ignore_eos": True, "temperature": 0}
        for p in prompts
    ]


async def _server_counters(client: oc.Client, model: str) -> dict[str, float]:
    """The counters a run reads (COUNTER, PREFIX_HITS, PREFIX_QUERIES) that the server has, from one
    /metrics read; none when it has no /metrics (an HTTP error). A /metrics that stalls, is too large,
    is not Prometheus text or holds a counter that is not a count (NaN, infinite, negative) raises
    ServerError: the server's accounting cannot be trusted."""
    try:
        samples = await client.metrics()
    except oc.ServerError as exc:
        if exc.kind != oc.HTTP:
            raise
        return {}
    found = {}
    for name in (COUNTER, PREFIX_HITS, PREFIX_QUERIES):
        value = oc.counter(samples, name, model_name=model)
        value = value if value is not None else oc.counter(samples, name)
        if value is not None:
            found[name] = value
    return found


def prefix_cache(before: dict[str, float], after: dict[str, float]) -> dict[str, Any] | None:
    """The prompt tokens the server looked up in and served from its prefix cache between two reads
    of its counters; None when it does not count them."""
    if not all(name in before and name in after for name in (PREFIX_HITS, PREFIX_QUERIES)):
        return None
    hits = int(after[PREFIX_HITS] - before[PREFIX_HITS])
    queries = int(after[PREFIX_QUERIES] - before[PREFIX_QUERIES])
    return {
        "hits": hits,
        "queries": queries,
        "detail": ""
        if hits == 0
        else (
            "prompt tokens were served from the server's prefix cache: another client sends the same "
            "prompts, and the TTFT of those requests is a cached prefill's"
        ),
    }


async def _cross_check(
    client: oc.Client, model: str, before: float | None, counted: int
) -> tuple[dict[str, Any], dict[str, float]]:
    """The token cross-check, and the counters as last read (the run's end)."""
    if before is None:
        return {
            "status": "unavailable",
            "counted_tokens": counted,
            "server_tokens": None,
            "detail": f"/metrics has no {COUNTER}",
        }, await _server_counters(client, model)
    deadline = time.monotonic() + METRICS_SETTLE_S
    while True:
        counters = await _server_counters(client, model)
        after = counters.get(COUNTER)
        grown = None if after is None else int(after - before)
        if grown == counted or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    status = "match" if grown == counted else "mismatch"
    detail = (
        ""
        if status == "match"
        else (
            "the server generated more tokens than this run received: other clients share it, or failed "
            "requests generated tokens"
            if grown is not None and grown > counted
            else "the server counted fewer tokens than this run received"
        )
    )
    return {"status": status, "counted_tokens": counted, "server_tokens": grown, "detail": detail}, counters


async def resolve_model(client: oc.Client, wanted: str) -> str:
    try:
        served = await client.models()
    except oc.ServerError as exc:
        raise BenchAborted(exc) from None
    if wanted == "auto" and served:
        return served[0]
    if wanted not in served:
        raise BenchAborted(
            oc.ServerError(oc.MODEL_NOT_FOUND, f"model {wanted!r} is not served; the server serves {served}")
        )
    return wanted


async def _still_serving(client: oc.Client) -> None:
    """After failed requests: raise BenchAborted if the server is gone, so the run stops there."""
    try:
        await client.health()
    except oc.ServerError as exc:
        if exc.kind == oc.UNREACHABLE or exc.status == 503:
            raise BenchAborted(
                oc.ServerError(oc.UNREACHABLE, f"the server went away during the run ({exc})")
            ) from None


def abort_remedy(error: oc.ServerError, api_key_given: bool) -> str:
    if error.kind == oc.UNAUTHORIZED:
        return (
            "check that --api-key-file holds the key vLLM was started with"
            if api_key_given
            else "pass --api-key-file FILE holding the key vLLM was started with (--api-key or VLLM_API_KEY)"
        )
    if error.kind == oc.MODEL_NOT_FOUND:
        return "use --model auto, or restart vLLM with --served-model-name set to the name you pass"
    if error.kind == oc.TIMEOUT:
        return f"the server stopped answering: {LOG_HINT}; raise --timeout if it is only slow"
    if error.kind == oc.BAD_RESPONSE:
        return (
            "the answer does not have the shape or size the OpenAI API defines: check that --url points "
            "at vLLM's OpenAI-compatible server (not a proxy that rewrites answers); `rocmdoctor smoke` "
            "shows which endpoint"
        )
    if error.kind in (oc.HTTP, oc.STREAM_CUT, oc.BAD_RESPONSE):
        return (
            "the server cannot serve a streamed completion: run `rocmdoctor smoke` to see which step "
            f"fails; {LOG_HINT}"
        )
    return f"the server went away: {LOG_HINT} (often out of memory), restart it and rerun"


async def run_levels(options: BenchOptions) -> dict[str, Any]:
    """Every level in order; a fatal error after the warm-up ends the run with what was measured."""
    levels = sorted(set(options.concurrency) | {1})
    server = oc.Server(options.url, options.api_key, options.timeout_s)
    async with oc.open_client(server, connections=max(levels)) as client:
        model = await resolve_model(client, options.model)
        ids = await _prompt_ids(client, model)
        try:
            return await _measure(client, options, levels, model, ids, new_run_id())
        except oc.ServerError as exc:  # the /metrics counter read around the levels
            raise BenchAborted(exc) from None


async def _measure(
    client: oc.Client,
    options: BenchOptions,
    levels: list[int],
    model: str,
    ids: list[int] | None,
    run_id: int,
) -> dict[str, Any]:
    # A warm-up round at the highest concurrency: a fresh engine pays for every new batch shape
    # once (kernel selection, allocator growth), which would otherwise land in the measured levels.
    warm_up = await run_level(client, prompt_bodies(model, ids, options, 0, max(levels), run_id), max(levels))
    if warm_up["failures"]:
        raise BenchAborted(oc.ServerError(oc.HTTP, f"the warm-up request failed: {warm_up['errors'][0]}"))
    counters = await _server_counters(client, model)
    before = counters.get(COUNTER)
    results: list[dict[str, Any]] = []
    aborted = None
    try:
        for index, concurrency in enumerate(levels):
            # Each level its own prompts: none of them is in the prefix cache yet.
            start = max(levels) + index * options.requests
            results.append(
                await run_level(
                    client,
                    prompt_bodies(model, ids, options, start, options.requests, run_id),
                    concurrency,
                )
            )
            if results[-1]["failures"]:
                await _still_serving(client)
    except BenchAborted as exc:
        aborted = {
            "kind": exc.error.kind,
            "message": str(exc.error),
            "at_concurrency": concurrency,
            "remedy": abort_remedy(exc.error, options.api_key is not None),
        }
    counted = sum(lv["output_tokens"] for lv in results)
    if aborted:
        cross_check = {
            "status": "skipped",
            "counted_tokens": counted,
            "server_tokens": None,
            "detail": "the run was aborted",
        }
        prefix = None
    else:
        cross_check, after = await _cross_check(client, model, before, counted)
        prefix = prefix_cache(counters, after)
    return {
        "model": model,
        "prompt_kind": "token_ids" if ids is not None else "words",
        "levels": results,
        "cross_check": cross_check,
        "prefix_cache": prefix,
        "aborted": aborted,
    }


def build_report(options: BenchOptions, run: dict[str, Any]) -> dict[str, Any]:
    levels = run["levels"]
    sequential = levels[0]["output_tokens_per_s"] if levels else 0
    for level in levels:
        level["speedup"] = round(level["output_tokens_per_s"] / sequential, 3) if sequential else None
    failures = sum(lv["failures"] for lv in levels)
    ok = failures == 0 and not run["aborted"] and run["cross_check"]["status"] != "mismatch"
    measured = any(lv["output_tokens_per_s"] > 0 for lv in levels)
    return envelope(
        tool="rocmdoctor",
        version=__version__,
        command="bench",
        url=options.url,
        model=run["model"],
        settings={
            "requests": options.requests,
            "prompt_tokens": options.prompt_tokens,
            "prompt_kind": run["prompt_kind"],
            "max_tokens": options.max_tokens,
            "concurrency": sorted(set(options.concurrency) | {1}),
            "timeout_s": options.timeout_s,
        },
        levels=levels,
        knee=find_knee(levels) if measured else None,
        cross_check=run["cross_check"],
        prefix_cache=run.get("prefix_cache"),
        failures=failures,
        aborted=run["aborted"],
        exit_code=0 if ok else 1,
    )


def run_bench(options: BenchOptions) -> dict[str, Any]:
    """The bench report; raises BenchAborted when the server cannot be benchmarked at all."""
    return build_report(options, asyncio.run(run_levels(options)))
