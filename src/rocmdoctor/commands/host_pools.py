"""The diagnosis's GPUs as the pools the server arguments are sized from (the one place checks meet provision)."""

from __future__ import annotations

from rocmdoctor.checks import facts
from rocmdoctor.provision.server.args import GpuPool
from rocmdoctor.registry import Context


def pools_from_facts(ctx: Context, nodes: list[int] | None = None) -> list[GpuPool]:
    """The GPUs the diagnosis found (or the KFD `nodes` given, in that order: the ones the server is
    pinned to), each with the pool vLLM will size from (the pool the runtime reports)."""
    pools = []
    found = facts.gpus(ctx)
    chosen = found if nodes is None else [g for n in nodes for g in found if g.node == n]
    for gpu in chosen:
        total, free = facts.usable_memory(ctx, gpu)
        pools.append(
            GpuPool(
                f"node {gpu.node} ({gpu.gfx})", gpu.family or gpu.gfx, total, free, bool(gpu.apu), gpu.gfx
            )
        )
    return pools
