"""Interpreters for `check --deep` tests: a stand-in ROCm torch on an AMD GPU, and broken ones.

The probe itself always runs for real (by path, with the interpreter rocmdoctor is given); what is
faked is only what cannot exist here: a ROCm build of torch with an AMD GPU under it
(tests/harness/fake_torch, driven by a JSON description), or an interpreter that hangs, crashes or
prints garbage.
"""

from __future__ import annotations

import json
import shlex
import stat
import sys
from pathlib import Path

FAKE_TORCH = Path(__file__).resolve().parent / "fake_torch"
GIB = 1 << 30

# A Strix Halo APU as ROCm torch reports it. total_memory: the captured mem_info_gtt_total of a
# 128 GB Beelink GTR9 Pro (tests/fixtures/deep/SOURCES.md); 40 CUs.
STRIX_HALO = {
    "name": "AMD Radeon 8060S Graphics",
    "gcnArchName": "gfx1151",
    "total_memory": 137438953472,
    "multi_processor_count": 40,
    "is_integrated": True,
    "major": 11,
    "minor": 5,
}
RX_7900_XTX_NAME = "AMD Radeon RX 7900 XTX"


def matmul_ms(tflops: float, n: int = 8192) -> float:
    """Device time of one n x n x n matmul at `tflops` (what the fake's events report)."""
    return 2 * n**3 / (tflops * 1e12) * 1e3


def copy_ms(gbps: float, nbytes: int = 2 * GIB) -> float:
    return 2 * nbytes / (gbps * 1e9) * 1e3


def rocm_gpu(
    device: dict | None = None, *, free: int, tflops: float = 45.0, gbps: float = 210.0, **faults
) -> dict:
    """The fake torch's description of one device (None: a ROCm torch that sees no GPU)."""
    return {
        "torch_version": "2.9.1+rocm7.1.0",
        "hip": "7.1.25424",
        "cuda": None,
        "devices": [device] if device else [],
        "free": free,
        "matmul_ms": matmul_ms(tflops),
        "copy_ms": copy_ms(gbps),
        **faults,
    }


def write_executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def fake_rocm_python(directory: Path, gpu: dict) -> Path:
    """An interpreter whose torch is the stand-in, as a bundle's launcher script would set it up.

    Each start appends a line to runs.txt and the environment it was given to env-<n>.json."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "gpu.json").write_text(json.dumps(gpu))
    return write_executable(
        directory / "python3",
        f"""#!/bin/sh
echo run >> {shlex.quote(str(directory / "runs.txt"))}
{shlex.quote(sys.executable)} -c \\
    'import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], "w"))' \\
    {shlex.quote(str(directory))}/env-$(wc -l < {shlex.quote(str(directory / "runs.txt"))} | tr -d ' ').json
export PYTHONPATH={shlex.quote(str(FAKE_TORCH))} FAKE_TORCH_GPU={shlex.quote(str(directory / "gpu.json"))}
exec {shlex.quote(sys.executable)} "$@"
""",
    )


def shell_python(directory: Path, body: str) -> Path:
    """An 'interpreter' that is a shell script: for hangs, crashes and garbage output."""
    directory.mkdir(parents=True, exist_ok=True)
    return write_executable(directory / "python3", "#!/bin/sh\n" + body + "\n")
