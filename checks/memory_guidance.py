"""Pure rules about which memory advice fits a host: whether the TTM limit matters (only when the GPU
vLLM will use is an APU), and what a large BIOS carve-out costs an APU. No host access here.

Sources: host-facts.md §5 (TTM/GTT rules: pages = GiB x 262144, the default limit is about half of RAM,
"AMD recommendation: keep the BIOS carve-out small (0.5 GB) and raise TTM/GTT instead"; amd-smi reports
only the carve-out as "VRAM" on Strix Halo), peers-and-pain-points.md (kyuz0 and AMD's Strix Halo
guidance: carve-out 512 MB, raise TTM/GTT), vllm-facts.md §1 (vLLM sizes the KV cache from what the
HIP runtime reports as the device's memory; RocmPlatform has no unified-memory handling).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rocmdoctor.facts.gpu_choice import NodeT, serving_nodes

GIB = 1 << 30
PAGES_PER_GIB = 262144  # 4 KiB pages
OS_RESERVE_GIB = 4  # what memory.ttm leaves the OS when it suggests a limit
SMALL_CARVEOUT = 512 << 20  # AMD's advice for Strix Halo: 0.5 GB
# A carve-out at or above this is the "VRAM in BIOS" setting, not the UMA default (512 MiB-4 GiB).
LARGE_CARVEOUT = 8 << 30


def ttm_matters(nodes: Sequence[NodeT]) -> bool:
    """The TTM limit bounds unified memory: it matters only when the GPU vLLM will use is an APU."""
    return any(n.apu for n in serving_nodes(nodes))


@dataclass(frozen=True)
class CarveoutAdvice:
    carveout_bytes: int
    gtt_bytes: int | None
    mem_total: int
    physical_bytes: int  # carve-out + what the OS sees
    reach_now_bytes: int  # what the GPU can be given today (the carve-out, or GTT if larger)
    reach_after_bytes: int  # with a 512 MiB carve-out and ttm.pages_limit = RAM - OS reserve
    pages_limit: int

    @property
    def gain_bytes(self) -> int:
        return self.reach_after_bytes - self.reach_now_bytes

    def summary(self) -> str:
        return (
            f'the BIOS reserves {gib(self.carveout_bytes)} of this APU\'s {gib(self.physical_bytes)} as "VRAM": the '
            f"OS keeps only {gib(self.mem_total)} and the GPU can be given about {gib(self.reach_now_bytes)}; with a "
            f"512 MiB carve-out and ttm.pages_limit={self.pages_limit} it could use about "
            f"{gib(self.reach_after_bytes)}"
        )

    def why(self) -> str:
        return (
            "On an APU the carve-out is the same DRAM as system RAM, fenced off at boot: the OS can never use it, "
            "and the GPU can never use more than it plus GTT. GTT, the GPU's window into ordinary RAM, is sized by "
            "the TTM limit (about half of RAM by default) and costs the OS nothing until allocated. AMD's advice "
            "for Strix Halo is a small carve-out (0.5 GB) and a raised TTM limit: vLLM then sees almost all of RAM, "
            "and what the model does not take stays available to the OS (loading weights, the CPU side of vLLM)."
        )

    def remedy(self) -> str:
        return (
            'In the firmware setup set the UMA frame buffer ("iGPU memory", "VRAM size") to 512 MB; then set '
            f"ttm.pages_limit={self.pages_limit} ({gib(self.reach_after_bytes)}; `rocmdoctor fix-kernel` writes the "
            "modprobe file) and reboot."
        )

    def finding_details(self) -> dict[str, Any]:
        """What memory.ttm puts in its details so that fix-kernel writes the carve-out step."""
        return {"carveout": {**self.to_json(), "why": self.why()}, "suggested_pages_limit": self.pages_limit}

    def to_json(self) -> dict[str, Any]:
        return {
            "carveout_bytes": self.carveout_bytes,
            "gtt_bytes": self.gtt_bytes,
            "mem_total": self.mem_total,
            "physical_bytes": self.physical_bytes,
            "reach_now_bytes": self.reach_now_bytes,
            "reach_after_bytes": self.reach_after_bytes,
            "suggested_pages_limit": self.pages_limit,
        }


def gib(value: int) -> str:
    return f"{value / GIB:.1f} GiB"


def carveout_advice(
    apu: bool | None, vram_total: int | None, gtt_total: int | None, mem_total: int | None
) -> CarveoutAdvice | None:
    """Advice for an APU whose BIOS carve-out is large; None when it does not apply or cannot be judged."""
    if apu is not True or not vram_total or not mem_total or vram_total < LARGE_CARVEOUT:
        return None
    physical = vram_total + mem_total
    after_ram = physical - SMALL_CARVEOUT
    target_gib = max(1, int(after_ram // GIB) - OS_RESERVE_GIB)
    reach_after = target_gib * GIB
    reach_now = max(vram_total, gtt_total or 0)
    if reach_after <= reach_now:
        return None
    return CarveoutAdvice(
        carveout_bytes=vram_total,
        gtt_bytes=gtt_total,
        mem_total=mem_total,
        physical_bytes=physical,
        reach_now_bytes=reach_now,
        reach_after_bytes=reach_after,
        pages_limit=target_gib * PAGES_PER_GIB,
    )
