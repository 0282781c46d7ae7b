#!/usr/bin/env python3
"""Benchmark: what qualification adds to `rocmdoctor install`, against `curl | tar xz`, on a bundle
shaped like the real one: >= 2,000 ELF files (gcc-built libraries and Python extension modules with
real dynamic sections, versioned symbols, RUNPATH $ORIGIN), a symbol-heavy library (20,000 exports),
and six large libraries whose `.hip_fatbin` sections hold >= 3 GB of offload bundles.

    .venv/bin/python tests/bench/qualify_speed.py [--runs 1] [--work /tmp/qualify-bench]

Three timings per run, in alternating order: the baseline, install --skip-qualify, install (which
qualifies). Everything is built under --work and deleted at the end. Prints a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from harness.bundles import BuiltBundle, write_pins  # noqa: E402
from harness.elf_bundle import SP, build_elves, fatbin_for, python_wrapper  # noqa: E402
from harness.release_server import ReleaseServer  # noqa: E402

TAG = "vllm0.0.0-rocm0.0.0-gfx1151"
GROUPS = 1000  # x (extension module + its library) = 2,000 ELF files
BIG_LIBS = 6
BIG_BYTES = 520 << 20  # per big library: 6 x 520 MiB > 3 GB


def _tree(root: Path, work: Path) -> None:
    elves = build_elves(work / "elves")
    for i in range(GROUPS):
        pkg = root / SP / f"pkg{i:04d}"
        (pkg / "ext").mkdir(parents=True)
        (pkg / "torch/lib").mkdir(parents=True)
        (pkg / "ext/_C.abi3.so").write_bytes(elves["ext_good"])
        (pkg / "torch/lib/libprovide.so.1").write_bytes(elves["libprovide.so.1"])
    many = work / "many.c"
    many.write_text("".join(f"int exported_{i}(void) {{ return {i}; }}\n" for i in range(20_000)))
    heavy = root / SP / "torch/lib/libtorch_cpu.so"
    heavy.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-o", str(heavy), str(many)], check=True)
    header = fatbin_for(["gfx1151"])
    for i in range(BIG_LIBS):
        blob = work / "fatbin.bin"
        with open(blob, "wb") as fh:  # one bundle, then code-object-like bytes: 1/3 random, 2/3 zeros
            fh.write(header)
            left = BIG_BYTES
            while left > 0:
                fh.write(os.urandom(1 << 20))
                fh.write(bytes(2 << 20))
                left -= 3 << 20
        lib = root / SP / f"torch/lib/libkernels{i}.so"
        src = work / "k.c"
        src.write_text("int kernels_stub(void) { return 0; }\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
        subprocess.run(
            [
                "objcopy",
                f"--add-section=.hip_fatbin={blob}",
                "--set-section-flags=.hip_fatbin=alloc,readonly",
                str(lib),
            ],
            check=True,
        )
        blob.unlink()
    (root / "bin").mkdir(parents=True, exist_ok=True)
    (root / "bin/vllm-server").write_text("#!/bin/sh\necho stand-in\n")
    (root / "bin/python3").write_bytes(python_wrapper())  # the tree's site-packages first
    (root / SP / "torch/__init__.py").write_text("")  # so the import step has a torch to import
    for name in ("vllm-server", "python3"):
        (root / "bin" / name).chmod(0o755)


def build(work: Path) -> tuple[list[Path], dict]:
    tree = work / "tree"
    _tree(tree, work)
    raw = int(
        subprocess.run(["du", "-sb", str(tree)], capture_output=True, text=True, check=True).stdout.split()[0]
    )
    elf_files = int(
        subprocess.run(
            f"find {tree} -name '*.so*' -type f | wc -l",
            shell=True,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assets = work / "assets"
    assets.mkdir()
    compressor = "pigz -1" if shutil.which("pigz") else "gzip -1"
    part = assets / f"{TAG}-x64.part01-of-01.tar.gz"
    subprocess.run(f"tar -C {tree} -cf - . | {compressor} > {part}", shell=True, check=True)
    shutil.rmtree(tree)
    return [part], {"raw_bytes": raw, "elf_files": elf_files, "part_bytes": part.stat().st_size}


def _timed(command: list[str] | str, **kw) -> float:
    subprocess.run(["sync"], check=True)
    started = time.perf_counter()
    subprocess.run(command, check=True, **kw)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("/tmp/qualify-bench"))
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    try:
        parts, facts = build(args.work)
        built = BuiltBundle(tag=TAG, base=f"{TAG}-x64", out_dir=parts[0].parent, parts=parts)
        dest = args.work / "dest"
        timings: dict[str, list[float]] = {"baseline": [], "skip_qualify": [], "install": []}
        elapsed: list[float] = []  # the qualification's own time, from each install's record
        with ReleaseServer() as server:
            server.add_release("lemonade-sdk/vllm-rocm", TAG, built.release_assets())
            pins = args.work / "pins"
            write_pins(pins, {"gfx1151": built})
            urls = " ".join(f"{server.mirror_url}/{p.name}" for p in parts)
            baseline = f"(for u in {urls}; do curl -sf $u; done) | tar -xzf - -C {dest / 'baseline'}"
            install = [
                sys.executable,
                "-m",
                "rocmdoctor",
                "install",
                "--family",
                "gfx1151",
                "--gfx",
                "gfx1151",
            ]
            install += [
                "--bundles-dir",
                str(pins),
                "--prefix",
                str(dest / "prefix"),
                "--mirror",
                server.mirror_url,
            ]
            order = ["baseline", "skip_qualify", "install"]
            for run in range(args.runs):
                for method in order if run % 2 == 0 else order[::-1]:
                    shutil.rmtree(dest, ignore_errors=True)
                    (dest / "baseline").mkdir(parents=True)
                    if method == "baseline":
                        seconds = _timed(baseline, shell=True)
                    else:
                        extra = ["--skip-qualify"] if method == "skip_qualify" else []
                        seconds = _timed(install + extra + ["--json"], stdout=subprocess.DEVNULL)
                        if method == "install":
                            record = json.loads(
                                (dest / "prefix/current/.rocmdoctor-qualification.json").read_text()
                            )
                            elapsed.append(record["elapsed_s"])
                            facts["qualified"] = record["qualified"]
                    timings[method].append(seconds)
                    print(f"run {run + 1} {method:<13} {seconds:6.2f} s", file=sys.stderr)
        median = {k: round(statistics.median(v), 2) for k, v in timings.items()}
        print(
            json.dumps(
                {
                    "bundle": facts,
                    "runs": args.runs,
                    "timings_s": timings,
                    "median_s": median,
                    "qualification_s": elapsed,
                    "qualification_adds": round(median["install"] / median["skip_qualify"] - 1, 3),
                    "qualification_share": round(statistics.median(elapsed) / median["skip_qualify"], 3),
                    "install_vs_baseline": round(median["install"] / median["baseline"], 3),
                    "loadavg_at_end": os.getloadavg(),
                    "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                }
            )
        )
    finally:
        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
