"""GPU memory: what vLLM will see and the --gpu-memory-utilization that starts; TTM limits on APUs."""

from __future__ import annotations

from typing import Any

from rocmdoctor.checks import check
from rocmdoctor.checks.facts import (
    DISTRO_READS,
    GPU_READS,
    MEMINFO,
    MEMINFO_READS,
    OSRELEASE,
    GpuNode,
    distro_info,
    gpu_identity,
    gpu_label,
    gpus,
    kernel_release,
    meminfo,
    memory_pool,
    not_served,
    partition_of,
    serving_gpus,
    usable_memory,
)
from rocmdoctor.checks.kernel_guidance import distro_family, initramfs_command
from rocmdoctor.checks.memory_guidance import carveout_advice
from rocmdoctor.facts import next_boot
from rocmdoctor.facts.remedies import fixable
from rocmdoctor.model import Result, Severity, failed, passed, skipped, warned
from rocmdoctor.registry import Context
from rocmdoctor.vllm.memory_rule import MIN_USEFUL_UTILIZATION, recommended

GIB = 1 << 30
PAGES_PER_GIB = 262144  # 4 KiB pages
TTM_LIMITS = {
    "ttm": "/sys/module/ttm/parameters/pages_limit",
    "amdttm": "/sys/module/amdttm/parameters/pages_limit",
}
# The kernel's default TTM limit is half of RAM; anything this low is that default.
DEFAULT_TTM_FRACTION = 0.6
OS_RESERVE_GIB = 4
VLLM_DEFAULT_UTILIZATION = 0.92


def gib(value: int | None) -> str:
    return "?" if value is None else f"{value / GIB:.1f} GiB"


def unread_paths(ctx: Context, gpu: GpuNode) -> list[str]:
    """The files whose absence leaves this GPU's pool (VRAM, or an APU's GTT) unknown."""
    if memory_pool(gpu) == "gtt":
        paths = [p for p in gpu.memory_unread if "gtt" in p or p.endswith("mem_info_*")]
        if "MemAvailable" not in meminfo(ctx):
            paths.append(f"{MEMINFO} (MemAvailable)")
        return paths
    return [p for p in gpu.memory_unread if "gtt" not in p]


def gpu_pool(ctx: Context, gpu: GpuNode) -> dict[str, Any]:
    total, free = usable_memory(ctx, gpu)
    part = partition_of(ctx, gpu)
    row: dict[str, Any] = {
        "node": gpu.node,
        "gfx": gpu.gfx,
        "identity": gpu_identity(ctx, gpu),
        "pool": memory_pool(gpu),
        "total_bytes": total,
        "free_bytes": free,
        "vram_total": gpu.vram_total,
        "vram_used": gpu.vram_used,
        "gtt_total": gpu.gtt_total,
        "gtt_used": gpu.gtt_used,
    }
    if gpu.apu:
        row["mem_available"] = meminfo(ctx).get("MemAvailable")
    if part is not None:
        phys, index = part
        row["partition"] = {
            "physical_gpu": phys.pci_slot,
            "index": index,
            "of": len(phys.nodes),
            "mode": phys.compute_partition,
        }
    row["recommended"] = recommended(total, free) if total and free is not None else None
    unread = unread_paths(ctx, gpu)
    if row["recommended"] is None or unread:
        row["unread"] = unread
    if gpu.apu and gpu.gtt_used is None and free is not None:
        # GTT pages come out of RAM, so MemAvailable bounds what is free; without mem_info_gtt_used
        # that bound is all there is, and the row says so.
        row["free_basis"] = "MemAvailable (GTT use unreadable)"
    return row


def describe(row: dict[str, Any]) -> str:
    part = row.get("partition")
    ident = row.get("identity") or {}
    where = f"node {row['node']} {row['gfx']}"
    if ident.get("pci_slot") and not part:
        where += f" at {ident['pci_slot']}"
    if part:
        mode = f"{part['mode']} " if part["mode"] else ""
        where += f" ({mode}partition {part['index'] + 1} of {part['of']} of GPU {part['physical_gpu']})"
    return where


@check(
    "memory.gpu",
    "GPU memory and the --gpu-memory-utilization that starts",
    depends=("gpu.arch",),
    reads=(*GPU_READS, *MEMINFO_READS),
)
def memory_gpu(ctx: Context) -> Result:
    # vLLM runs on the GPUs gpu_choice picks (a supported dGPU before an iGPU beside it), the same ones
    # memory.ttm, kernel.cwsr, the capacity section and the unit's pin judge.
    rows = [gpu_pool(ctx, g) for g in serving_gpus(ctx)]
    skipped_gpus = not_served(ctx)
    unknown = [r for r in rows if r["recommended"] is None]
    if unknown:
        r = unknown[0]
        what = "GTT size and use (and MemAvailable)" if r["pool"] == "gtt" else "VRAM size and use"
        missing = ", ".join(r["unread"][:3]) or "the memory files"
        more = f" (and {len(unknown) - 1} more GPU node(s))" if len(unknown) > 1 else ""
        return warned(
            f"cannot read the {what} of {describe(r)}{more}: cannot read {missing}",
            "Load amdgpu with its sysfs (check /sys/class/drm/renderD*/device/mem_info_* and the KFD "
            "memory banks under /sys/class/kfd/kfd/topology/nodes/*/mem_banks); until then start vLLM "
            "with a conservative --gpu-memory-utilization.",
            gpus=rows,
            not_served=skipped_gpus,
            recommended_gpu_memory_utilization=None,
        )
    worst = min(rows, key=lambda r: r["recommended"])
    details = {
        "gpus": rows,
        "recommended_gpu_memory_utilization": worst["recommended"],
        "total_bytes": worst["total_bytes"],
        "free_bytes": worst["free_bytes"],
        "pool": worst["pool"],
        "not_served": skipped_gpus,
    }
    where = f"{describe(worst)} {worst['pool'].upper()}"
    usage = f"{gib(worst['free_bytes'])} free of {gib(worst['total_bytes'])} ({where})"
    if worst["recommended"] < MIN_USEFUL_UTILIZATION:
        return failed(
            f"only {usage}: no --gpu-memory-utilization leaves room for a model",
            "Free GPU memory first (see processes.orphans; stop other GPU users)"
            + ("; on an APU raise ttm.pages_limit (memory.ttm)" if worst["pool"] == "gtt" else "")
            + ".",
            **details,
        )
    note = (
        ""
        if worst["recommended"] >= VLLM_DEFAULT_UTILIZATION
        else f"; vLLM's default {VLLM_DEFAULT_UTILIZATION} would not start"
    )
    return passed(f"{usage}: use --gpu-memory-utilization {worst['recommended']:.2f}{note}", **details)


def ttm_limits(ctx: Context) -> dict[str, int]:
    found = {}
    for name, path in TTM_LIMITS.items():
        raw = ctx.host.read_int(path)
        if raw.ok and raw.value > 0:
            found[name] = raw.value
    return found


def ttm_setting(pages: int, names: list[str]) -> str:
    options = " ".join(f"{n}.pages_limit={pages}" for n in names)
    files = "; ".join(f"`options {n} pages_limit={pages}` in /etc/modprobe.d/{n}.conf" for n in names)
    return f"{options} on the kernel command line (or {files}), then reboot"


@check(
    "memory.ttm",
    "APU: TTM limit lets the GPU reach most of RAM",
    severity=Severity.DEGRADING,
    depends=("gpu.arch",),
    reads=(
        *GPU_READS,
        *MEMINFO_READS,
        *TTM_LIMITS.values(),
        "/sys/module/amdttm",
        *next_boot.READS,
        OSRELEASE,
        *DISTRO_READS,
    ),
)
def memory_ttm(ctx: Context) -> Result:
    nodes = gpus(ctx)
    if not any(g.apu for g in serving_gpus(ctx)):
        if any(g.apu for g in nodes):
            served = ", ".join(gpu_label(ctx, g) for g in serving_gpus(ctx))
            return skipped(
                f"the GPU vLLM will use, {served}, is not an APU: the TTM limit only bounds unified memory",
                gpus=[gpu_identity(ctx, g) for g in serving_gpus(ctx)],
                not_served=not_served(ctx),
            )
        return skipped("no APU: the TTM limit only bounds unified memory")
    apus = [g for g in serving_gpus(ctx) if g.apu]
    ram = meminfo(ctx).get("MemTotal")
    limits = ttm_limits(ctx)
    # With a DKMS amdgpu, amdttm is the TTM the GPU uses; the in-tree ttm may be loaded beside it.
    names = ["ttm", "amdttm"] if ctx.host.exists("/sys/module/amdttm") else ["ttm"]
    governing = "amdttm" if "amdttm" in names and "amdttm" in limits else "ttm"
    pages = limits.get(governing)
    gtt_total = apus[0].gtt_total
    limit_bytes = pages * 4096 if pages else gtt_total
    details = {
        "pages_limit": limits,
        "governing": governing,
        "mem_total": ram,
        "gtt_total": gtt_total,
        "gpu": gpu_identity(ctx, apus[0]),
    }
    if ram is None or limit_bytes is None:
        return warned(
            "cannot compare the TTM limit with RAM: /proc/meminfo or the TTM parameters are unreadable",
            "Check /sys/module/ttm/parameters/pages_limit and /proc/meminfo as root.",
            **details,
        )
    target_gib = max(1, int(ram // GIB) - OS_RESERVE_GIB)
    target_pages = target_gib * PAGES_PER_GIB
    details["suggested_pages_limit"] = target_pages
    reach = f"{gib(limit_bytes)} of {gib(ram)} RAM"
    advice = carveout_advice(True, apus[0].vram_total, gtt_total, ram)
    if advice is not None:
        return warned(advice.summary(), advice.remedy(), **{**details, **advice.finding_details()})
    pending = pending_limit(ctx, governing, pages)
    if pending is not None:
        details["pending"] = pending
        next_bytes = pending["next_boot"] * 4096
        if ram * DEFAULT_TTM_FRACTION < next_bytes <= ram:
            return warned(
                f"written; takes effect after {' and '.join(pending['after'])}: {governing}.pages_limit "
                f"{pending['next_boot']} ({gib(next_bytes)}) from {pending['source']}; until then the GPU can "
                f"reach {reach}",
                "Do what it waits for: " + "; then ".join(pending["after"]) + ".",
                **{**details, "pending": {**pending, "meets_target": True}},
            )
    if limit_bytes <= ram * DEFAULT_TTM_FRACTION:
        return warned(
            f"the GPU can reach only {reach} (the default TTM limit, about half of RAM)",
            f"Set {ttm_setting(target_pages, names)} ({target_gib} GiB = {target_gib} x {PAGES_PER_GIB} pages).",
            **details,
            **fixable("ttm"),
        )
    if len(names) == 2 and len(set(limits.values())) > 1:
        return warned(
            f"ttm and amdttm disagree ({limits}): tools read one, the DKMS driver uses the other",
            f"Set both: {ttm_setting(limits[governing], names)}.",
            **details,
            **fixable("ttm"),
        )
    if limit_bytes > ram:
        return warned(
            f"TTM limit {gib(limit_bytes)} exceeds RAM {gib(ram)}: large allocations can OOM the host",
            f"Lower it: {ttm_setting(target_pages, names)}.",
            **details,
            **fixable("ttm"),
        )
    if gtt_total is not None and pages and gtt_total < pages * 4096 * 0.9:
        return warned(
            f"GTT is {gib(gtt_total)} although {governing}.pages_limit allows {gib(pages * 4096)}: "
            "amdgpu.gttsize caps it",
            "Remove amdgpu.gttsize from the kernel command line (deprecated; ttm.pages_limit alone sets GTT), "
            "then reboot.",
            **details,
            **fixable("cmdline.gttsize"),
        )
    return passed(f"{governing}.pages_limit {pages or '?'}: the GPU can reach {reach}", **details)


def pending_limit(ctx: Context, module: str, running: int | None) -> dict[str, Any] | None:
    """A TTM limit written for the next boot that the running kernel does not have yet (facts/next_boot.py:
    modprobe.d by kmod's order, the kernel command line over it); None when the next boot keeps today's."""
    boot = next_boot.boot_config(ctx.host)
    param = next_boot.module_param(ctx.host, boot, module, "pages_limit")
    if param.value is None or not param.value.isdecimal() or int(param.value) == running or not param.source:
        return None
    after = ["a reboot"]
    image = next_boot.initramfs_image(ctx.host, kernel_release(ctx))
    if image and not param.overridden_by_cmdline:
        distro = distro_info(ctx)
        tool = initramfs_command(distro_family(distro.get("id"), distro.get("like")))
        after.insert(
            0, f"`{tool}` ({module} may load from {image}, which holds the modprobe.d it was built with)"
        )
    return {
        "setting": f"{module}.pages_limit",
        "now": running,
        "next_boot": int(param.value),
        "source": param.source,
        "after": after,
        "boot": boot.to_json(),
    }
