"""Bench several vLLM instances: each alone, then all at once, and the aggregate throughput against
the sum of the single-instance figures (1.0: the instances do not slow each other down).

The requests, the warm-up and each level are `bench`'s own (provision/verify/bench.py); this only runs
them per instance and side by side in one event loop, so the aggregate is measured over one wall
clock, not added up from runs that overlapped by chance.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from rocmdoctor.provision.verify import openai_client as oc
from rocmdoctor.provision.verify.bench import (
    BenchAborted,
    BenchOptions,
    _prompt_ids,
    new_run_id,
    prompt_bodies,
    resolve_model,
    run_level,
)


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    url: str
    api_key: str | None


class InstanceAborted(Exception):
    def __init__(self, name: str, error: oc.ServerError) -> None:
        super().__init__(f"vllm@{name}: {error}")
        self.name = name
        self.error = error


async def _seed(client: oc.Client, options: BenchOptions) -> tuple[str, list[int] | None]:
    model = await resolve_model(client, options.model)
    return model, await _prompt_ids(client, model)


async def _guarded(name: str, work: Any) -> Any:
    try:
        return await work
    except BenchAborted as exc:
        raise InstanceAborted(name, exc.error) from None


async def run(targets: list[Target], options: BenchOptions, concurrency: int) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                oc.open_client(oc.Server(t.url, t.api_key, options.timeout_s), connections=concurrency)
            )
            for t in targets
        ]
        seeds = [await _guarded(t.name, _seed(c, options)) for t, c in zip(targets, clients, strict=True)]
        # Warm-up, alone and together each send prompts no earlier run sent, nor an earlier `bench`
        # (the run's number): no prefix-cache hits.
        run_id = new_run_id()
        runs = [
            (0, concurrency),
            (concurrency, options.requests),
            (concurrency + options.requests, options.requests),
        ]
        warm_up, alone_set, together_set = (
            [prompt_bodies(model, ids, options, start, count, run_id) for model, ids in seeds]
            for start, count in runs
        )
        for t, c, b in zip(targets, clients, warm_up, strict=True):
            warm = await _guarded(t.name, run_level(c, b, concurrency))
            if warm["failures"]:
                raise InstanceAborted(
                    t.name, oc.ServerError(oc.HTTP, f"the warm-up failed: {warm['errors'][0]}")
                )
        alone = [
            await _guarded(t.name, run_level(c, b, concurrency))
            for t, c, b in zip(targets, clients, alone_set, strict=True)
        ]
        started = time.perf_counter()
        together = await asyncio.gather(
            *(
                _guarded(t.name, run_level(c, b, concurrency))
                for t, c, b in zip(targets, clients, together_set, strict=True)
            )
        )
        wall = time.perf_counter() - started
    aggregate = sum(lv["output_tokens"] for lv in together) / wall if wall > 0 else 0.0
    sum_alone = sum(lv["output_tokens_per_s"] for lv in alone)
    failures = sum(lv["failures"] for lv in alone) + sum(lv["failures"] for lv in together)
    return {
        "concurrency_per_instance": concurrency,
        "requests_per_instance": options.requests,
        "instances": [
            {"name": t.name, "url": t.url, "alone": a, "together": g}
            for t, a, g in zip(targets, alone, together, strict=True)
        ],
        "aggregate_output_tokens_per_s": round(aggregate, 3),
        "sum_of_alone_output_tokens_per_s": round(sum_alone, 3),
        "scaling": round(aggregate / sum_alone, 3) if sum_alone else None,
        "wall_s": round(wall, 4),
        "failures": failures,
        "exit_code": 0 if failures == 0 else 1,
    }


def run_instances_bench(targets: list[Target], options: BenchOptions, concurrency: int) -> dict[str, Any]:
    """Raises InstanceAborted when an instance cannot be benchmarked at all."""
    return asyncio.run(run(targets, options, concurrency))
