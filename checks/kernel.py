"""The running kernel: new enough for the GPU, and exporting the CWSR sizes the runtime needs."""

from __future__ import annotations

from rocmdoctor.checks import check
from rocmdoctor.checks.facts import (
    DISTRO_READS,
    GPU_READS,
    OSRELEASE,
    GpuNode,
    distro_info,
    gpu_identity,
    gpu_label,
    gpus,
    kernel_release,
    served_nodes,
)
from rocmdoctor.checks.kernel_rules import (
    CWSR_REQUIRED_TARGETS,
    VGPR_BUMPED,
    VGPR_DEFAULT,
    carries_cwsr_export,
    expected_cwsr,
    minimum_for,
    parse_release,
)
from rocmdoctor.model import Action, Result, failed, passed, warned
from rocmdoctor.registry import Context

FIX_KERNEL = "run `rocmdoctor fix-kernel` for the commands for this distro"


def needs_cwsr(gpu: GpuNode) -> bool:
    return gpu.gfx_target_version in CWSR_REQUIRED_TARGETS


def exports_cwsr(gpu: GpuNode) -> bool:
    return "cwsr_size" in gpu.properties and "ctl_stack_size" in gpu.properties


@check(
    "kernel.version",
    "Kernel new enough for the GPU (CWSR export)",
    depends=("gpu.arch",),
    reads=(OSRELEASE, *DISTRO_READS, *GPU_READS),
)
def kernel_version(ctx: Context) -> Result:
    text = kernel_release(ctx)
    release = parse_release(text)
    info = distro_info(ctx)
    needing = [g for g in gpus(ctx) if needs_cwsr(g)]
    details = {"kernel": text, "distro": info["id"], "minimum": minimum_for(info["id"], info["version"])}
    if release is None:
        return warned(
            f"cannot parse the kernel release {text!r} from {OSRELEASE}",
            f"Check `uname -r`; the minimum for gfx1151 is {details['minimum']}.",
            **details,
        )
    if not needing:
        names = ", ".join(sorted({g.gfx for g in gpus(ctx)}))
        return passed(f"{text}: no CWSR minimum applies to {names}", **details)
    if carries_cwsr_export(release, info["id"]):
        return passed(f"{text} carries the CWSR export (minimum {details['minimum']})", **details)
    if all(exports_cwsr(g) for g in needing):
        return passed(
            f"{text} is older than {details['minimum']} but exports the CWSR sizes (a backport)", **details
        )
    return failed(
        f"{text} is older than the minimum for {needing[0].gfx}: {details['minimum']}",
        f"Install a kernel with the CWSR export, then reboot; {FIX_KERNEL}.",
        **details,
    )


@check(
    "kernel.cwsr",
    "CWSR sizes exported and as the kernel formula expects",
    depends=("gpu.arch",),
    blocks=(Action.INSTALL, Action.SERVE),
    reads=GPU_READS,
)
def kernel_cwsr(ctx: Context) -> Result:
    missing: list[str] = []
    wrong: list[str] = []
    fine: list[str] = []
    not_needed: list[str] = []
    hidden: list[str] = []
    unbumped = False
    rows = []
    served = served_nodes(ctx)
    for gpu in gpus(ctx):
        expected = expected_cwsr(gpu.properties)
        exported = (gpu.properties.get("cwsr_size"), gpu.properties.get("ctl_stack_size"))
        rows.append(
            {
                "node": gpu.node,
                "gfx": gpu.gfx,
                "cwsr_size": exported[0],
                "ctl_stack_size": exported[1],
                "expected": list(expected) if expected else None,
                "required": needs_cwsr(gpu),
                "identity": gpu_identity(ctx, gpu),
            }
        )
        label = f"{gpu.gfx} (node {gpu.node})"
        if not exports_cwsr(gpu) and needs_cwsr(gpu) and gpu.node not in served:
            # The pin (ROCR_VISIBLE_DEVICES) keeps ROCr from opening it: its missing sizes cannot hurt vLLM.
            hidden.append(gpu_label(ctx, gpu))
        elif not exports_cwsr(gpu):
            (missing if needs_cwsr(gpu) else not_needed).append(label)
        elif expected is not None and exported != expected:
            unbumped = unbumped or (
                gpu.gfx_target_version in VGPR_BUMPED
                and exported == expected_cwsr(gpu.properties, vgpr=VGPR_DEFAULT)
            )
            wrong.append(
                f"{label}: cwsr_size {exported[0]}, ctl_stack_size {exported[1]}, "
                f"expected {expected[0]} / {expected[1]}"
            )
        else:
            fine.append(label)
    if missing:
        return failed(
            f"cwsr_size/ctl_stack_size not exported for {', '.join(missing)}: this kernel lacks the CWSR fix",
            f"Boot a kernel with the fix (6.18.4+, Ubuntu 24.04 HWE 6.17.0-19+); {FIX_KERNEL}.",
            gpus=rows,
        )
    if wrong:
        remedy = (
            f"The kernel exports the sizes but lacks the VGPR bump for this GPU; update it ({FIX_KERNEL})."
            if unbumped
            else "The exported sizes differ from the formula of current kernels (kfd_queue.c); update the "
            f"kernel ({FIX_KERNEL}) and report the node's properties file if the difference stays."
        )
        return warned(
            "CWSR sizes exported but not what the kernel formula gives: " + "; ".join(wrong),
            remedy,
            gpus=rows,
        )
    parts = []
    if fine:
        parts.append(f"exported as expected on {', '.join(fine)}")
    if not_needed:
        parts.append(f"not exported on {', '.join(not_needed)} (not required there)")
    if hidden:
        parts.append(
            f"not exported on {', '.join(hidden)}, which vLLM does not serve (hidden by the unit's pin)"
        )
    return passed("; ".join(parts) or "no GPU node to check", gpus=rows)
