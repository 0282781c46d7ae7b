#!/usr/bin/env python3
"""Benchmark: `rocmdoctor install` (download, verify every digest, extract, activate) against the
baseline `(curl part1; curl part2) | tar xz`, side by side over loopback, on a bundle shaped like the
real one (>= 1 GB raw, ~50k files, two parts).

    .venv/bin/python tests/bench/install_speed.py [--runs 3] [--sync] [--dest DIR]

The synthetic bundle is cached under $ROCMDOCTOR_TEST_CACHE/install-bench. Prints a table and a JSON
line; docs/performance.md records the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from harness.bundles import write_pins  # noqa: E402 - after the path set-up above
from harness.release_server import ReleaseServer  # noqa: E402

TAG = "vllm0.0.0-rocm0.0.0-gfx1151"
PY_FILES = 49_800
SO_FILES = 200
CACHE = (
    Path(os.environ.get("ROCMDOCTOR_TEST_CACHE", Path.home() / ".cache/rocmdoctor-test")) / "install-bench"
)


def _text_pool(rng: random.Random, size: int) -> bytes:
    words = [
        "def",
        "class",
        "import",
        "return",
        "self",
        "None",
        "True",
        "False",
        "for",
        "in",
        "if",
        "else",
        "elif",
        "while",
        "yield",
        "async",
        "await",
        "torch",
        "tensor",
        "kernel",
        "device",
        "stream",
        "launch",
        "config",
        "module",
        "parameter",
        "weight",
        "bias",
        "shape",
        "dtype",
        "float16",
        "bfloat16",
        "int8",
        "rocm",
        "hip",
        "gfx1151",
        "vllm",
        "engine",
        "scheduler",
        "cache",
        "block",
        "token",
    ]
    out = bytearray()
    while len(out) < size:
        line = " " * rng.choice((0, 4, 8, 12)) + " ".join(
            rng.choice(words) for _ in range(rng.randint(2, 12))
        )
        out += line.encode() + b"\n"
    return bytes(out[:size])


def _tree(root: Path) -> None:
    """~50k small text files (site-packages) + a few hundred large binaries (libraries, .kpack):
    about 1.1 GB raw; the binaries mix random bytes (code) with zero runs (tables, padding)."""
    rng = random.Random(1151)
    pool = _text_pool(rng, 8 << 20)
    sp = root / "lib/python3.13/site-packages"
    for i in range(PY_FILES):
        path = sp / f"pkg{i // 500:03d}" / f"sub{(i // 50) % 10}" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        size = int(rng.lognormvariate(8.3, 0.9))  # median ~4 kB, long tail
        start = rng.randrange(0, len(pool) - min(size, len(pool) - 1))
        path.write_bytes(pool[start : start + size])
    libs = sp / "_rocm_sdk_core/lib"
    libs.mkdir(parents=True, exist_ok=True)
    for i in range(SO_FILES):
        with open(libs / f"librocm_stub{i}.so", "wb") as fh:
            for _ in range(24):  # 24 x 192 kB ~ 4.5 MB per library
                fh.write(os.urandom(128 << 10))
                fh.write(bytes(64 << 10))
    (root / "bin").mkdir(parents=True, exist_ok=True)
    (root / "bin/vllm-server").write_text("#!/bin/sh\necho stand-in\n")
    (root / "bin/python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for name in ("vllm-server", "python3"):
        (root / "bin" / name).chmod(0o755)


def build() -> tuple[list[Path], dict]:
    """The two parts (cached) and facts about them."""
    facts_file = CACHE / "facts.json"
    if facts_file.exists():
        facts = json.loads(facts_file.read_text())
        parts = [CACHE / "assets" / name for name in facts["parts"]]
        if all(p.exists() for p in parts):
            return parts, facts
    shutil.rmtree(CACHE, ignore_errors=True)
    tree = CACHE / "tree"
    print("building the synthetic bundle (once) ...", file=sys.stderr)
    _tree(tree)
    raw = subprocess.run(["du", "-sb", str(tree)], capture_output=True, text=True, check=True).stdout.split()[
        0
    ]
    assets = CACHE / "assets"
    assets.mkdir(parents=True)
    whole = assets / "whole.tar.gz"
    # GNU tar + pigz, like the release workflow's `tar -czf` (pigz only to build faster; gzip where absent)
    compressor = "pigz" if shutil.which("pigz") else "gzip"
    subprocess.run(f"tar -C {tree} -cf - . | {compressor} -6 > {whole}", shell=True, check=True)
    size = whole.stat().st_size
    half = (size + 1) // 2
    base = f"{TAG}-x64"
    names = [f"{base}.part01-of-02.tar.gz", f"{base}.part02-of-02.tar.gz"]
    with open(whole, "rb") as src:
        for name in names:
            with open(assets / name, "wb") as dst:
                dst.write(src.read(half))
    whole.unlink()
    files = int(
        subprocess.run(
            f"find {tree} -type f | wc -l", shell=True, capture_output=True, text=True, check=True
        ).stdout
    )
    shutil.rmtree(tree)
    facts = {
        "raw_bytes": int(raw),
        "files": files,
        "parts": names,
        "part_bytes": [(assets / n).stat().st_size for n in names],
    }
    facts_file.write_text(json.dumps(facts))
    return [assets / n for n in names], facts


def _timed(command: list[str] | str, sync: bool, **kw) -> tuple[float, float]:
    """Wall seconds, and CPU seconds (user + system) of the command and its children: the CPU figure
    stays meaningful when other work shares the machine."""
    subprocess.run(["sync"], check=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, **kw)
    if sync:
        subprocess.run(["sync"], check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--sync", action="store_true", help="include `sync` in each timing (disk-bound figure)"
    )
    parser.add_argument(
        "--install-arg",
        action="append",
        default=[],
        help="extra argument for `rocmdoctor install` (repeat), e.g. --install-arg=--extractor=python",
    )
    parser.add_argument("--dest", type=Path, default=CACHE / "dest", help="where both methods extract")
    args = parser.parse_args()
    parts, facts = build()
    from harness.bundles import BuiltBundle

    built = BuiltBundle(tag=TAG, base=f"{TAG}-x64", out_dir=parts[0].parent, parts=parts)
    rocmdoctor = [sys.executable, "-m", "rocmdoctor"]
    timings: dict[str, list[float]] = {"baseline": [], "rocmdoctor": []}
    cpu: dict[str, list[float]] = {"baseline": [], "rocmdoctor": []}
    with ReleaseServer() as server:
        server.add_release("lemonade-sdk/vllm-rocm", TAG, built.release_assets())
        pins = args.dest.parent / "pins"
        write_pins(pins, {"gfx1151": built})
        urls = " ".join(f"{server.mirror_url}/{p.name}" for p in parts)
        baseline = f"(for u in {urls}; do curl -sf $u; done) | tar -xzf - -C {args.dest / 'baseline'}"
        for run in range(args.runs):
            for method in ("baseline", "rocmdoctor") if run % 2 == 0 else ("rocmdoctor", "baseline"):
                shutil.rmtree(args.dest, ignore_errors=True)
                (args.dest / "baseline").mkdir(parents=True)
                if method == "baseline":
                    seconds, cpu_s = _timed(baseline, args.sync, shell=True)
                else:
                    seconds, cpu_s = _timed(
                        rocmdoctor
                        + [
                            "install",
                            "--family",
                            "gfx1151",
                            "--bundles-dir",
                            str(pins),
                            "--prefix",
                            str(args.dest / "prefix"),
                            "--mirror",
                            server.mirror_url,
                            "--json",
                            *args.install_arg,
                        ],
                        args.sync,
                        stdout=subprocess.DEVNULL,
                    )
                timings[method].append(seconds)
                cpu[method].append(cpu_s)
                print(f"run {run + 1} {method:<10} {seconds:6.2f} s wall {cpu_s:6.2f} s cpu", file=sys.stderr)
    shutil.rmtree(args.dest, ignore_errors=True)
    base_median = statistics.median(timings["baseline"])
    ours_median = statistics.median(timings["rocmdoctor"])
    result = {
        "install_args": args.install_arg,
        "bundle": facts,
        "runs": args.runs,
        "sync": args.sync,
        "dest": str(args.dest),
        "timings_s": timings,
        "cpu_s": cpu,
        "loadavg_at_end": os.getloadavg(),
        "median_s": {"baseline": round(base_median, 2), "rocmdoctor": round(ours_median, 2)},
        "ratio": round(ours_median / base_median, 3),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
            "pigz": bool(shutil.which("pigz")),
        },
    }
    print(
        f"baseline median {base_median:.2f} s, rocmdoctor median {ours_median:.2f} s, "
        f"ratio {result['ratio']:.3f}",
        file=sys.stderr,
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
