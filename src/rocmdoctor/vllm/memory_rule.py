"""vLLM's startup memory rule, in one place for `check`, `unit`/`serve` and the deep probe.

vLLM (vllm/v1/worker/utils.py `request_memory`) refuses to start when
    free < ceil(total * gpu_memory_utilization)
measured on the device's *total* memory at startup, not on what other processes left.

The GPU probe (probes/gpu_probe.py) runs on the bundle's interpreter and loads this file by path, so it
imports the standard library only.
"""

from __future__ import annotations

import math

# Headroom kept below what the rule allows: the runtime's own allocations (HIP context,
# cuBLAS/hipBLASLt workspaces, warm-up) land between our measurement and vLLM's.
DEFAULT_MARGIN_BYTES = 1 << 30
UTIL_STEP = 0.01
# Below this vLLM has no room for weights plus KV cache of any model worth serving.
MIN_USEFUL_UTILIZATION = 0.05


def requested_bytes(total: int, utilization: float) -> int:
    return math.ceil(total * utilization)


def passes(total: int, free: int, utilization: float) -> bool:
    return 0 < utilization <= 1 and free >= requested_bytes(total, utilization)


def largest_passing(total: int, free: int, step: float = UTIL_STEP) -> float:
    """The largest multiple of `step` that passes the rule right now (0.0 when none does)."""
    if total <= 0 or free <= 0:
        return 0.0
    steps = int(round(1 / step))
    best = min(steps, math.floor(free / total * steps))
    # Float rounding at the boundary: walk down until the exact integer rule holds.
    while best > 0 and not passes(total, free, round(best * step, 6)):
        best -= 1
    return round(best * step, 6)


def recommended(total: int, free: int, margin_bytes: int = DEFAULT_MARGIN_BYTES) -> float:
    """The value to pass as --gpu-memory-utilization: the rule, with `margin_bytes` kept free."""
    return largest_passing(total, max(0, free - margin_bytes))
