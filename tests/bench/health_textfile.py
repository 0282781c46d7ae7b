"""`rocmdoctor check --textfile`: CPU time of one run on this machine, and the file's size on the
partitioned host fixtures and on a 64-partition node. Run: .venv/bin/python tests/bench/health_textfile.py

The 64-partition node is built from the 32-partition MI308X CPX fixture by the rules that fixture
follows (tests/fixtures/hosts/build.py `partition_drm_layout`): partition k of a physical GPU is its
own KFD node at location_id base + k, with render minor base + k (the capture spaces the bases by 8)
and its render node under an amdgpu_xcp.N platform device. Each GPU's partitions 4..7 are copies of
its captured partitions 0..3 (properties, gpu_id, memory bank) at those addresses: 8 per GPU, as an
MI300X in CPX mode has. No value is invented beyond the two addresses the rule gives.
"""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROCMDOCTOR = str(Path(sys.executable).parent / "rocmdoctor")


def run(root: str, out: Path) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [ROCMDOCTOR, "--root", root, "check", "--textfile", str(out)], check=True, capture_output=True
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def sixty_four_partitions(dest: Path) -> Path:
    source = REPO / "tests/fixtures/hosts/mi308x-cpx"
    shutil.copytree(source, dest, symlinks=True)
    nodes_dir = dest / "sys/class/kfd/kfd/topology/nodes"
    gpu_nodes = sorted(
        (
            int(n.name)
            for n in nodes_dir.iterdir()
            if "gfx_target_version 0\n" not in (n / "properties").read_text()
        ),
    )
    next_node = max(int(n.name) for n in nodes_dir.iterdir()) + 1
    next_xcp = len(list((dest / "sys/devices/platform").glob("amdgpu_xcp.*")))
    for node in gpu_nodes:
        props = (nodes_dir / str(node) / "properties").read_text()
        location = int(re.search(r"^location_id (\d+)$", props, re.M).group(1))
        minor = int(re.search(r"^drm_render_minor (\d+)$", props, re.M).group(1))
        new = nodes_dir / str(next_node)
        shutil.copytree(nodes_dir / str(node), new)
        text = re.sub(r"^location_id \d+$", f"location_id {location + 4}", props, flags=re.M)
        text = re.sub(r"^drm_render_minor \d+$", f"drm_render_minor {minor + 4}", text, flags=re.M)
        (new / "properties").write_text(text)
        (dest / f"sys/class/drm/renderD{minor + 4}").mkdir()
        (dest / f"sys/devices/platform/amdgpu_xcp.{next_xcp}").mkdir()
        (dest / f"sys/class/drm/renderD{minor + 4}/device").symlink_to(
            f"../../../devices/platform/amdgpu_xcp.{next_xcp}"
        )
        next_node += 1
        next_xcp += 1
    return dest


def engine_block_bytes() -> int:
    """What one running engine adds to the file: its series as the renderer writes them."""
    from rocmdoctor.rendering.textfile import render
    from rocmdoctor.vllm.health_metrics import EngineHealth, HealthRun, ServerHealth

    def size(engines: list) -> int:
        server = ServerHealth("vllm@63", "http://127.0.0.1:18063", "tiny", True, "ok", engines=engines)
        return len(render(HealthRun("0.1.0", 0.0, 0.0, [], {}, servers=[server])))

    engine = EngineHealth(
        "0",
        "tiny",
        {"rocmdoctor_server_requests_running": 12.0, "rocmdoctor_server_requests_waiting": 3.0,
         "rocmdoctor_server_kv_cache_usage_ratio": 0.8125},
        {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0},
        {"rocmdoctor_server_prompt_tokens": 123456789.0, "rocmdoctor_server_generation_tokens": 98765432.0},
    )  # fmt: skip
    return size([engine]) - size([])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rocmdoctor.prom"
        cpu = sorted(run("/", out) for _ in range(7))
        print(f"this machine (/): CPU per run min {cpu[0]:.3f} s, median {cpu[3]:.3f} s, max {cpu[-1]:.3f} s")
        roots = {
            f: REPO / "tests/fixtures/hosts" / f for f in ("mi308x-cpx", "mi300x-cpx", "strix-halo-clean")
        }
        roots["64 partitions (from mi308x-cpx)"] = sixty_four_partitions(Path(tmp) / "cpx64")
        for name, root in roots.items():
            cpu = sorted(run(str(root), out) for _ in range(5))
            gpus = out.read_text().count("rocmdoctor_gpu_memory_free_bytes{")
            print(f"{name}: {gpus} GPU partitions, {out.stat().st_size} bytes, CPU median {cpu[2]:.3f} s")
        # the same node with one instance per partition (`instances --write`), none of them running
        cpx64 = roots["64 partitions (from mi308x-cpx)"]
        (Path(tmp) / "model").mkdir()
        subprocess.run(
            [ROCMDOCTOR, "--root", str(cpx64), "instances", "--write", "--target", str(cpx64), "--instances", "per-partition",
             "--model", str(Path(tmp) / "model"), "--user", "vllm", "--port", "18000"],
            check=True, capture_output=True,
        )  # fmt: skip
        cpu = sorted(run(str(cpx64), out) for _ in range(3))
        servers = out.read_text().count("rocmdoctor_server_info{")
        print(
            f"64 partitions, {servers} instances written, none running: {out.stat().st_size} bytes, CPU median {cpu[1]:.3f} s"
        )
        print(f"each running instance adds {engine_block_bytes()} bytes (one engine's series)")


if __name__ == "__main__":
    main()
