"""What a host can serve before anything is written: every instance layout its GPUs allow, how many
servers each gives and the memory each server would get.

Pure, like the layout it reports on: the device records in (rocmdoctor.commands.host_devices), plain
JSON-able data out for `rocmdoctor check`. The layouts, their refusals and each instance's
--gpu-memory-utilization come from provision.layout; nothing here decides a layout itself. Ports are
left out on purpose: which ports are free is a question for the moment of writing (`instances`
probes them), and a capacity report must not open sockets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rocmdoctor.provision.server.layout import (
    Device,
    LayoutError,
    group_utilization,
    layout_options,
    offered,
    rocr_indices,
    usable,
)
from rocmdoctor.vllm.memory_rule import requested_bytes

NO_GPU = "no GPU that a vllm-rocm bundle supports: there is no layout to choose"


def _sum(values: list[int | None]) -> int | None:
    """The instance's total over its devices; None when any device's is unknown."""
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _share(name: str, group: Sequence[Device]) -> dict[str, Any]:
    """One instance: its devices, their memory, and what vLLM would take of it."""
    entry: dict[str, Any] = {
        "name": name,
        "kfd_nodes": [d.kfd_node for d in group],
        "memory_total": _sum([d.memory_total for d in group]),
        "memory_free": _sum([d.memory_free for d in group]),
        "memory_bytes": None,
        "gpu_memory_utilization": None,
        "note": None,
    }
    try:
        util, _why = group_utilization(group)
    except LayoutError as exc:
        entry["note"] = str(exc)
        return entry
    entry["gpu_memory_utilization"] = util
    # Every rank of a tensor-parallel group asks ceil(its own total x util) of its own device.
    entry["memory_bytes"] = sum(requested_bytes(d.memory_total or 0, util) for d in group)
    return entry


def _entry(
    layout: str, tp: int, family: str, suffix: str, groups: list[list[Device]] | LayoutError
) -> dict[str, Any]:
    refused = isinstance(groups, LayoutError)
    instances = [] if isinstance(groups, LayoutError) else [_share(str(i), g) for i, g in enumerate(groups)]
    return {
        "name": layout if tp == 1 else f"{layout} tp={tp}",
        "layout": layout,
        "tensor_parallel_size": tp,
        "family": family,
        "options": layout_options(layout, tp) + suffix,
        "works": not refused,
        "reason": str(groups) if refused else None,
        "instance_count": len(instances),
        "devices_per_instance": tp,
        "instances": instances,
    }


def _family_layouts(devices: list[Device], family: str, several: bool) -> list[dict[str, Any]]:
    """The working layouts of one family's devices, in LAYOUTS order; a layout with no working
    tensor-parallel size appears once, refused, with the reason its plain form (tp=1) gives."""
    suffix = f" --family {family}" if several else ""
    by_layout: dict[str, list[tuple[int, list[list[Device]] | LayoutError]]] = {}
    for layout, tp, groups in offered(devices):
        by_layout.setdefault(layout, []).append((tp, groups))
    out: list[dict[str, Any]] = []
    for layout, tries in by_layout.items():
        working = [(tp, g) for tp, g in tries if not isinstance(g, LayoutError)]
        for tp, groups in working or tries[:1]:
            out.append(_entry(layout, tp, family, suffix, groups))
    return out


def capacity(devices: Sequence[Device], gpus: Sequence[str] = ()) -> dict[str, Any]:
    """The `capacity` section of the check report, for every GPU node of the host (in any order)."""
    ordered = sorted(devices, key=lambda d: d.kfd_node)
    families = list(dict.fromkeys(d.family for d in ordered if d.family))
    unsupported = [f"{d.label}: no vllm-rocm bundle for {d.gfx}" for d in ordered if not d.family]
    layouts: list[dict[str, Any]] = []
    for family in families:
        keep, _other_families = usable(ordered, family)
        layouts += _family_layouts(keep, family, len(families) > 1)
    return {
        "serving": serving(ordered, gpus),
        "devices": sum(1 for d in ordered if d.family),
        "families": families,
        "unsupported": unsupported,
        "note": None if families else NO_GPU,
        "layouts": layouts,
    }


def serving(devices: Sequence[Device], gpus: Sequence[str] = ()) -> dict[str, Any]:
    """The GPUs a server serves on when nobody picks (gpu_choice's rule, the one memory.gpu, memory.ttm
    and kernel.cwsr judge and `unit` pins), by identity and ROCR index; or why the choice is open."""
    index = rocr_indices(devices)
    try:
        keep, _hidden = usable(devices, None, gpus)
    except LayoutError as exc:  # an open choice, or a --gpu that names nothing here
        return {"family": None, "gpus": [], "ambiguous": str(exc)}
    return {
        "family": keep[0].family if keep else None,
        "gpus": [
            {"kfd_node": d.kfd_node, "pci_slot": d.pci_slot, "rocr_index": index[d.kfd_node], "apu": d.apu}
            for d in keep
        ],
        "ambiguous": None,
    }
