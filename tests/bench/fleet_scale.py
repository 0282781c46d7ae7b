"""Benchmark (not a test): converge 10 fake hosts vs 1 host with playbooks/site.yml, same run.

Phases measured: preflight and bundle (`--tags preflight,bundle`): wheelhouse built on the controller,
rocmdoctor installed on every host with no index, `rocmdoctor check` against a private copy of the
strix-halo-clean fixture, the test bundle fetched once on the controller, delivered and installed
on every host. The service and smoke phases start one vLLM engine per host, which 2 cores cannot
run ten of. Each size starts cold (fresh hosts, fresh controller cache) and then runs once more warm.

    .venv/bin/python tests/bench/fleet_scale.py [--hosts 10] [--forks 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.bundles import REPO, vllm_test_bundle, write_pins
from harness.fleet import SshFleet, host_root, run_playbook
from harness.release_server import ReleaseServer

FAMILY, TAG = "gfx1151", "vllm0.32.0-rocm7.0.0-gfx1151"


def converge(size: int, forks: int, pins: Path, workdir: Path) -> tuple[float, float]:
    with SshFleet(f"fleet-b{size}", workdir) as fleet:
        for i in range(size):
            host = fleet.add(f"node{i:02d}", rocmdoctor_root="/opt/host-root")
            host_root("strix-halo-clean", host.opt / "host-root")
        inventory = fleet.write_inventory(
            workdir / "inventory.yml",
            group_vars={
                "rocmdoctor_controller_cache": str(workdir / "controller-cache"),
                "rocmdoctor_bundles_dir": str(pins),
            },
        )
        times = []
        for _ in range(2):
            run = run_playbook(fleet, inventory, "--tags", "preflight,bundle", "--forks", str(forks))
            recap = run.recap()
            bad = {h: r for h, r in recap.items() if r["failed"] or r["unreachable"]}
            if run.rc != 0 or len(recap) != size or bad:
                sys.exit(f"{size} hosts: run failed (rc {run.rc}, {bad}):\n{run.stdout[-3000:]}")
            times.append(run.seconds)
        return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--forks", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp, ReleaseServer() as server:
        base = Path(tmp)
        built = vllm_test_bundle(base / "upstream", FAMILY, TAG)
        server.add_release(REPO, built.tag, built.release_assets())
        write_pins(base / "pins", {FAMILY: built}, base_url=server.mirror_url)
        one = converge(1, args.forks, base / "pins", base / "one")
        many = converge(args.hosts, args.forks, base / "pins", base / "many")
    print(f"forks={args.forks}")
    print(f"1 host:  cold {one[0]:.1f} s, warm {one[1]:.1f} s")
    print(f"{args.hosts} hosts: cold {many[0]:.1f} s, warm {many[1]:.1f} s")
    print(f"ratio {args.hosts}/1: cold {many[0] / one[0]:.2f}x, warm {many[1] / one[1]:.2f}x")


if __name__ == "__main__":
    main()
