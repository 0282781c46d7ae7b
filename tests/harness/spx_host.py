"""An 8-GPU Instinct node in SPX mode, composed from the captured CPX node (fixture mi308x-cpx).

No capture of an 8 x MI300-class node in SPX with its memory banks exists among the fixtures, so this
switches the captured CPX node's GPUs to SPX the way the driver shows it: the partitions of one
physical GPU (one PCI address, location_id with the partition bits clear) become one KFD node whose
compute units, XCCs and caches are the partitions' sum and whose memory bank is their banks' sum
(size and used bytes); the first partition's render node stays, the others' go. Everything else of
the capture (CPU nodes, hive, PCI devices, /proc, /etc) is copied unchanged.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from harness.hosts import fixture_root

NODES = "sys/class/kfd/kfd/topology/nodes"
SUMMED = ("simd_count", "array_count", "num_xcc", "caches_count")
PARTITION_BITS = 0x7


def read_properties(path: Path) -> list[tuple[str, int]]:
    out = []
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        out.append((key, int(value)))
    return out


def write_properties(path: Path, props: list[tuple[str, int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k} {v}\n" for k, v in props))


def gpu_nodes(root: Path) -> dict[int, dict[str, int]]:
    """KFD node -> properties, GPU nodes only (a CPU node has gfx_target_version 0)."""
    found = {}
    for node_dir in (root / NODES).iterdir():
        props = dict(read_properties(node_dir / "properties"))
        if props.get("gfx_target_version", 0):
            found[int(node_dir.name)] = props
    return found


def bank(root: Path, node: int) -> tuple[int, int]:
    """(size, used) of a node's frame-buffer bank as the capture has them."""
    base = root / NODES / str(node) / "mem_banks" / "0"
    size = dict(read_properties(base / "properties"))["size_in_bytes"]
    return size, int((base / "used_memory").read_text().split()[0])


def compose_spx(dest: Path, source: str = "mi308x-cpx") -> Path:
    """Copy the CPX fixture to `dest` and merge each GPU's partitions into one SPX node."""
    src = fixture_root(source)
    shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns("expected.json"))
    parts = gpu_nodes(src)
    by_gpu: dict[tuple[int, int], list[int]] = {}
    for node in sorted(parts):
        props = parts[node]
        by_gpu.setdefault((props["domain"], props["location_id"] & ~PARTITION_BITS), []).append(node)
    first_gpu_node = min(parts)
    for node in parts:
        shutil.rmtree(dest / NODES / str(node))
    for index, members in enumerate(by_gpu.values()):
        node = first_gpu_node + index
        template = read_properties(src / NODES / str(members[0]) / "properties")
        merged = [(k, sum(parts[m][k] for m in members) if k in SUMMED else v) for k, v in template]
        node_dir = dest / NODES / str(node)
        write_properties(node_dir / "properties", merged)
        shutil.copy(src / NODES / str(members[0]) / "name", node_dir / "name")
        (node_dir / "gpu_id").write_text((src / NODES / str(members[0]) / "gpu_id").read_text())
        banks = [bank(src, m) for m in members]
        bank_props = dict(read_properties(src / NODES / str(members[0]) / "mem_banks" / "0" / "properties"))
        bank_props["size_in_bytes"] = sum(size for size, _ in banks)
        write_properties(node_dir / "mem_banks" / "0" / "properties", list(bank_props.items()))
        (node_dir / "mem_banks" / "0" / "used_memory").write_text(f"{sum(used for _, used in banks)}\n")
        for extra in members[1:]:
            minor = parts[extra]["drm_render_minor"]
            shutil.rmtree(dest / "sys" / "class" / "drm" / f"renderD{minor}")
    return dest
