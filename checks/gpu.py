"""GPUs in the KFD topology: are there any, which gfx targets, APU or dGPU, which bundle family."""

from __future__ import annotations

from rocmdoctor.checks import check
from rocmdoctor.checks.facts import (
    AMD_VENDOR_ID,
    GPU_READS,
    KFD_NODES,
    GpuNode,
    drm_device_dirs,
    gpu_label,
    gpu_summary,
    gpus,
    parse_uevent,
    physical_gpus,
    physical_summary,
    rocr_index,
    serving_gpus,
    unreadable_topology,
)
from rocmdoctor.checks.pci_bind import READS as PCI_BIND_READS
from rocmdoctor.checks.pci_bind import unbound_finding
from rocmdoctor.model import Action, Result, failed, passed, warned
from rocmdoctor.registry import Context
from rocmdoctor.textnum import is_decimal

KFD_ROOT = "/sys/class/kfd"
WSL_DEVICE = "/dev/dxg"
VENDOR_NAMES = {0x10DE: "NVIDIA", 0x8086: "Intel", AMD_VENDOR_ID: "AMD"}


def other_display_devices(ctx: Context) -> list[str]:
    """What the DRM class shows instead of an AMD GPU, e.g. 'NVIDIA 10de:2684 (nvidia) at 0000:01:00.0'."""
    seen: dict[str, str] = {}
    for device_dir in drm_device_dirs(ctx):
        raw = ctx.host.read_text(f"{device_dir}/uevent")
        if not raw.ok:
            continue
        uevent = parse_uevent(raw.value)
        slot = uevent.get("PCI_SLOT_NAME", device_dir)
        vendor_hex, _, device_hex = uevent.get("PCI_ID", "").partition(":")
        try:
            vendor = VENDOR_NAMES.get(int(vendor_hex, 16), f"vendor {vendor_hex.lower()}")
        except ValueError:
            vendor = "unknown vendor"
        driver = uevent.get("DRIVER", "no driver")
        seen.setdefault(slot, f"{vendor} {vendor_hex.lower()}:{device_hex.lower()} ({driver}) at {slot}")
    return list(seen.values())


@check(
    "gpu.present",
    "AMD GPU in the KFD topology",
    reads=(KFD_ROOT, WSL_DEVICE, *GPU_READS, *PCI_BIND_READS),
    blocks=(Action.INSTALL, Action.SERVE),
)
def gpu_present(ctx: Context) -> Result:
    found = gpus(ctx)
    if found:
        names = ", ".join(f"{g.gfx} (node {g.node})" for g in found)
        return passed(f"{len(found)} AMD GPU node(s): {names}", nodes=[g.node for g in found])
    denied = unreadable_topology(ctx)
    if denied:
        identity = ctx.host.identity()
        who = identity.user if identity else "this user"
        # Unreadable is not absent: a finding that names what could not be read (every dependent skips).
        return failed(
            f"cannot read {', '.join(denied[:3])}{' ...' if len(denied) > 3 else ''} as {who} (permission "
            "denied), so whether this host has a GPU is unknown",
            "Run rocmdoctor as root (`sudo rocmdoctor check`), or fix the permissions that hide the KFD "
            "topology (it is world-readable on a normal host).",
            unreadable=denied,
        )
    others = other_display_devices(ctx)
    instead = f"; found instead: {'; '.join(others)}" if others else ""
    unbound = unbound_finding(ctx)
    if unbound is not None and ctx.host.stat(WSL_DEVICE) is None:
        # The GPU is there and amdgpu did not take it: name it and why, not "no GPU" and a bare modprobe.
        summary, remedy, details = unbound
        return failed(f"no KFD GPU node: {summary}", remedy, other_devices=others, **details)
    if ctx.host.stat(WSL_DEVICE) is not None:
        return failed(
            f"this is WSL ({WSL_DEVICE}): its GPU passthrough has no KFD topology{instead}",
            "Run vLLM on native Linux; the vllm-rocm bundle needs /dev/kfd, which WSL does not provide.",
            other_devices=others,
        )
    if not ctx.host.exists(KFD_ROOT):
        return failed(
            f"no {KFD_ROOT}: the amdgpu kernel driver with KFD is not loaded{instead}",
            "Load amdgpu (`sudo modprobe amdgpu`) on a host with a supported AMD GPU; vLLM on ROCm needs /dev/kfd.",
            other_devices=others,
        )
    nodes = [n for n in ctx.host.listdir(KFD_NODES) if is_decimal(n)]
    return failed(
        f"KFD topology has {len(nodes)} node(s) but none is a GPU (gfx_target_version 0 everywhere){instead}",
        "Check `dmesg | grep -i amdgpu` for a driver that failed to initialise the GPU; in WSL or a VM pass the GPU through.",
        kfd_nodes=nodes,
        other_devices=others,
    )


def kind(gpu: GpuNode) -> str:
    return "APU" if gpu.apu else "dGPU" if gpu.apu is False else f"(APU or dGPU unknown: {gpu.apu_basis})"


def describe_gpus(ctx: Context) -> str:
    """One phrase per physical GPU; a partitioned one says its mode and partition count once."""
    by_node = {g.node: g for g in gpus(ctx)}
    parts = []
    for phys in physical_gpus(ctx):
        first = by_node[phys.nodes[0]]
        if phys.partitioned:
            mode = phys.compute_partition or "unknown mode"
            parts.append(
                f"GPU {phys.pci_slot}: {first.gfx} {kind(first)} in {mode} mode, "
                f"{len(phys.nodes)} partitions (nodes {phys.nodes[0]}-{phys.nodes[-1]})"
                f" -> {first.family or 'no bundle'}"
            )
        else:
            parts.extend(
                f"node {n}: {by_node[n].gfx} {kind(by_node[n])}"
                + (f" at {by_node[n].pci_slot}" if by_node[n].pci_slot and len(by_node) > 1 else "")
                + f" -> {by_node[n].family or 'no bundle'}"
                for n in phys.nodes
            )
    return ", ".join(parts)


@check("gpu.arch", "GPU architecture and vllm-rocm bundle family", depends=("gpu.present",), reads=GPU_READS)
def gpu_arch(ctx: Context) -> Result:
    found = gpus(ctx)
    rows = [gpu_summary(g, i) for i, g in enumerate(found)]
    described = describe_gpus(ctx)
    partitioned = [physical_summary(p) for p in physical_gpus(ctx) if p.partitioned]
    unsupported = sorted({g.gfx for g in found if g.family is None})
    supported = sorted({g.gfx for g in found if g.family})
    extra = {"partitioned_gpus": partitioned} if partitioned else {}
    if unsupported and supported:
        # ROCm enumerates every GPU it can see, and vLLM starts on the first: the unsupported one must be
        # hidden (the runtime's order is not sysfs order, so by PCI address or UUID, not by node index).
        served = serving_gpus(ctx)
        pin = ",".join(str(rocr_index(ctx, g)) for g in served)
        return warned(
            f"vLLM can run on {', '.join(supported)}, but {', '.join(unsupported)} is visible beside it "
            f"({described})",
            f"Hide {', '.join(unsupported)} from ROCm: ROCR_VISIBLE_DEVICES={pin} shows only "
            f"{', '.join(gpu_label(ctx, g) for g in served)} (ROCm counts GPU nodes in KFD order, the unsupported "
            "one included); `rocmdoctor unit` and `serve` set it, or disable the other GPU in the firmware.",
            gpus=rows,
            families=sorted({g.family for g in found if g.family}),
            unsupported=unsupported,
            **extra,
        )
    if unsupported:
        return warned(
            f"no vllm-rocm bundle for {', '.join(unsupported)} ({described})",
            f"Bundles exist for {', '.join(ctx.manifest.family_names())}; use one of those GPUs or build vLLM for "
            f"{', '.join(unsupported)} from source.",
            gpus=rows,
            **extra,
        )
    families = sorted({g.family for g in found if g.family})
    return passed(described, gpus=rows, families=families, **extra)
