"""Deep checks (`check --deep`): the GPU as the bundle's own PyTorch sees it.

Static checks read what the kernel says; whether vLLM starts is decided by what HIP says. One run
of the probe (src/rocmdoctor/probes/gpu_probe.py, started with the bundle's interpreter and the
environment `serve` uses) feeds all three checks; a probe that cannot start, hangs, crashes or
prints no report ends in gpu.runtime, and the other two skip behind it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from rocmdoctor.checks import check, facts
from rocmdoctor.facts.deep_probe import probe_environment, probe_path
from rocmdoctor.model import Probe, Result, Severity, Status, failed, passed, skipped, warned
from rocmdoctor.registry import Context
from rocmdoctor.vllm.memory_rule import (
    DEFAULT_MARGIN_BYTES,
    MIN_USEFUL_UTILIZATION,
    largest_passing,
    passes,
    recommended,
)

PROBE_MARKER = "rocmdoctor-gpu"
GIB = 1 << 30
# vLLM's own default --gpu-memory-utilization (vllm/config/cache.py, 0.32 and 0.33).
VLLM_DEFAULT_UTILIZATION = 0.92
# Below this share of the datasheet peak the device is not performing as it should.
PEAK_SHARE_WARN = 0.60
# A few MiB that the caching allocator keeps count as released.
RELEASE_SLACK = 64 << 20
GPU_FAULT_REMEDY = "Look at `sudo dmesg` for GPU resets or page faults, then rerun `rocmdoctor check --deep`."
VISIBILITY_VARIABLES = (
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "HSA_OVERRIDE_GFX_VERSION",
)


@dataclass(frozen=True)
class Peak:
    """Dense (no sparsity) bf16 matrix rate and memory bandwidth from the vendor's datasheet."""

    label: str
    bf16_tflops: float
    memory_gbps: float
    name: str = ""  # regex on the runtime's device name
    arch: str = ""  # gfx target, for APUs whose runtime name is generic


# Sources, datasheet dense bf16 / memory bandwidth:
# - AMD Instinct MI300X data sheet: 1307.4 TFLOP/s, 5.3 TB/s HBM3.
# - AMD Instinct MI355X data sheet: 2.5 PFLOP/s (5.0 with sparsity), 8 TB/s HBM3E.
# - AMD Radeon RX 7900 XTX specifications: 122.8 TFLOP/s fp16/bf16 (96 CU x 512 FLOP/clk x 2.5 GHz),
#   960 GB/s GDDR6.
# - AMD Radeon AI PRO R9700 specifications: 191 TFLOP/s fp16/bf16 dense (383 with sparsity;
#   64 CU x 1024 FLOP/clk x 2.92 GHz), 640 GB/s GDDR6 (20 Gbps, 256-bit).
# - Strix Halo, Radeon 8060S (gfx1151): 40 CU x 512 FLOP/clk (RDNA 3.5 WMMA, as RDNA 3) x 2.9 GHz
#   = 59.4 TFLOP/s; LPDDR5X-8000 on 256 bits = 256 GB/s. The smaller gfx1151 parts (8050S, 32 CU)
#   measure lower against this.
# - NVIDIA H100 Tensor Core GPU data sheet: SXM 989.4 TFLOP/s (1979 with sparsity), 3.35 TB/s;
#   PCIe 756 TFLOP/s, 2.0 TB/s; NVL 835 TFLOP/s, 3.9 TB/s.
# - NVIDIA H200 Tensor Core GPU data sheet: SXM 989.4 TFLOP/s, 4.8 TB/s; NVL 835 TFLOP/s, 4.8 TB/s.
# First match wins: the more specific names come first.
PEAKS = (
    Peak("AMD Instinct MI300X", 1307.4, 5300, name=r"MI300X"),
    Peak("AMD Instinct MI355X", 2516.6, 8000, name=r"MI355X"),
    Peak("AMD Radeon RX 7900 XTX", 122.8, 960, name=r"7900 XTX"),
    Peak("AMD Radeon AI PRO R9700", 191.0, 640, name=r"R9700"),
    Peak("AMD Radeon 8060S (gfx1151)", 59.4, 256, arch="gfx1151"),
    Peak("NVIDIA H100 PCIe", 756.0, 2000, name=r"H100.*PCIe"),
    Peak("NVIDIA H100 NVL", 835.0, 3900, name=r"H100.*NVL"),
    Peak("NVIDIA H100 SXM", 989.4, 3350, name=r"H100"),
    Peak("NVIDIA H200 NVL", 835.0, 4800, name=r"H200.*NVL"),
    Peak("NVIDIA H200 SXM", 989.4, 4800, name=r"H200"),
)


def find_peak(name: str, arch: str) -> Peak | None:
    for peak in PEAKS:
        if peak.name and re.search(peak.name, name):
            return peak
        if peak.arch and peak.arch == arch:
            return peak
    return None


@dataclass(frozen=True)
class ProbeRun:
    """One probe run: its report, or why there is none (`problem`, which ends in an error)."""

    argv: tuple[str, ...]
    report: dict[str, Any] = field(default_factory=dict)
    problem: str = ""
    remedy: str = ""
    missing_interpreter: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def error(self) -> dict[str, Any]:
        return self.report.get("error") or {}

    @property
    def failed_stage(self) -> str:
        return str(self.error.get("stage") or "")


def interpreter(ctx: Context) -> str:
    return ctx.options.python or f"{ctx.options.prefix.rstrip('/')}/current/bin/python3"


def tail(text: str, lines: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])[-1500:]


def run_probe(ctx: Context) -> ProbeRun:
    """The probe, once per check run; the three checks read the same report."""

    def run() -> ProbeRun:
        python = interpreter(ctx)
        argv = [python, probe_path(), "--margin-bytes", str(DEFAULT_MARGIN_BYTES)]
        timeout = ctx.options.deep_timeout_s
        res = ctx.host.run(
            argv,
            timeout=timeout,
            env=probe_environment(ctx.host.env),
            program_is_users_choice=ctx.options.python is not None,
        )
        details = {
            "argv": argv,
            "seconds": round(res.duration_s, 2),
            "exit_code": res.returncode,
            "stderr_tail": tail(res.stderr),
        }
        if res.spawn_error:
            return ProbeRun(
                tuple(argv),
                problem=f"cannot start {python}: {res.spawn_error}",
                remedy="Install a bundle (`rocmdoctor install`) or point --python at the "
                "bundle's interpreter (on a replayed --root, only --python runs).",
                missing_interpreter=True,
                details=details,
            )
        if res.timed_out:
            return ProbeRun(
                tuple(argv),
                problem=f"the GPU probe did not finish within {timeout:g} s and was "
                "killed: the GPU runtime hangs",
                remedy="Look at `sudo dmesg` for amdgpu/KFD errors (a hung GPU needs a reboot), "
                "and stop whatever else is using the GPU.",
                details=details,
            )
        report = parse_report(res.stdout)
        if report is None:
            how = (
                f"was killed by signal {-res.returncode}"
                if res.returncode is not None and res.returncode < 0
                else f"exited with status {res.returncode}"
            )
            return ProbeRun(
                tuple(argv),
                problem=f"the GPU probe {how} without a report: "
                f"{tail(res.stderr, 1) or tail(res.stdout, 1) or 'no output'}",
                remedy=f"Run the probe by hand to see the whole error: {python} {probe_path()}",
                details=details,
            )
        return ProbeRun(tuple(argv), report=report, details=details)

    return ctx.memo("deep.probe", run)


def parse_report(stdout: str) -> dict[str, Any] | None:
    """The probe's one JSON document, or None for anything else (garbage, truncation, a crash)."""
    from rocmdoctor import documents  # msgspec: only --deep parses a report (not the plain check's path)

    try:
        report = documents.load_value(
            stdout.encode("utf-8", errors="replace"), "the probe's report", 16 << 20
        )
    except documents.DocumentError:
        return None
    if not isinstance(report, dict) or report.get("probe") != PROBE_MARKER:
        return None
    return report


def describe(device: dict[str, Any]) -> str:
    cc = f", compute capability {device['compute_capability']}" if "compute_capability" in device else ""
    return f"{device.get('name', '?')} ({device.get('arch', '?')}{cc})"


def runtime_remedy(report: dict[str, Any], static_gfx: list[str]) -> str:
    backend = report.get("backend")
    if backend == "cuda" and static_gfx:
        return (
            "This interpreter's torch is a CUDA build: point --python at the vllm-rocm bundle's interpreter."
        )
    if backend == "cpu":
        return "This interpreter's torch is CPU-only: point --python at the vllm-rocm bundle's interpreter."
    return (
        "Fix what the static checks report (driver.loaded, access.devices: the user needs the render "
        "and video groups), and do not hide the GPU with HIP_VISIBLE_DEVICES/ROCR_VISIBLE_DEVICES."
    )


def visibility(ctx: Context) -> dict[str, str]:
    env = ctx.host.env
    return {name: env[name] for name in VISIBILITY_VARIABLES if name in env}


@check(
    "gpu.runtime",
    "The bundle's PyTorch sees the GPU",
    reads=facts.GPU_READS,
    env=VISIBILITY_VARIABLES,
    probe=Probe.GPU,
    default_enabled=False,
)
def gpu_runtime(ctx: Context) -> Result:
    run = run_probe(ctx)
    static_gfx = sorted({gpu.gfx for gpu in facts.gpus(ctx)})
    details: dict[str, Any] = {**run.details, "static_gfx": static_gfx, "environment": visibility(ctx)}
    if run.problem:
        if run.missing_interpreter:
            return failed(run.problem, run.remedy, **details)
        return Result(Status.ERROR, run.problem, run.remedy, details)
    report = run.report
    details.update(
        torch=report.get("torch"),
        backend=report.get("backend"),
        devices=report.get("devices", []),
        extensions=report.get("extensions"),
        probe_error=report.get("error"),
    )
    if run.failed_stage == "arguments":  # rocmdoctor and its probe disagree: a bug of ours, not the host's
        return Result(
            Status.ERROR, f"the GPU probe refused its arguments: {run.error.get('message')}", details=details
        )
    if run.failed_stage == "memory rule":  # the probe's copy of rocmdoctor is incomplete: ours too
        return Result(
            Status.ERROR,
            f"the GPU probe is incomplete: {run.error.get('message')}",
            "Reinstall rocmdoctor: the probe loads memory_rule.py from the installed package.",
            details,
        )
    if run.failed_stage in ("import torch", "runtime"):
        remedy = (
            "Reinstall the bundle (`rocmdoctor install`): its torch must import with PYTHONNOUSERSITE=1 "
            "and no PYTHONPATH."
            if run.failed_stage == "import torch"
            else runtime_remedy(report, static_gfx)
        )
        return failed(run.error.get("message", "the probe failed"), remedy, **details)
    devices = report.get("devices") or []
    seen = ", ".join(describe(d) for d in devices)
    torch = (report.get("torch") or {}).get("version", "?")
    summary = f"torch {torch} sees {len(devices)} GPU{'s' if len(devices) != 1 else ''}: {seen}"
    if not static_gfx:
        comparison = "no AMD GPU in the KFD topology to compare the arch with"
    elif report.get("backend") != "rocm":
        return failed(
            f"{summary}, but this host's GPUs are AMD ({', '.join(static_gfx)})",
            runtime_remedy(report, static_gfx),
            **details,
        )
    else:
        runtime_gfx = sorted({d.get("arch", "") for d in devices})
        strangers = [arch for arch in runtime_gfx if arch not in static_gfx]
        if strangers:
            return failed(
                f"{summary}; the kernel's KFD topology has {', '.join(static_gfx)}",
                "Unset HSA_OVERRIDE_GFX_VERSION (it makes HIP report another target) and install the "
                "bundle built for this GPU (`rocmdoctor install`).",
                **details,
            )
        comparison = f"arch matches KFD ({', '.join(static_gfx)})"
    broken = {
        m: r for m, r in ((report.get("extensions") or {}).get("modules") or {}).items() if not r.get("ok")
    }
    if broken:
        module, result = next(iter(broken.items()))
        return failed(
            f"vLLM's native extension {module} does not load: {result.get('error', '?')}",
            "The bundle's vLLM and torch do not match (ABI): reinstall it with `rocmdoctor install`.",
            **details,
        )
    loaded = sorted((report.get("extensions") or {}).get("modules") or {})
    extensions = f"; {', '.join(loaded)} load" if loaded else ""
    if run.failed_stage == "extensions":
        return failed(
            f"{summary}; importing vLLM's extensions broke: {run.error.get('message')}",
            "Reinstall the bundle (`rocmdoctor install`).",
            **details,
        )
    if static_gfx and report.get("backend") == "rocm" and len(devices) < len(facts.gpus(ctx)):
        return warned(
            f"{summary}; the KFD topology has {len(facts.gpus(ctx))}",
            "Check HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES and that the user can open every "
            "/dev/dri/renderD* node.",
            **details,
        )
    return passed(f"{summary}; {comparison}{extensions}", **details)


def stopped_before(
    run: ProbeRun, stage: str, order: tuple[str, ...] = ("memory", "compute", "extensions")
) -> bool:
    """True when the probe broke in a stage that runs before `stage`."""
    failed_at = run.failed_stage
    return failed_at in order and order.index(failed_at) < order.index(stage)


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


@check(
    "gpu.memory_fit",
    "vLLM's memory rule passes with the runtime's free memory",
    depends=("gpu.runtime",),
    reads=(*facts.GPU_READS, *facts.MEMINFO_READS),
    probe=Probe.GPU,
    default_enabled=False,
)
def gpu_memory_fit(ctx: Context) -> Result:
    run = run_probe(ctx)
    memory = run.report.get("memory") or {}
    if run.failed_stage == "memory":
        return failed(
            f"the GPU stopped answering while its memory was measured: {run.error.get('message')}",
            GPU_FAULT_REMEDY,
            probe_error=run.error,
            memory=memory,
        )
    free, total = int(memory["free"]), int(memory["total"])
    largest, best = largest_passing(total, free), recommended(total, free)
    details = {
        "device": memory.get("device", 0),
        "free": free,
        "total": total,
        "largest_passing": largest,
        "recommended": best,
        "margin_bytes": DEFAULT_MARGIN_BYTES,
        "vllm_default_passes": passes(total, free, VLLM_DEFAULT_UTILIZATION),
        "probe_largest_passing": memory.get("largest_passing"),
        "probe_recommended": memory.get("recommended"),
        "allocation": memory.get("allocation"),
    }
    gpus = facts.gpus(ctx)
    if gpus:
        static_total, static_free = facts.usable_memory(ctx, gpus[0])
        details.update(static_total=static_total, static_free=static_free)
    where = f"{gib(free)} of {gib(total)} free"
    if best < MIN_USEFUL_UTILIZATION:
        return failed(
            f"only {where}: vLLM's rule passes up to {largest:.2f}, {best:.2f} with the "
            f"{gib(DEFAULT_MARGIN_BYTES)} margin, too little to serve a model",
            "Stop what holds GPU memory (see processes.orphans; `amd-smi process` lists them) "
            "before starting vLLM.",
            **details,
        )
    allocation = memory.get("allocation") or {}
    if not allocation.get("ok"):
        reason = allocation.get("error") or run.error.get("message") or "not attempted"
        return failed(
            f"vLLM's rule passes up to {largest:.2f} ({where}), but allocating the {best:.2f} share "
            f"({gib(allocation.get('bytes', 0))}) failed: {reason}",
            "The runtime reports memory it cannot hand out: on APUs raise ttm.pages_limit (see "
            "memory.ttm), otherwise pass a lower --gpu-memory-utilization.",
            **details,
        )
    summary = (
        f"vLLM's rule passes up to {largest:.2f} right now ({where}); serve would use {best:.2f}, "
        f"and {gib(allocation['bytes'])} were allocated"
    )
    if not allocation.get("released"):
        lost = free - int(allocation.get("free_after_release", 0))
        return warned(
            f"{summary}, but {gib(lost)} did not come back after release",
            "Another process took GPU memory meanwhile, or the driver leaks: rerun, and look at "
            "`sudo dmesg`.",
            **details,
        )
    return passed(f"{summary} and released", **details)


# Its own figures come from the probe; the declared reads keep the GPU's static identity beside them
# in a snapshot.
@check(
    "gpu.compute",
    "The GPU reaches its expected matrix and memory speed",
    severity=Severity.ADVISORY,
    depends=("gpu.runtime",),
    reads=facts.GPU_READS,
    probe=Probe.GPU,
    default_enabled=False,
)
def gpu_compute(ctx: Context) -> Result:
    run = run_probe(ctx)
    if stopped_before(run, "compute"):
        return skipped(
            f"not measured: the probe stopped in the {run.failed_stage} stage (see gpu.memory_fit)",
            probe_error=run.error,
        )
    compute = run.report.get("compute") or {}
    if run.failed_stage == "compute" or "copy" not in compute:
        return failed(
            f"the GPU broke while it was measured: {run.error.get('message', 'no measurement')}",
            GPU_FAULT_REMEDY,
            probe_error=run.error,
            **compute,
        )
    device: dict[str, Any] = next(
        (d for d in run.report.get("devices", []) if d.get("index") == run.report["memory"]["device"]), {}
    )
    tflops, gbps = float(compute["matmul"]["tflops"]), float(compute["copy"]["gbps"])
    sustained = compute["matmul"].get("sustained_tflops")
    measured = (
        f"bf16 matmul {tflops:.1f} TFLOP/s"
        + (f" ({sustained:.0f} sustained)" if sustained else "")
        + f", device copy {gbps:.0f} GB/s"
    )
    details: dict[str, Any] = {"device": device.get("name"), "arch": device.get("arch"), **compute}
    peak = find_peak(str(device.get("name", "")), str(device.get("arch", "")))
    if peak is None:
        return passed(f"{measured} on {describe(device)}; no reference peak for this device", **details)
    shares = {"matmul": tflops / peak.bf16_tflops, "copy": gbps / peak.memory_gbps}
    details.update(
        peak=peak.label,
        peak_bf16_tflops=peak.bf16_tflops,
        peak_memory_gbps=peak.memory_gbps,
        share_of_peak={k: round(v, 3) for k, v in shares.items()},
    )
    versus = (
        f"{measured}: {shares['matmul']:.0%} and {shares['copy']:.0%} of the {peak.label} peaks "
        f"({peak.bf16_tflops:g} TFLOP/s, {peak.memory_gbps:g} GB/s)"
    )
    if min(shares.values()) < PEAK_SHARE_WARN:
        return warned(
            versus,
            "Look for throttling or a capped power profile (`amd-smi metric`, `rocm-smi`, "
            "`nvidia-smi -q -d PERFORMANCE`) and other work on the GPU.",
            **details,
        )
    return passed(versus, **details)
