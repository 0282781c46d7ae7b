"""Operating system: the distribution and whether rocmdoctor has guidance for it; kernel tunables AMD
advises on for Instinct servers."""

from __future__ import annotations

from rocmdoctor.checks import check
from rocmdoctor.checks.facts import (
    DISTRO_READS,
    GPU_READS,
    KFD_NODES,
    distro_info,
    gpus,
    kfd_node_ids,
    read_properties,
)
from rocmdoctor.host import ReadState
from rocmdoctor.model import Result, Severity, passed, skipped, warned
from rocmdoctor.registry import Context
from rocmdoctor.textnum import is_decimal

# Distros the vllm-rocm bundle and the kernel guidance are written for.
KNOWN_DISTROS = {"ubuntu", "debian", "fedora", "arch", "opensuse-tumbleweed", "opensuse-leap", "opensuse"}


@check(
    "os.distro",
    "Distribution is a known target",
    severity=Severity.ADVISORY,
    reads=DISTRO_READS,
)
def os_distro(ctx: Context) -> Result:
    info = distro_info(ctx)
    name = f"{info['name'] or info['id'] or 'unknown'} {info['version']}".strip()
    if not info["id"]:
        return warned(
            "cannot tell the distribution: /etc/os-release is missing or empty",
            "Restore /etc/os-release (package base-files or equivalent); kernel guidance needs it.",
            **info,
        )
    if info["id"] in KNOWN_DISTROS or any(like in KNOWN_DISTROS for like in info["like"].split()):
        return passed(f"{name}", **info)
    return warned(
        f"{name} is not a distribution rocmdoctor has guidance for",
        "Expect to adapt `rocmdoctor fix-kernel` advice; Ubuntu, Debian, Fedora, Arch and openSUSE are covered.",
        **info,
    )


NUMA_BALANCING = "/proc/sys/kernel/numa_balancing"
NUMA_ONLINE = "/sys/devices/system/node/online"
NUMA_SYSCTL_FILE = "/etc/sysctl.d/90-rocm-numa-balancing.conf"


def count_ranges(text: str) -> int | None:
    """'0-1,3' (the kernel's cpulist/nodelist format) -> 3; None when it is not that format."""
    total = 0
    for part in text.strip().split(","):
        low, sep, high = part.partition("-")
        if not is_decimal(low) or (sep and not is_decimal(high)):
            return None
        total += int(high) - int(low) + 1 if sep else 1
    return total


def numa_nodes(ctx: Context) -> int | None:
    """NUMA nodes online; else the KFD CPU nodes (one per NUMA node with CPUs); None when neither says."""
    online = ctx.host.read_text(NUMA_ONLINE, limit=4096)
    if online.ok:
        count = count_ranges(online.value)
        if count:
            return count
    cpu_nodes = [
        n
        for n in kfd_node_ids(ctx)
        if (props := read_properties(ctx, f"{KFD_NODES}/{n}/properties"))
        and props.get("gfx_target_version", 0) == 0
        and props.get("cpu_cores_count", 0) > 0
    ]
    return len(cpu_nodes) or None


@check(
    "system.numa_balancing",
    "Instinct on several NUMA nodes: automatic NUMA balancing is off",
    severity=Severity.DEGRADING,
    depends=("gpu.arch",),
    reads=(*GPU_READS, NUMA_BALANCING, NUMA_ONLINE),
)
def system_numa_balancing(ctx: Context) -> Result:
    # AMD's vLLM benchmark guide for MI300X ("Disable NUMA auto-balancing ... Otherwise, the GPU might hang
    # until the periodic balancing is finalized", rocm.docs.amd.com .../performance-validation/mi300x/
    # vllm-benchmark.html, pointing to "AMD Instinct MI300X system optimization").
    instinct = [g for g in gpus(ctx) if g.gfx.startswith("gfx9") and g.apu is not True]
    if not instinct:
        return skipped("no Instinct GPU: AMD's advice on NUMA balancing concerns Instinct servers")
    nodes = numa_nodes(ctx)
    raw = ctx.host.read_int(NUMA_BALANCING)
    details = {"numa_nodes": nodes, "numa_balancing": raw.value if raw.ok else None}
    if not raw.ok:
        if ctx.host.is_live and raw.state is ReadState.MISSING:
            return passed(
                f"{raw.describe()}: this kernel has no automatic NUMA balancing to disable", **details
            )
        return skipped(f"{raw.describe()}: cannot tell whether automatic NUMA balancing is on", **details)
    if raw.value == 0:
        return passed("kernel.numa_balancing=0, as AMD advises for Instinct", **details)
    if nodes is not None and nodes <= 1:
        return passed(
            f"kernel.numa_balancing={raw.value} on a single NUMA node: there is nothing to move between nodes",
            **details,
        )
    where = f"{nodes} NUMA nodes" if nodes else "a host whose NUMA layout rocmdoctor cannot read"
    return warned(
        f"kernel.numa_balancing={raw.value} on {where} with {instinct[0].gfx}: AMD's vLLM tuning guide says to "
        "disable it, or the GPU may hang while the kernel migrates pages",
        f"sudo sysctl -w kernel.numa_balancing=0, and keep it across reboots: "
        f"echo kernel.numa_balancing=0 | sudo tee {NUMA_SYSCTL_FILE}.",
        **details,
    )
