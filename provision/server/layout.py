"""Which vLLM servers a host runs: one, one per GPU, or one per partition, each on its own devices.

Pure: plain device records in, instances out. The command layer turns the diagnosis's facts into
`Device`s (rocmdoctor.commands.host_devices); nothing here reads the host, so every layout can be
tested on captured topologies and port probing is a function the caller passes.

How ROCm numbers the devices that `ROCR_VISIBLE_DEVICES` names (ROCR-Runtime
src/core/runtime/amd_filter_device.cpp, RvdFilter::BuildDeviceUuidList): it walks the thunk's
nodes 0..N-1 in order and keeps those with SIMDs (`NumFComputeCores != 0`), CPUs skipped; index i
is the i-th GPU node so kept, whatever its PCI address or DRM card number. The thunk's node order
is the KFD topology's (libhsakmt topology_sysfs_check_node_supported drops only nodes whose render
node cannot be opened, which the unit's DeviceAllow=char-drm rules out), and the kernel numbers
KFD nodes in device probe order: partitions of one GPU are consecutive. HIP numbers what survives
ROCr's filter from 0 again (clr rocdevice.cpp indexes `gpu_agents_` after the filter), so the
unit sets ROCR_VISIBLE_DEVICES only: HIP_VISIBLE_DEVICES with the same numbers would point at
other devices, and vLLM refuses HIP_ and CUDA_VISIBLE_DEVICES that disagree.

A device is identified by its KFD node and PCI address; `rocr_index` is computed here from the
order of *every* GPU node, the unsupported iGPU included (it counts even when it is hidden). A
DRM card index is never used: card numbers follow DRM probe order, which differs from KFD's on
hosts with an iGPU. UUIDs (`GPU-<unique_id>`) cannot name a partition: all partitions of a GPU
share the GPU's unique_id (captured MI308X/MI300X CPX topologies), so indices are used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rocmdoctor.facts.gpu_choice import (
    ambiguous,
    gpu_spec_matches,
    gpu_spec_valid,
    serving_families,
    serving_nodes,
)
from rocmdoctor.vllm.memory_rule import MIN_USEFUL_UTILIZATION, recommended, requested_bytes

LAYOUTS = ("one", "per-gpu", "per-partition")
GIB = 1 << 30
MAX_PORT = 65535
# Tensor-parallel sizes offered when a layout is refused (vLLM splits attention heads evenly;
# real models have power-of-two head counts).
SUGGESTED_TP = (1, 2, 4, 8)

PortFree = Callable[[int], bool]


class LayoutError(ValueError):
    """A layout this host cannot run; the message says why and which layouts would work."""


@dataclass(frozen=True, slots=True)
class Device:
    """One device ROCm shows: a whole GPU, or one compute partition of an Instinct GPU."""

    kfd_node: int
    gfx: str
    family: str | None  # None: no vllm-rocm bundle runs on it (an unsupported iGPU): never used
    pci_slot: str | None = None  # the node's own PCI address (a partition's function bits included)
    physical_slot: str | None = None  # the physical GPU's PCI address
    partition: int | None = None  # index inside its physical GPU when partitioned
    partitions: int = 1  # how many devices its physical GPU shows as
    compute_partition: str | None = None  # "SPX", "CPX", ...
    hive_id: int = 0  # XGMI hive (0: none, PCIe only)
    numa_node: int | None = None
    memory_total: int | None = None  # the pool vLLM sizes from (an APU's GTT pool)
    memory_free: int | None = None
    apu: bool | None = None

    @property
    def label(self) -> str:
        where = self.pci_slot or self.physical_slot or "no PCI address"
        part = f" partition {self.partition}" if self.partition is not None else ""
        return f"node {self.kfd_node} ({self.gfx} {where}{part})"


@dataclass(frozen=True, slots=True)
class Instance:
    name: str
    port: int
    devices: tuple[Device, ...]
    rocr_indices: tuple[int, ...]
    gpu_memory_utilization: float
    utilization_reason: str

    @property
    def visible_devices(self) -> str:
        return ",".join(str(i) for i in self.rocr_indices)

    @property
    def tensor_parallel_size(self) -> int:
        return len(self.devices)

    @property
    def kfd_nodes(self) -> list[int]:
        return [d.kfd_node for d in self.devices]

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "port": self.port,
            "visible_devices": self.visible_devices,
            "kfd_nodes": self.kfd_nodes,
            "tensor_parallel_size": self.tensor_parallel_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "pci_slots": [d.pci_slot for d in self.devices],
            "utilization_reason": self.utilization_reason,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    layout: str
    instances: list[Instance]
    skipped_ports: list[int] = field(default_factory=list)
    hidden: list[Device] = field(default_factory=list)  # GPU nodes no instance may use
    notes: list[str] = field(default_factory=list)


def rocr_indices(devices: Sequence[Device]) -> dict[int, int]:
    """KFD node -> the index ROCR_VISIBLE_DEVICES uses: rank among all GPU nodes in node order."""
    return {d.kfd_node: i for i, d in enumerate(sorted(devices, key=lambda d: d.kfd_node))}


def visible_devices(all_devices: Sequence[Device], chosen: Sequence[Device]) -> str:
    """The ROCR_VISIBLE_DEVICES value that shows exactly `chosen`, in that order (the single server
    pins its GPU with this too)."""
    index = rocr_indices(all_devices)
    missing = [d.label for d in chosen if d.kfd_node not in index]
    if missing:
        raise LayoutError(f"{', '.join(missing)} is not among the host's GPU nodes")
    return ",".join(str(index[d.kfd_node]) for d in chosen)


class AmbiguousGpus(LayoutError):
    """GPUs of several families could serve: the operator picks (`--gpu`, `--family`); nothing guesses."""


def gpu_options(devices: Sequence[Device]) -> list[str]:
    """`--gpu` values that pick each supported device, by PCI slot (KFD node when it has none)."""
    return [
        f"--gpu {d.pci_slot or f'node:{d.kfd_node}'} ({d.label}, family {d.family})"
        for d in devices
        if d.family
    ]


def _picked(ordered: list[Device], specs: Sequence[str]) -> list[Device]:
    """The devices `--gpu` names (each spec must name one), in ROCm order."""
    for spec in specs:
        if not gpu_spec_valid(spec):
            raise LayoutError(f"--gpu {spec!r}: give a PCI slot (0000:03:00.0) or a KFD node (node:2)")
        if not any(gpu_spec_matches(spec, d.kfd_node, d.pci_slot or d.physical_slot) for d in ordered):
            raise LayoutError(
                f"--gpu {spec}: no GPU node here has that PCI slot or KFD node; choose one of: "
                + "; ".join(gpu_options(ordered))
            )
    picked = [
        d
        for d in ordered
        if any(gpu_spec_matches(s, d.kfd_node, d.pci_slot or d.physical_slot) for s in specs)
    ]
    unsupported = [d.label for d in picked if not d.family]
    if unsupported:
        raise LayoutError(f"--gpu: no vllm-rocm bundle runs on {', '.join(unsupported)}")
    families = list(dict.fromkeys(d.family for d in picked))
    if len(families) > 1:
        raise LayoutError(
            f"--gpu names GPUs of several families ({', '.join(str(f) for f in families)}); "
            "one bundle runs one family"
        )
    return picked


def usable(
    devices: Sequence[Device], family: str | None, gpus: Sequence[str] = ()
) -> tuple[list[Device], list[Device]]:
    """(devices a server may use, GPU nodes to hide), in ROCm order: the GPUs `--gpu` names, else those
    of `--family`, else gpu_choice's rule (a supported dGPU before an iGPU beside it); GPUs of several
    families left after that rule are ambiguous and refused with the options named."""
    ordered = sorted(devices, key=lambda d: d.kfd_node)
    supported = [d for d in ordered if d.family]
    families = list(dict.fromkeys(d.family for d in supported))
    if gpus:
        keep = _picked(ordered, gpus)
        return keep, _others(ordered, keep)
    if family is not None and family not in families:
        found = ", ".join(str(f) for f in families) or "none"
        raise LayoutError(f"--family {family}: no GPU of that family here (found: {found})")
    if family is None and ambiguous(ordered):
        raise AmbiguousGpus(
            f"this host has GPUs of several families ({', '.join(serving_families(ordered))}) and none is "
            "the obvious one to serve; one bundle runs one family, so pick the GPU(s): "
            + "; ".join(gpu_options(serving_nodes(ordered)))
            + " (or --family with one of them)"
        )
    named = serving_families(ordered)
    chosen = family or (named[0] if named else None)
    keep = serving_nodes([d for d in supported if d.family == chosen])
    return keep, _others(ordered, keep)


def _others(ordered: list[Device], keep: list[Device]) -> list[Device]:
    """The devices not kept, by identity: a list membership test per device was N x N on a host of
    thousands of nodes."""
    kept = {id(d) for d in keep}
    return [d for d in ordered if id(d) not in kept]


def _units(layout: str, devices: list[Device]) -> list[Device]:
    partitioned = [d for d in devices if d.partitions > 1]
    if layout == "per-gpu" and partitioned:
        modes = sorted({d.compute_partition or f"{d.partitions}-way" for d in partitioned})
        raise LayoutError(
            f"per-gpu needs whole GPUs, but {len({d.physical_slot for d in partitioned})} GPU(s) here are "
            f"partitioned ({', '.join(modes)}: {partitioned[0].partitions} devices each); use per-partition, "
            "or switch the GPUs to SPX (amd-smi set --compute-partition SPX) first"
        )
    if layout == "per-partition":
        if not partitioned:
            raise LayoutError(
                "per-partition needs GPUs in a partitioned mode (CPX, DPX, QPX), and no GPU here "
                "is partitioned; use per-gpu (or partition the GPUs: amd-smi set "
                "--compute-partition CPX)"
            )
        return partitioned
    return devices


def _buckets(devices: list[Device]) -> list[list[Device]]:
    """Devices that may share a tensor-parallel group: same family, same XGMI hive (or all on PCIe);
    inside one, NUMA node next to NUMA node, then ROCm order (partitions of a GPU stay together)."""
    buckets: dict[tuple[str | None, int], list[Device]] = {}
    for d in devices:
        buckets.setdefault((d.family, d.hive_id), []).append(d)
    return [
        sorted(m, key=lambda d: (d.numa_node if d.numa_node is not None else -1, d.kfd_node))
        for m in buckets.values()
    ]


def structure(layout: str, devices: list[Device], tp: int, count: int | None) -> list[list[Device]]:
    """The device groups of the layout (no ports, no memory); LayoutError when it cannot be."""
    if layout not in LAYOUTS:
        raise LayoutError(f"--instances {layout!r}: choose one of {', '.join(LAYOUTS)}")
    if tp < 1:
        raise LayoutError(f"--tensor-parallel-size must be 1 or more, not {tp}")
    if count is not None and count < 1:
        raise LayoutError(f"--count must be 1 or more, not {count}")
    if layout == "one" and count not in (None, 1):
        raise LayoutError(f"--count {count} goes with per-gpu or per-partition; `one` is one server")
    if not devices:
        raise LayoutError("no GPU here that a vllm-rocm bundle supports (rocmdoctor check says why)")
    units = _units(layout, devices)
    if tp > len(units):
        raise LayoutError(f"--tensor-parallel-size {tp} needs {tp} devices; this host has {len(units)}")
    buckets = _buckets(units)
    if layout == "one":
        fitting = [m for m in buckets if len(m) >= tp]
        if not fitting:
            raise LayoutError(
                f"--tensor-parallel-size {tp} needs {tp} devices in one XGMI hive; the largest "
                f"hive here has {max(len(m) for m in buckets)}"
            )
        groups = [fitting[0][:tp]]
    else:
        if any(len(m) % tp for m in buckets):
            per = f" ({' + '.join(str(len(m)) for m in buckets)} per XGMI hive)" if len(buckets) > 1 else ""
            raise LayoutError(
                f"{len(units)} devices{per} do not split into tensor-parallel groups of {tp}: "
                "some would get no server"
            )
        groups = [m[i : i + tp] for m in buckets for i in range(0, len(m), tp)]
        groups.sort(key=lambda g: min(d.kfd_node for d in g))
    if count is not None:
        if count > len(groups):
            raise LayoutError(
                f"{count} instances of {tp} device(s) need {count * tp} devices; this host has "
                f"{len(units)} for {layout}"
            )
        groups = groups[:count]
    return groups


def layout_options(layout: str, tp: int) -> str:
    """The command-line options that choose a layout."""
    return f"--instances {layout}" + (f" --tensor-parallel-size {tp}" if tp > 1 else "")


def offered(devices: list[Device]) -> list[tuple[str, int, list[list[Device]] | LayoutError]]:
    """Every (layout, tensor-parallel size) offered to an operator, with its device groups on these
    devices or the reason it cannot be: what a refusal suggests and what `check` reports as capacity."""
    out: list[tuple[str, int, list[list[Device]] | LayoutError]] = []
    for layout in LAYOUTS:
        for tp in SUGGESTED_TP if layout != "one" else (1,):
            try:
                out.append((layout, tp, structure(layout, devices, tp, None)))
            except LayoutError as exc:
                out.append((layout, tp, exc))
    return out


def working_layouts(devices: list[Device]) -> list[str]:
    """The layouts this host can run, as the options that choose them."""
    return [
        f"{layout_options(layout, tp)} ({len(groups)} instance{'s' if len(groups) != 1 else ''})"
        for layout, tp, groups in offered(devices)
        if not isinstance(groups, LayoutError)
    ]


def group_utilization(group: Sequence[Device], override: float | None = None) -> tuple[float, str]:
    """--gpu-memory-utilization for one instance on these devices, by vLLM's rule, and why."""
    if override is not None:
        if not 0 < override <= 1:
            raise LayoutError(f"--gpu-memory-utilization must be in (0, 1], not {override}")
        return override, "your choice"
    unknown = [d.label for d in group if not d.memory_total or d.memory_free is None]
    if unknown:
        raise LayoutError(
            f"the memory of {', '.join(unknown)} cannot be read (rocmdoctor check says why); "
            "pass --gpu-memory-utilization to choose it yourself"
        )
    # The tightest device decides: every rank of a tensor-parallel group must pass vLLM's rule.
    worst = min(group, key=lambda d: recommended(d.memory_total or 0, d.memory_free or 0))
    total, free = worst.memory_total or 0, worst.memory_free or 0
    util = recommended(total, free)
    if util < MIN_USEFUL_UTILIZATION:
        raise LayoutError(
            f"{worst.label}: only {free / GIB:.2f} GiB of {total / GIB:.2f} GiB is free; vLLM cannot "
            "start with so little. Stop the processes holding its memory (rocmdoctor check lists "
            "them)"
        )
    return util, (
        f"vLLM needs ceil(total x util) <= free at startup: {worst.label} {free / GIB:.2f} GiB free of "
        f"{total / GIB:.2f} GiB, 1 GiB kept as margin -> {util:.2f} asks "
        f"{requested_bytes(total, util) / GIB:.2f} GiB"
    )


def _ports(first: int, n: int, port_free: PortFree, owned: set[int]) -> tuple[list[int], list[int]]:
    if not 0 < first <= MAX_PORT:
        raise LayoutError(f"--port must be between 1 and {MAX_PORT}, not {first}")
    ports: list[int] = []
    skipped: list[int] = []
    port = first
    while len(ports) < n:
        if port > MAX_PORT:
            raise LayoutError(
                f"not enough free ports from {first} up to {MAX_PORT} for {n} instances "
                f"({len(skipped)} taken); pass another --port"
            )
        # A port the current layout's own instance holds is ours (the server is running on it).
        if port in owned or port_free(port):
            ports.append(port)
        else:
            skipped.append(port)
        port += 1
    return ports, skipped


def plan(
    devices: Sequence[Device],
    layout: str,
    *,
    tensor_parallel_size: int = 1,
    count: int | None = None,
    first_port: int = 8000,
    port_free: PortFree,
    owned_ports: set[int] | None = None,
    gpu_memory_utilization: float | None = None,
    family: str | None = None,
    gpus: Sequence[str] = (),
) -> Plan:
    """The instances of `layout` on these devices (every GPU node of the host, in any order)."""
    keep, hidden = usable(devices, family, gpus)
    try:
        groups = structure(layout, keep, tensor_parallel_size, count)
    except LayoutError as exc:
        working = working_layouts(keep)
        hint = ("; layouts that work here: " + "; ".join(working)) if working else ""
        raise LayoutError(f"{exc}{hint}") from None
    sizing = [group_utilization(g, gpu_memory_utilization) for g in groups]
    ports, skipped = _ports(first_port, len(groups), port_free, owned_ports or set())
    index = rocr_indices(devices)
    instances = [
        Instance(str(i), port, tuple(group), tuple(index[d.kfd_node] for d in group), util, reason)
        for i, (group, port, (util, reason)) in enumerate(zip(groups, ports, sizing, strict=True))
    ]
    notes = [f"port {p} is in use: skipped" for p in skipped]
    notes += [f"hidden from the servers: {d.label} ({_why_hidden(d, keep)})" for d in hidden]
    for inst in instances:
        numas = {d.numa_node for d in inst.devices if d.numa_node is not None}
        if len(numas) > 1:
            notes.append(
                f"instance {inst.name} spans NUMA nodes {sorted(numas)}: no group of "
                f"{inst.tensor_parallel_size} fits one"
            )
    return Plan(layout, instances, skipped, hidden, notes)


def _why_hidden(device: Device, served: Sequence[Device]) -> str:
    if not device.family:
        return f"no vllm-rocm bundle for {device.gfx}"
    if device.apu and any(d.apu is False for d in served):
        return "an iGPU beside a supported dGPU; --gpu to serve it"
    return f"family {device.family}, not the one served"


def single_server_group(
    devices: Sequence[Device],
    tensor_parallel_size: int = 1,
    family: str | None = None,
    gpus: Sequence[str] = (),
) -> list[Device]:
    """The devices layout `one` gives the one server `rocmdoctor unit` writes (an unsupported iGPU
    hidden, the GPUs of one family and hive), in the order vLLM will number them."""
    keep, _hidden = usable(devices, family, gpus)
    (group,) = structure("one", keep, tensor_parallel_size, None)
    return group


def single_server_devices(
    devices: Sequence[Device],
    tensor_parallel_size: int = 1,
    family: str | None = None,
    gpus: Sequence[str] = (),
) -> str:
    """ROCR_VISIBLE_DEVICES for the one server: single_server_group in ROCm's numbering."""
    return visible_devices(devices, single_server_group(devices, tensor_parallel_size, family, gpus))
