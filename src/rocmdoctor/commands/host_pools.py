"""The diagnosis's GPUs as the pools the server arguments are sized from (the one place checks meet provision)."""

from __future__ import annotations

from ..checks import facts
from ..provision.server_args import GpuPool
from ..registry import Context


def pools_from_facts(ctx: Context) -> list[GpuPool]:
    """The GPUs the diagnosis found, each with the pool vLLM will size from (the pool the runtime reports)."""
    pools = []
    for gpu in facts.gpus(ctx):
        total, free = facts.usable_memory(ctx, gpu)
        pools.append(
            GpuPool(f"node {gpu.node} ({gpu.gfx})", gpu.family or gpu.gfx, total, free, bool(gpu.apu))
        )
    return pools
