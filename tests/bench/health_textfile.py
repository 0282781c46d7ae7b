"""`rocmdoctor check --textfile`: CPU time of one run on this machine, and the file's size on the
partitioned host fixtures. Run: .venv/bin/python tests/bench/health_textfile.py"""

from __future__ import annotations

import resource
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


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rocmdoctor.prom"
        cpu = sorted(run("/", out) for _ in range(7))
        print(f"this machine (/): CPU per run min {cpu[0]:.3f} s, median {cpu[3]:.3f} s, max {cpu[-1]:.3f} s")
        for fixture in ("mi308x-cpx", "mi300x-cpx", "strix-halo-clean"):
            cpu = sorted(run(str(REPO / "tests/fixtures/hosts" / fixture), out) for _ in range(5))
            print(f"{fixture}: {out.stat().st_size} bytes, CPU median {cpu[2]:.3f} s")


if __name__ == "__main__":
    main()
