"""The diagnosis's GPU facts as the plain device records provisioning lays servers out on.

The one place that joins checks (facts) and provision (layout): provision never imports checks.
"""

from __future__ import annotations

from rocmdoctor.checks import facts
from rocmdoctor.provision.server.layout import Device
from rocmdoctor.registry import Context

PCI_DEVICES = "/sys/bus/pci/devices"


def _numa_node(ctx: Context, slot: str | None) -> int | None:
    """The PCI device's NUMA node (-1 in sysfs: the platform did not say)."""
    if not slot:
        return None
    raw = ctx.host.read_int(f"{PCI_DEVICES}/{slot}/numa_node")
    return raw.value if raw.ok and raw.value >= 0 else None


def host_devices(ctx: Context) -> list[Device]:
    """Every GPU node of the KFD topology, supported or not (an unsupported one still counts in
    ROCm's numbering), with its partition, XGMI hive, NUMA node and the memory vLLM sizes from."""
    out = []
    for gpu in facts.gpus(ctx):
        total, free = facts.usable_memory(ctx, gpu)
        part = facts.partition_of(ctx, gpu)
        phys, index = part if part else (None, None)
        out.append(
            Device(
                kfd_node=gpu.node,
                gfx=gpu.gfx,
                family=gpu.family,
                pci_slot=gpu.pci_slot,
                physical_slot=gpu.physical_slot,
                partition=index,
                partitions=len(phys.nodes) if phys else 1,
                compute_partition=phys.compute_partition if phys else None,
                hive_id=gpu.properties.get("hive_id", 0) or 0,
                numa_node=_numa_node(ctx, gpu.physical_slot or gpu.pci_slot),
                memory_total=total,
                memory_free=free,
                apu=gpu.apu,
            )
        )
    return out
