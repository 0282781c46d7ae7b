"""The capacity section of `rocmdoctor check` for people: one line per layout the host allows.

Reads only the report's `capacity` dict (provision.capacity builds it); no layout logic here.
"""

from __future__ import annotations

from typing import Any

GIB = 1 << 30


def _span(values: list[float], fmt: str) -> str:
    low, high = min(values), max(values)
    return fmt.format(low) if fmt.format(low) == fmt.format(high) else f"{fmt.format(low)}-{fmt.format(high)}"


def memory_summary(instances: list[dict[str, Any]]) -> str:
    """What each instance would get, as a range when they differ; why not, when it cannot be said."""
    unknown = [i for i in instances if i["memory_total"] is None or i["memory_free"] is None]
    if unknown:
        return "memory unknown (memory.gpu says why): pass --gpu-memory-utilization when writing"
    pool = _span([i["memory_total"] / GIB for i in instances], "{:.1f}") + " GiB each"
    sized = [i for i in instances if i["gpu_memory_utilization"] is not None]
    if not sized:
        return f"{pool}; none can start: {instances[0]['note']}"
    taken = _span([i["memory_bytes"] / GIB for i in sized], "{:.1f}")
    util = _span([i["gpu_memory_utilization"] for i in sized], "{:.2f}")
    line = f"{pool}, vLLM takes {taken} GiB (--gpu-memory-utilization {util})"
    stuck = [i for i in instances if i["gpu_memory_utilization"] is None]
    if stuck:
        line += f"; {len(stuck)} of {len(instances)} cannot start: {stuck[0]['note']}"
    return line


def layout_line(entry: dict[str, Any]) -> str:
    if not entry["works"]:
        return f"refused: {entry['reason']}"
    n, per = entry["instance_count"], entry["devices_per_instance"]
    shape = f"{n} instance{'s' if n != 1 else ''} x {per} device{'s' if per != 1 else ''}"
    return f"{shape:<25} {memory_summary(entry['instances'])}"


def render_capacity(capacity: dict[str, Any] | None, console: Any) -> None:
    """The section under the checks; nothing when the report has none (an older report)."""
    from rich.text import Text

    if capacity is None:
        return
    console.print()
    if capacity["note"]:
        console.print(Text(f"Capacity: {capacity['note']}", style="bold"))
        return
    families = ", ".join(capacity["families"])
    console.print(
        Text(
            f"Capacity: {capacity['devices']} device(s) ({families}); layouts for "
            "`rocmdoctor instances` (nothing is written):",
            style="bold",
        )
    )
    several = len(capacity["families"]) > 1
    names = [e["name"] + (f" [{e['family']}]" if several else "") for e in capacity["layouts"]]
    width = max(len(name) for name in names)
    for name, entry in zip(names, capacity["layouts"], strict=True):
        style = "" if entry["works"] else "dim"
        console.print(Text(f"  {name:<{width}}  {layout_line(entry)}", style=style))
    for unused in capacity["unsupported"]:
        console.print(Text(f"  not used: {unused}", style="dim"))
    serving = capacity.get("serving") or {}
    if several and serving.get("ambiguous"):
        console.print(Text(f"  no default GPU: {serving['ambiguous']}", style="yellow"))
    elif several and serving.get("gpus"):
        chosen = ", ".join(
            f"node {g['kfd_node']} ({g['pci_slot']}, ROCR index {g['rocr_index']})" for g in serving["gpus"]
        )
        console.print(
            Text(f"  served (as unit and serve pin it; --gpu chooses): {chosen} [{serving['family']}]")
        )
