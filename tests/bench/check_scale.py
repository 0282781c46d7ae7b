"""`rocmdoctor check --json` on a root that a stranger made large: many GPUs with many DRM nodes, or
very many KFD nodes. Every value comes from the r9700 fixture's real capture (its GPU node's properties,
its memory bank); only the count and the PCI addresses are multiplied.

    .venv/bin/python tests/bench/check_scale.py [--gpus 1000] [--drm 1000] [--kfd 10000] [--runs 1]

Scenarios:
- gpus x drm: N GPU nodes whose render minors name no renderD directory (a replayed tree, a kernel that
  does not print it), so each is found by its PCI address among M DRM devices (card<N> directories
  with a uevent): the path that was N x M uevent reads.
- kfd: N GPU nodes, each with its renderD directory.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "tests/fixtures/hosts/r9700"
NODES = "sys/class/kfd/kfd/topology/nodes"
GIB = 1 << 30


def _slot(i: int) -> tuple[str, int]:
    """A PCI address per index (bus/device/function) and its KFD location_id (bus << 8 | devfn)."""
    bus, devfn = 1 + i // 256, i % 256
    return f"0000:{bus:02x}:{devfn >> 3:02x}.{devfn & 7}", (bus << 8) | devfn


def build(root: Path, gpus: int, drm: int, render_dirs: bool) -> None:
    shutil.copytree(BASE, root, symlinks=True, ignore=shutil.ignore_patterns("expected.json"))
    node = (root / NODES / "1" / "properties").read_text()
    bank = (root / NODES / "1" / "mem_banks" / "0" / "properties").read_text()
    shutil.rmtree(root / NODES / "1")
    lines = [ln for ln in node.splitlines() if not ln.startswith(("location_id", "drm_render_minor"))]
    for i in range(gpus):
        slot, location = _slot(i)
        directory = root / NODES / str(i + 1)
        (directory / "mem_banks" / "0").mkdir(parents=True)
        minor = 128 + i
        (directory / "properties").write_text(
            "\n".join([*lines, f"location_id {location}", f"drm_render_minor {minor}"]) + "\n"
        )
        (directory / "mem_banks" / "0" / "properties").write_text(bank)
        if render_dirs:
            device = root / "sys/class/drm" / f"renderD{minor}" / "device"
            device.mkdir(parents=True)
            (device / "uevent").write_text(f"DRIVER=amdgpu\nPCI_SLOT_NAME={slot}\n")
            (device / "mem_info_vram_total").write_text(f"{32 * GIB}\n")
    for i in range(drm):
        slot, _ = _slot(i)
        device = root / "sys/class/drm" / f"card{i}" / "device"
        device.mkdir(parents=True)
        (device / "uevent").write_text(f"DRIVER=amdgpu\nPCI_SLOT_NAME={slot}\n")
        (device / "mem_info_vram_total").write_text(f"{32 * GIB}\n")


def timed(root: Path, runs: int) -> list[float]:
    argv = [str(Path(sys.executable).parent / "rocmdoctor"), "--root", str(root), "check", "--json"]
    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(argv, check=False, capture_output=True, text=True)
        walls.append(time.perf_counter() - started)
        if done.returncode not in (0, 1):
            sys.exit(f"check exited {done.returncode}: {done.stderr[-800:]}")
    return walls


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--drm", type=int, default=1000)
    parser.add_argument("--kfd", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--only", choices=("drm", "kfd"), default=None, help="one scenario")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="check-scale-") as tmp:
        scenarios = {
            "drm": (f"{args.gpus} GPUs x {args.drm} DRM nodes", args.gpus, args.drm, False),
            "kfd": (f"{args.kfd} KFD nodes", args.kfd, 0, True),
        }
        for key, (name, gpus, drm, render) in scenarios.items():
            if args.only and key != args.only:
                continue
            root = Path(tmp) / name.replace(" ", "_")
            build(root, gpus, drm, render)
            walls = timed(root, args.runs)
            rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss >> 10
            print(
                f"{name}: check --json {min(walls):.1f} s wall (best of {args.runs}), peak RSS so far {rss} MiB"
            )


if __name__ == "__main__":
    main()
