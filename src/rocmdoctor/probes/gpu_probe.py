"""rocmdoctor's GPU probe: run BY PATH with the bundle's own interpreter, never imported.

It needs only the standard library and torch, and prints exactly one JSON document on stdout,
whatever happens (torch missing, no GPU, a runtime error, a GPU that vanishes mid-probe): a failed
stage is named in "error" and the stages before it keep their findings. Anything torch, HIP or
vLLM print while it runs goes to stderr, so stdout carries the document alone.

torch.cuda is the same API on ROCm and CUDA builds of PyTorch, so the probe runs on both.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import traceback
from types import ModuleType
from typing import Any

PROBE_VERSION = 1
GIB = 1 << 30


# Device time spent before timing: enough to load kernels and ramp clocks from idle (burst), and
# enough for power and thermal limits to act (sustained).
BURST_WARMUP_MS = 20.0
SUSTAINED_AFTER_MS = 1000.0

# vLLM's native extensions, by the file name stem they ship under.
VLLM_EXTENSIONS = ("_C", "_rocm_C", "_moe_C")


class StageError(Exception):
    """A finding, not a bug: the stage could not do what it checks."""


def load_memory_rule() -> ModuleType:
    """vLLM's startup memory rule: rocmdoctor/vllm/memory_rule.py itself, loaded by path. This probe runs on the
    bundle's interpreter, where rocmdoctor is not importable; the package ships memory_rule.py (standard
    library only) in vllm/ beside probes/, so the probe and rocmdoctor apply the one copy of the rule."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "vllm", "memory_rule.py")
    problem = f"cannot load vLLM's memory rule from {path}"
    spec = importlib.util.spec_from_file_location("rocmdoctor_memory_rule", path)
    if spec is None or spec.loader is None:
        raise StageError(problem)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (OSError, SyntaxError, ImportError) as exc:
        raise StageError(f"{problem}: {type(exc).__name__}: {exc}") from exc
    return module


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=int, default=0, help="device index measured (default 0)")
    parser.add_argument(
        "--margin-bytes",
        type=int,
        default=None,
        help="bytes kept free below vLLM's rule for the recommended value (default: the rule's 1 GiB)",
    )
    parser.add_argument("--skip-compute", action="store_true", help="no matmul or copy timing")
    parser.add_argument(
        "--skip-allocation", action="store_true", help="do not allocate the recommended share"
    )
    parser.add_argument(
        "--skip-extensions", action="store_true", help="do not import vLLM's native extensions"
    )
    parser.add_argument("--matmul-size", type=int, default=8192, help="square bf16 matmul edge")
    parser.add_argument("--iterations", type=int, default=30, help="timed repetitions per measurement")
    parser.add_argument("--copy-bytes", type=int, default=2 * GIB, help="device-to-device copy size")
    return parser.parse_args(argv)


def base_arch(arch: str) -> str:
    """'gfx942:sramecc+:xnack-' -> 'gfx942' (features after the colon are not the target)."""
    return arch.split(":", 1)[0]


def describe_device(torch, index: int) -> dict:
    props = torch.cuda.get_device_properties(index)
    gcn = getattr(props, "gcnArchName", "") or ""
    info = {
        "index": index,
        "name": torch.cuda.get_device_name(index),
        "total_memory": int(props.total_memory),
        "multiprocessors": int(getattr(props, "multi_processor_count", 0)),
        "is_integrated": bool(getattr(props, "is_integrated", False)),
    }
    if torch.version.hip:
        info["arch"] = base_arch(gcn)
        info["arch_full"] = gcn
    else:
        info["compute_capability"] = f"{props.major}.{props.minor}"
        info["arch"] = f"sm_{props.major}{props.minor}"
    return info


def runtime_stage(torch, report: dict) -> None:
    report["torch"] = {
        "version": torch.__version__,
        "hip": torch.version.hip,
        "cuda": torch.version.cuda,
        "file": torch.__file__,
    }
    report["backend"] = "rocm" if torch.version.hip else ("cuda" if torch.version.cuda else "cpu")
    report["available"] = bool(torch.cuda.is_available())
    report["device_count"] = int(torch.cuda.device_count()) if report["available"] else 0
    if not report["available"] or report["device_count"] == 0:
        raise StageError(
            f"torch {torch.__version__} ({report['backend']} build) sees no GPU: "
            "torch.cuda.is_available() is False"
        )
    report["devices"] = [describe_device(torch, i) for i in range(report["device_count"])]


def memory_stage(
    torch, rule: ModuleType, device: int, margin_bytes: int | None, allocate: bool, report: dict
) -> None:
    if margin_bytes is None:
        margin_bytes = int(rule.DEFAULT_MARGIN_BYTES)
    # A context first, as vLLM has one when it measures: the probe's own share is then already
    # subtracted from free, like vLLM's will be.
    torch.zeros(1, device=f"cuda:{device}")
    torch.cuda.synchronize(device)
    free, total = (int(v) for v in torch.cuda.mem_get_info(device))
    largest = rule.largest_passing(total, free)
    best = rule.recommended(total, free, margin_bytes)
    memory: dict[str, Any] = {
        "device": device,
        "free": free,
        "total": total,
        "largest_passing": largest,
        "recommended": best,
        "margin_bytes": margin_bytes,
        "passes_recommended": rule.passes(total, free, best),
    }
    report["memory"] = memory
    if not allocate or best <= 0:
        return
    size = rule.requested_bytes(total, best)
    allocation: dict[str, Any] = {"bytes": size, "ok": False}
    memory["allocation"] = allocation
    started = time.perf_counter()
    try:
        block = torch.empty(size, dtype=torch.uint8, device=f"cuda:{device}")
        block.fill_(0xA5)  # touch every page: lazily backed memory fails here, not in vLLM later
        torch.cuda.synchronize(device)
    except RuntimeError as exc:  # torch.OutOfMemoryError is a RuntimeError
        allocation["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        torch.cuda.empty_cache()
        return
    allocation["ok"] = True
    allocation["free_while_held"] = int(torch.cuda.mem_get_info(device)[0])
    del block
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    allocation["free_after_release"] = int(torch.cuda.mem_get_info(device)[0])
    allocation["seconds"] = round(time.perf_counter() - started, 3)
    # The caching allocator keeps small blocks; a few MiB short of the start counts as released.
    allocation["released"] = allocation["free_after_release"] >= free - 64 * (1 << 20)


def timed_ms(torch, fn, iterations: int, warmup_ms: float, back_to_back: bool) -> list[float]:
    """Per-iteration device time from CUDA/HIP events, after `warmup_ms` of device time.

    Back to back, the device never idles between iterations and settles at what its power and
    thermal limits allow; otherwise each iteration is waited for, and the short pauses let it run
    at the boost clocks datasheet peaks are quoted for."""
    first = torch.cuda.Event(enable_timing=True)
    first.record()
    started = time.perf_counter()
    done = 0
    while True:
        fn()
        done += 1
        if done % 4 == 0:
            mark = torch.cuda.Event(enable_timing=True)
            mark.record()
            mark.synchronize()
            # The host clock bounds it too, should the events not advance.
            if first.elapsed_time(mark) >= warmup_ms or time.perf_counter() - started > warmup_ms / 100:
                break
    events = [torch.cuda.Event(enable_timing=True) for _ in range(2 * iterations)]
    for i in range(iterations):
        events[2 * i].record()
        fn()
        events[2 * i + 1].record()
        if not back_to_back:
            events[2 * i + 1].synchronize()
    events[-1].synchronize()
    return [events[2 * i].elapsed_time(events[2 * i + 1]) for i in range(iterations)]


def matmul_rates(torch, dev: str, size: int, iterations: int) -> dict:
    # Random operands: zeros run faster than real data on some GPUs and hide nothing.
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    out = torch.empty(size, size, device=dev, dtype=torch.bfloat16)

    def matmul():
        torch.matmul(a, b, out=out)

    def tflops(times: list[float]) -> float:
        return round(2 * size**3 / (statistics.median(times) / 1e3) / 1e12, 2)

    # Bursts, as datasheet peaks are quoted (boost clocks), then the rate once the device has been
    # busy for a second without a pause: power limits show there (an H200 loses about a seventh).
    burst = timed_ms(torch, matmul, iterations, BURST_WARMUP_MS, back_to_back=False)
    sustained = timed_ms(torch, matmul, iterations, SUSTAINED_AFTER_MS, back_to_back=True)
    return {
        "dtype": "bfloat16",
        "n": size,
        "iterations": iterations,
        "median_ms": round(statistics.median(burst), 4),
        "min_ms": round(min(burst), 4),
        "tflops": tflops(burst),
        "sustained_tflops": tflops(sustained),
    }


def copy_bandwidth(torch, dev: str, nbytes: int, iterations: int) -> dict:
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).random_(0, 256)
    dst = torch.empty_like(src)
    times = timed_ms(torch, lambda: dst.copy_(src), iterations, BURST_WARMUP_MS, back_to_back=False)
    if not torch.equal(src[:4096], dst[:4096]) or not torch.equal(src[-4096:], dst[-4096:]):
        raise StageError("device-to-device copy produced wrong data")
    median = statistics.median(times)
    # Bytes read plus bytes written, as memory bandwidth is quoted.
    return {
        "bytes": nbytes,
        "iterations": iterations,
        "median_ms": round(median, 4),
        "gbps": round(2 * nbytes / (median / 1e3) / 1e9, 1),
    }


def compute_stage(torch, device: int, size: int, iterations: int, copy_bytes: int, report: dict) -> None:
    torch.cuda.set_device(device)
    dev = f"cuda:{device}"
    compute: dict = {}
    report["compute"] = compute
    compute["matmul"] = matmul_rates(torch, dev, size, iterations)
    torch.cuda.empty_cache()
    free = int(torch.cuda.mem_get_info(device)[0])
    # Two buffers must fit with room to spare; larger than any cache so HBM/DRAM is what moves.
    compute["copy"] = copy_bandwidth(torch, dev, max(64 << 20, min(copy_bytes, free // 4)), iterations)
    torch.cuda.empty_cache()


def extensions_stage(report: dict) -> None:
    """Import vLLM's native extensions that the bundle ships; absent vLLM is not a finding."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        report["extensions"] = {"vllm": None}
        return
    found = {}
    for location in spec.submodule_search_locations:
        for name in sorted(os.listdir(location)):
            stem = name.split(".", 1)[0]
            if stem in VLLM_EXTENSIONS and name.endswith(".so"):
                found[f"vllm.{stem}"] = os.path.join(location, name)
    results = {}
    for module, path in found.items():
        try:
            importlib.import_module(module)
            results[module] = {"ok": True, "path": path}
        except Exception as exc:
            results[module] = {"ok": False, "path": path, "error": f"{type(exc).__name__}: {exc}"[:500]}
    report["extensions"] = {"vllm": list(spec.submodule_search_locations)[0], "modules": results}


def run(args: argparse.Namespace, report: dict) -> None:
    report["stage"] = "memory rule"
    rule = load_memory_rule()
    report["stage"] = "import torch"
    try:
        import torch
    except Exception as exc:
        raise StageError(f"torch does not import with {sys.executable}: {type(exc).__name__}: {exc}") from exc
    report["stage"] = "runtime"
    runtime_stage(torch, report)
    if not 0 <= args.device < report["device_count"]:
        raise StageError(f"device {args.device} does not exist ({report['device_count']} visible)")
    report["stage"] = "memory"
    memory_stage(torch, rule, args.device, args.margin_bytes, not args.skip_allocation, report)
    if not args.skip_compute:
        report["stage"] = "compute"
        compute_stage(torch, args.device, args.matmul_size, args.iterations, args.copy_bytes, report)
    if not args.skip_extensions:
        report["stage"] = "extensions"
        extensions_stage(report)
    report["stage"] = "done"


def main(argv: list[str]) -> int:
    # Keep the real stdout for the document; everything else printed from here on (by torch, HIP,
    # vLLM's loggers, native code) lands on stderr.
    document_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    started = time.perf_counter()
    report: dict = {
        "probe": "rocmdoctor-gpu",
        "probe_version": PROBE_VERSION,
        "error": None,
        "python": {"executable": sys.executable, "version": platform.python_version()},
    }
    code = 0
    try:
        args = parse_args(argv)
        report["options"] = {
            "device": args.device,
            "margin_bytes": args.margin_bytes,
            "skip_compute": args.skip_compute,
        }
        run(args, report)
    except StageError as exc:
        report["error"] = {"stage": report.get("stage"), "message": str(exc)}
    except SystemExit as exc:  # argparse on bad options
        report["error"] = {"stage": "arguments", "message": f"bad probe arguments (exit {exc.code})"}
        code = 2
    except Exception as exc:
        report["error"] = {
            "stage": report.get("stage"),
            "message": f"{type(exc).__name__}: {exc}"[:2000],
            "traceback": traceback.format_exc(limit=6)[-4000:],
        }
    report["seconds"] = round(time.perf_counter() - started, 3)
    with os.fdopen(document_fd, "w", encoding="utf-8") as out:
        out.write(json.dumps(report, sort_keys=True) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
