"""Facts about the host's AMD GPUs and memory that several checks (and install/serve) share.

Everything here reads through `ctx.host` and is memoized on the context, so a run reads each
sysfs file once. The rules follow ../shared/reference/notes/host-facts.md: KFD `properties` are
parsed into dicts (kernels add and drop lines), gfx names use "gfx%d%x%x", a KFD node finds its
DRM device through `drm_render_minor`, falling back to the PCI address in location_id/domain.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from rocmdoctor.facts.gpu_choice import ambiguous, gpu_spec_matches, serving_nodes
from rocmdoctor.host import Read, ReadState
from rocmdoctor.registry import Context
from rocmdoctor.textnum import is_decimal

KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"
DRM = "/sys/class/drm"
MEMINFO = "/proc/meminfo"
OSRELEASE = "/proc/sys/kernel/osrelease"

# What `gpus()` may touch; every check that calls it declares these (snapshot captures them).
GPU_READS = (
    f"{KFD_NODES}/*/properties",
    f"{KFD_NODES}/*/mem_banks/*/properties",
    f"{DRM}/card*/device/uevent",
    f"{DRM}/renderD*/device/uevent",
    f"{DRM}/card*/device/mem_info_*",
    f"{DRM}/renderD*/device/mem_info_*",
    f"{DRM}/card*/device/board_info",
    f"{DRM}/renderD*/device/board_info",
    f"{KFD_NODES}/*/mem_banks/*/used_memory",
    "/sys/bus/pci/devices/*/current_compute_partition",
    "/sys/bus/pci/devices/*/current_memory_partition",
    "/sys/bus/pci/devices/*/available_compute_partition",
    "/sys/bus/pci/devices/*/available_memory_partition",
)
MEMINFO_READS = (MEMINFO,)
# What `distro` consults under a root: os-release, and release files such as /etc/debian_version,
# which give the point release (12.11 rather than 12).
DISTRO_READS = ("/etc/os-release", "/usr/lib/os-release", "/etc/*-release", "/etc/*_version")

AMD_VENDOR_ID = 0x1002
# Carve-outs of APUs start at 512 MiB; used only by the last-resort vote.
APU_MAX_CARVEOUT = 4 << 30
# KFD memory-bank heap types (kfd_crat.h HSA_MEM_HEAP_TYPE_*): 0 system memory (a CPU node's bank),
# 1 frame buffer fully visible to the CPU, 2 frame buffer with a private part beyond the BAR.
# A GPU node's bank is 1 on APUs *and* on large-BAR dGPUs (Instinct, resizable BAR), so only 2
# decides anything: an APU's carve-out is always entirely CPU-visible.
HEAP_SYSTEM = 0
HEAP_FB_PUBLIC = 1
HEAP_FB_PRIVATE = 2
HEAP_FRAME_BUFFER = (HEAP_FB_PUBLIC, HEAP_FB_PRIVATE)
# gfx9.4/9.5 (MI300/MI308/MI325/MI350) split into compute partitions; kfd_topology.c ORs the
# partition's node id into location_id's function bits, so all partitions of one GPU share
# location_id & ~7 (ROCm/k8s-device-plugin testdata/topology-parsing-mi308: 2560..2563).
PARTITIONABLE_TARGETS = range(90400, 90600)
PARTITION_MODES_BY_COUNT = {1: "SPX", 2: "DPX", 3: "TPX", 4: "QPX"}
PCI_DEVICES = "/sys/bus/pci/devices"


@lru_cache(maxsize=1)
def gpu_kinds() -> dict[str, Any]:
    """checks/data/gpu_kinds.json: which gfx targets and PCI ids are APUs (see its _about)."""
    text = resources.files("rocmdoctor.checks").joinpath("data", "gpu_kinds.json").read_text()
    return json.loads(text)


# gfx targets that exist only as integrated GPUs (kept as a name other modules use).
APU_ONLY_GFX = frozenset(g for g, kind in gpu_kinds()["gfx"].items() if kind == "apu")


@dataclass(frozen=True)
class GpuNode:
    """One KFD GPU node: a whole GPU, or one compute partition of an Instinct GPU."""

    node: int
    gfx: str
    family: str | None
    apu: bool | None
    vram_total: int | None
    vram_used: int | None
    gtt_total: int | None
    gtt_used: int | None
    render_minor: int | None
    pci_slot: str | None
    device_id: int | None
    simd_count: int | None
    properties: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    # Why `apu` has its value: the signal that decided, or why nothing did.
    apu_basis: str = field(default="", compare=False)
    # Where vram_* came from: "mem_info" (amdgpu's sysfs), "kfd_bank" (the node's KFD memory bank),
    # or None; and the files whose absence left a value unknown.
    memory_source: str | None = field(default=None, compare=False)
    memory_unread: tuple[str, ...] = field(default=(), compare=False)
    # The physical GPU this node belongs to (PCI address with the partition bits cleared).
    physical_slot: str | None = field(default=None, compare=False)

    @property
    def gfx_target_version(self) -> int:
        return self.properties.get("gfx_target_version", 0)

    @property
    def num_xcc(self) -> int:
        return self.properties.get("num_xcc", 1) or 1


@dataclass(frozen=True)
class PhysicalGpu:
    """A physical GPU and the KFD nodes it shows as: one, or one per compute partition."""

    pci_slot: str | None
    gfx: str
    nodes: tuple[int, ...]
    compute_partition: str | None  # the mode in force: sysfs current_compute_partition, else inferred
    compute_partition_source: str | None  # "sysfs", "kfd" (inferred from the nodes), or None
    memory_partition: str | None
    available_compute_partitions: tuple[str, ...]
    available_memory_partitions: tuple[str, ...]

    @property
    def partitioned(self) -> bool:
        return len(self.nodes) > 1


def sentence(parts: list[str]) -> str:
    """Remedy fragments joined into one sentence: 'a; b.' with the first letter raised."""
    text = "; ".join(parts)
    return text[:1].upper() + text[1:] + "."


# -- parsing -------------------------------------------------------------------------------


def parse_properties(text: str) -> dict[str, int]:
    """`name value` lines into a dict; lines that are not exactly that are ignored."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            out[parts[0]] = int(parts[1])
        except ValueError:
            continue
    return out


def parse_uevent(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def gfx_name(target_version: int) -> str | None:
    """110501 -> 'gfx1151', 90010 -> 'gfx90a'; minor and stepping are one hex digit each."""
    if target_version <= 0:
        return None
    major, minor, step = target_version // 10000, (target_version // 100) % 100, target_version % 100
    if minor > 15 or step > 15:
        return None  # not a value the kernel's table produces: do not guess a name
    return f"gfx{major}{minor:x}{step:x}"


def pci_slot_from_location(location_id: int | None, domain: int | None) -> str | None:
    """KFD location_id = (bus << 8) | devfn -> '0000:c1:00.0'."""
    if location_id is None or location_id < 0 or location_id > 0xFFFF:
        return None
    bus, devfn = location_id >> 8, location_id & 0xFF
    dom = domain if domain is not None and 0 <= domain <= 0xFFFFFFFF else 0
    return f"{dom:04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7}"


# -- reads -------------------------------------------------------------------------------


def read_properties(ctx: Context, path: str) -> dict[str, int]:
    raw = ctx.host.read_text(path)
    return parse_properties(raw.value) if raw.ok else {}


def _read_int(ctx: Context, path: str) -> int | None:
    raw = ctx.host.read_int(path)
    return raw.value if raw.ok and raw.value >= 0 else None


def unreadable_topology(ctx: Context) -> list[str]:
    """KFD topology paths this user may not read: without them "no GPU" would be a lie."""
    if ctx.host.listdir_denied(KFD_NODES):
        return [KFD_NODES]
    denied = []
    for node in sorted(kfd_node_ids(ctx)):
        path = f"{KFD_NODES}/{node}/properties"
        if ctx.host.read_text(path).state is ReadState.DENIED:
            denied.append(path)
    return denied


def kfd_node_ids(ctx: Context) -> list[int]:
    return [int(n) for n in ctx.host.listdir(KFD_NODES) if is_decimal(n)]


def drm_device_dirs(ctx: Context) -> list[str]:
    """card<N> and renderD<N> device directories in numeric order (card10 after card9)."""
    names = ctx.host.listdir(DRM)
    return [
        f"{DRM}/{n}/device"
        for n in names
        if (n.startswith("card") and is_decimal(n[4:])) or (n.startswith("renderD") and is_decimal(n[7:]))
    ]


def _slot_of(ctx: Context, device_dir: str) -> str | None:
    raw = ctx.host.read_text(f"{device_dir}/uevent")
    if not raw.ok:
        return None
    slot = parse_uevent(raw.value).get("PCI_SLOT_NAME")
    return slot.lower() if slot else None


def find_drm_device(
    ctx: Context, render_minor: int | None, kfd_slot: str | None
) -> tuple[str | None, str | None]:
    """(device dir, PCI slot) of a KFD node: by render minor first, else by PCI address."""
    if render_minor is not None and render_minor >= 0:
        candidate = f"{DRM}/renderD{render_minor}/device"
        if ctx.host.is_dir(candidate):
            return candidate, _slot_of(ctx, candidate) or kfd_slot
    if kfd_slot and kfd_slot in _drm_by_slot(ctx):
        return _drm_by_slot(ctx)[kfd_slot], kfd_slot
    return None, kfd_slot


def _drm_by_slot(ctx: Context) -> dict[str, str]:
    """PCI slot -> the first DRM device directory (in drm_device_dirs order) at that address, read once
    per run: finding N GPUs by address among M DRM devices reads M uevent files, not N x M (1000 GPUs
    beside 1000 DRM devices took minutes; docs/performance.md)."""

    def read() -> dict[str, str]:
        index: dict[str, str] = {}
        for device_dir in drm_device_dirs(ctx):
            slot = _slot_of(ctx, device_dir)
            if slot and slot not in index:
                index[slot] = device_dir
        return index

    return ctx.memo("facts.drm_by_slot", read)


@dataclass(frozen=True)
class Bank:
    """One KFD memory bank of a node: heap type, size, and (kernels that print it) used bytes."""

    index: str
    heap_type: int
    size: int
    used: int | None


def _banks(ctx: Context, node: int) -> list[Bank]:
    banks = []
    for bank in sorted(ctx.host.listdir(f"{KFD_NODES}/{node}/mem_banks")):
        base = f"{KFD_NODES}/{node}/mem_banks/{bank}"
        props = read_properties(ctx, f"{base}/properties")
        if "heap_type" in props:
            used = _read_int(ctx, f"{base}/used_memory")
            banks.append(Bank(bank, props["heap_type"], props.get("size_in_bytes", 0), used))
    return banks


def apu_signals(props: dict[str, int], vram_total: int | None, gtt_total: int | None) -> dict[str, bool]:
    """Weak hints for the last-resort vote; True votes APU, False votes dGPU. None of them decides
    alone: a Strix Halo's carve-out can be 96 GiB, and PCI class 0x0300 is used by APUs too."""
    signals: dict[str, bool] = {}
    if vram_total is not None and vram_total > 0:
        carveout = vram_total <= APU_MAX_CARVEOUT and (gtt_total or 0) > vram_total
        signals["small_vram_carveout"] = carveout
    if "unique_id" in props:
        signals["kfd_unique_id_zero"] = props["unique_id"] == 0
    return signals


def decide_apu(signals: dict[str, bool]) -> bool | None:
    votes = list(signals.values())
    apu, dgpu = votes.count(True), votes.count(False)
    if apu == dgpu:
        return None
    return apu > dgpu


def classify_apu(
    gfx: str,
    props: dict[str, int],
    heap_types: list[int],
    vote: dict[str, bool] | None = None,
) -> tuple[bool | None, str]:
    """(APU?, why): definitive signals first, the vote of weak hints last, else None with the reason."""
    if props.get("cpu_cores_count", 0) > 0 and props.get("simd_count", 0) > 0:
        return True, "the KFD node has both CPU cores and SIMDs (a fused APU node)"
    kinds = gpu_kinds()
    device_id = props.get("device_id")
    if device_id:
        known = kinds["device_ids"].get(f"0x{device_id:04x}")
        if known:
            what = "an APU" if known[0] == "apu" else "a dGPU"
            return known[0] == "apu", f"PCI device id 0x{device_id:04x} is the {known[1]}, {what}"
    kind = kinds["gfx"].get(gfx)
    if kind == "apu":
        return True, f"{gfx} exists only as an integrated GPU"
    if kind == "dgpu":
        return False, f"{gfx} exists only as a discrete GPU"
    if HEAP_FB_PRIVATE in heap_types:
        return False, "its KFD memory bank has a private frame buffer (VRAM beyond the CPU's BAR): a dGPU"
    if vote:
        decided = decide_apu(vote)
        if decided is not None:
            hints = ", ".join(f"{k}={v}" for k, v in sorted(vote.items()))
            return decided, f"no definitive signal; weak hints vote {'APU' if decided else 'dGPU'} ({hints})"
    both = "exists as both APU and dGPU" if kind == "both" else "is not in rocmdoctor's table"
    return None, f"cannot tell: {gfx} {both} and no definitive signal (device id, fused node, private VRAM)"


def _partition_key(props: dict[str, int]) -> tuple[int, int] | None:
    location = props.get("location_id")
    if location is None or location < 0:
        return None
    if props.get("gfx_target_version", 0) in PARTITIONABLE_TARGETS:
        location &= ~0x7
    return props.get("domain", 0), location


def _read_node(
    ctx: Context, node: int, props: dict[str, int], siblings: int, physical: str | None
) -> GpuNode:
    gfx = gfx_name(props.get("gfx_target_version", 0)) or ""
    render_minor = props.get("drm_render_minor")
    kfd_slot = pci_slot_from_location(props.get("location_id"), props.get("domain"))
    device_dir, slot = find_drm_device(ctx, render_minor, kfd_slot)
    banks = _banks(ctx, node)
    mem: dict[str, int | None] = {k: None for k in ("vram_total", "vram_used", "gtt_total", "gtt_used")}
    unread: list[str] = []
    source = None
    # A partition's DRM device is an amdgpu_xcp platform device without mem_info_*, and the first
    # partition's is the PCI device whose mem_info covers the whole GPU: a partition's memory is
    # its own KFD bank, never mem_info.
    if device_dir is not None and siblings == 1:
        for key in mem:
            path = f"{device_dir}/mem_info_{key}"
            mem[key] = _read_int(ctx, path)
            if mem[key] is None:
                unread.append(path)
        if mem["vram_total"] is not None:
            source = "mem_info"
    elif siblings == 1:
        unread.append(f"{DRM}/renderD{render_minor}/device/mem_info_*" if render_minor else f"{DRM}/*")
    heap_types = [b.heap_type for b in banks]
    frame_buffers = [b for b in banks if b.heap_type in HEAP_FRAME_BUFFER and b.size > 0]
    vote = apu_signals(props, mem["vram_total"], mem["gtt_total"])
    apu, basis = classify_apu(gfx, props, heap_types, vote)
    bank_path = f"{KFD_NODES}/{node}/mem_banks"
    if not apu and (siblings > 1 or mem["vram_total"] is None):
        # dGPU VRAM (or a partition's share of it) as the node's frame-buffer bank says.
        if frame_buffers:
            mem["vram_total"] = frame_buffers[0].size
            mem["vram_used"] = frame_buffers[0].used
            source = "kfd_bank"
            if frame_buffers[0].used is None:
                unread.append(f"{bank_path}/{frame_buffers[0].index}/used_memory")
        else:
            unread.append(f"{bank_path}/*/properties")
    elif not apu and mem["vram_used"] is None and frame_buffers and frame_buffers[0].used is not None:
        mem["vram_used"] = frame_buffers[0].used
    # A value another file supplied is not unread.
    unread = [
        u for u in unread if not any(u.endswith(f"mem_info_{k}") and v is not None for k, v in mem.items())
    ]
    return GpuNode(
        node=node,
        gfx=gfx,
        family=ctx.manifest.family_for_gfx(gfx),
        apu=apu,
        vram_total=mem["vram_total"],
        vram_used=mem["vram_used"],
        gtt_total=mem["gtt_total"],
        gtt_used=mem["gtt_used"],
        render_minor=render_minor if render_minor is not None and render_minor >= 0 else None,
        pci_slot=slot,
        device_id=props.get("device_id") or None,
        simd_count=props.get("simd_count"),
        properties=props,
        apu_basis=basis,
        memory_source=source,
        memory_unread=tuple(unread),
        physical_slot=physical or slot,
    )


def _gpu_props(ctx: Context) -> list[tuple[int, dict[str, int]]]:
    found = []
    for node in sorted(kfd_node_ids(ctx)):
        props = read_properties(ctx, f"{KFD_NODES}/{node}/properties")
        if gfx_name(props.get("gfx_target_version", 0)) is not None:
            found.append((node, props))  # a CPU node has gfx_target_version 0
    return found


def gpus(ctx: Context) -> list[GpuNode]:
    """Every GPU node of the KFD topology (gfx_target_version != 0), in node order; a partitioned
    Instinct GPU contributes one node per partition, each with its own share of memory."""

    def read() -> list[GpuNode]:
        nodes = _gpu_props(ctx)
        groups: dict[object, list[int]] = {}
        for node, props in nodes:
            groups.setdefault(_partition_key(props) or ("node", node), []).append(node)
        found = []
        for node, props in nodes:
            key = _partition_key(props)
            siblings = len(groups[key or ("node", node)])
            partitionable = props.get("gfx_target_version", 0) in PARTITIONABLE_TARGETS
            physical = pci_slot_from_location(key[1], key[0]) if key and partitionable else None
            found.append(_read_node(ctx, node, props, siblings, physical))
        return found

    return ctx.memo("facts.gpus", read)


def _read_word(ctx: Context, path: str) -> str | None:
    raw = ctx.host.read_text(path)
    if not raw.ok:
        return None
    word = raw.value.strip().splitlines()[0].strip() if raw.value.strip() else ""
    return word[:16] if word.isalnum() else None


def _read_list(ctx: Context, path: str) -> tuple[str, ...]:
    raw = ctx.host.read_text(path)
    if not raw.ok:
        return ()
    return tuple(w.strip() for w in raw.value.strip().split(",") if w.strip().isalnum())[:16]


def physical_gpus(ctx: Context) -> list[PhysicalGpu]:
    """The physical GPUs behind the KFD nodes, with their partition modes (sysfs when the kernel
    exposes it, else inferred from how many nodes share the GPU and their XCC counts)."""

    def read() -> list[PhysicalGpu]:
        order: list[str] = []
        members: dict[str, list[GpuNode]] = {}
        for gpu in gpus(ctx):
            key = gpu.physical_slot if gpu.physical_slot else f"node {gpu.node}"
            if key not in members:
                order.append(key)
            members.setdefault(key, []).append(gpu)
        out = []
        for name in order:
            nodes = members[name]
            first = nodes[0]
            slot = first.physical_slot
            base = f"{PCI_DEVICES}/{slot}" if slot else None
            current = _read_word(ctx, f"{base}/current_compute_partition") if base else None
            source = "sysfs" if current else None
            if current is None and first.gfx_target_version in PARTITIONABLE_TARGETS:
                source = "kfd"
                if len(nodes) > 1 and all(n.num_xcc == 1 for n in nodes):
                    current = "CPX"
                else:
                    current = PARTITION_MODES_BY_COUNT.get(len(nodes))
            out.append(
                PhysicalGpu(
                    pci_slot=slot,
                    gfx=first.gfx,
                    nodes=tuple(n.node for n in nodes),
                    compute_partition=current,
                    compute_partition_source=source if current else None,
                    memory_partition=_read_word(ctx, f"{base}/current_memory_partition") if base else None,
                    available_compute_partitions=(
                        _read_list(ctx, f"{base}/available_compute_partition") if base else ()
                    ),
                    available_memory_partitions=(
                        _read_list(ctx, f"{base}/available_memory_partition") if base else ()
                    ),
                )
            )
        return out

    return ctx.memo("facts.physical_gpus", read)


def partition_of(ctx: Context, gpu: GpuNode) -> tuple[PhysicalGpu, int] | None:
    """(physical GPU, index) when `gpu` is one of several partitions, else None."""

    def read() -> dict[int, tuple[PhysicalGpu, int]]:
        # first physical GPU listing the node wins, as the scan this replaces (one lookup, not N x N)
        index: dict[int, tuple[PhysicalGpu, int]] = {}
        for phys in physical_gpus(ctx):
            for i, node in enumerate(phys.nodes):
                index.setdefault(node, (phys, i))
        return index

    found = ctx.memo("facts.partition_of", read).get(gpu.node)
    return found if found is not None and found[0].partitioned else None


def drm_device_of(ctx: Context, gpu: GpuNode) -> str | None:
    return find_drm_device(ctx, gpu.render_minor, gpu.pci_slot)[0]


def meminfo(ctx: Context) -> dict[str, int]:
    """/proc/meminfo in bytes ('MemTotal', 'MemAvailable', ...)."""

    def read() -> dict[str, int]:
        raw = ctx.host.read_text(MEMINFO)
        out: dict[str, int] = {}
        if not raw.ok:
            return out
        for line in raw.value.splitlines():
            key, sep, rest = line.partition(":")
            parts = rest.split()
            if not sep or not parts:
                continue
            try:
                value = int(parts[0])
            except ValueError:
                continue
            unit = parts[1].lower() if len(parts) > 1 else ""
            out[key.strip()] = value * 1024 if unit == "kb" else value
        return out

    return ctx.memo("facts.meminfo", read)


def memory_pool(gpu: GpuNode) -> str:
    """The pool the HIP runtime reports as the GPU's memory: "vram" or "gtt".

    A dGPU has its VRAM. An APU reports the larger of its BIOS carve-out and its GTT: with the
    usual small carve-out that is GTT, but a large "VRAM" setting becomes the device's whole memory
    (public captures: ROCm/TheRock#894 total_memory=98304MB on a 96 GiB carve-out; vLLM's "Free
    memory on device (23.19/64.0 GiB)" on a 64 GiB one, kyuz0/amd-strix-halo-vllm-toolboxes#81)."""
    if not gpu.apu:
        return "vram"
    if gpu.vram_total is not None and gpu.gtt_total is not None and gpu.vram_total > gpu.gtt_total:
        return "vram"
    return "gtt"


def usable_memory(ctx: Context, gpu: GpuNode) -> tuple[int | None, int | None]:
    """(total, free) as the HIP runtime reports them: VRAM on a dGPU (and on an APU whose carve-out
    is larger than GTT); otherwise an APU's GTT pool, whose free part is also bounded by what the
    kernel can still hand out (MemAvailable)."""
    if memory_pool(gpu) == "gtt":
        if gpu.gtt_total is None:
            return None, None
        available = meminfo(ctx).get("MemAvailable")
        if available is None:
            return gpu.gtt_total, None  # GTT pages come out of RAM: without MemAvailable, free is unknown
        gtt_free = gpu.gtt_total - gpu.gtt_used if gpu.gtt_used is not None else gpu.gtt_total
        return gpu.gtt_total, max(0, min(gtt_free, available))
    if gpu.vram_total is None:
        return None, None
    free = gpu.vram_total - gpu.vram_used if gpu.vram_used is not None else None
    return gpu.vram_total, None if free is None else max(0, free)


def kernel_release(ctx: Context) -> str | None:
    def read() -> str | None:
        raw: Read = ctx.host.read_text(OSRELEASE)
        return raw.value.strip().splitlines()[0][:200] if raw.ok else None

    return ctx.memo("facts.kernel_release", read)


def distro_info(ctx: Context) -> dict[str, Any]:
    return ctx.memo("facts.distro", ctx.host.distro)


def gpu_summary(gpu: GpuNode, index: int | None = None) -> dict[str, Any]:
    """The report's record of one GPU node; `index` is its ROCR_VISIBLE_DEVICES index."""
    return {
        "node": gpu.node,
        "gfx": gpu.gfx,
        "family": gpu.family,
        "apu": gpu.apu,
        "vram_total": gpu.vram_total,
        "vram_used": gpu.vram_used,
        "gtt_total": gpu.gtt_total,
        "gtt_used": gpu.gtt_used,
        "render_minor": gpu.render_minor,
        "pci_slot": gpu.pci_slot,
        "rocr_index": index,
        "device_id": gpu.device_id,
        "simd_count": gpu.simd_count,
        "apu_basis": gpu.apu_basis,
    }


def physical_summary(phys: PhysicalGpu) -> dict[str, Any]:
    return {
        "pci_slot": phys.pci_slot,
        "gfx": phys.gfx,
        "nodes": list(phys.nodes),
        "partitions": len(phys.nodes),
        "compute_partition": phys.compute_partition,
        "compute_partition_source": phys.compute_partition_source,
        "memory_partition": phys.memory_partition,
        "available_compute_partitions": list(phys.available_compute_partitions),
        "available_memory_partitions": list(phys.available_memory_partitions),
    }


def host_facts(ctx: Context) -> dict[str, Any]:
    """The report's `host` section: what was found, independent of any verdict."""
    info = distro_info(ctx)
    return {
        "kernel": kernel_release(ctx),
        "distro": {
            "id": info["id"] or None,
            "version": info["version"] or None,
            "name": info["name"] or None,
        },
        "gpus": [gpu_summary(g, i) for i, g in enumerate(gpus(ctx))],
        "physical_gpus": [physical_summary(p) for p in physical_gpus(ctx)],
    }


def rocr_index(ctx: Context, gpu: GpuNode) -> int:
    """The index ROCR_VISIBLE_DEVICES gives this GPU node: its rank among all GPU nodes in KFD order."""
    ranks = ctx.memo("facts.rocr_index", lambda: {g.node: i for i, g in enumerate(gpus(ctx))})
    return ranks[gpu.node]


def serving_gpus(ctx: Context) -> list[GpuNode]:
    """The GPUs vLLM serves on: those `--gpu` names, else rocmdoctor.facts.gpu_choice's rule (the one `unit` and
    `instances` pin)."""

    def read() -> list[GpuNode]:
        found = gpus(ctx)
        if ctx.options.gpus:
            picked = [
                g
                for g in found
                if any(gpu_spec_matches(s, g.node, g.pci_slot or g.physical_slot) for s in ctx.options.gpus)
            ]
            if picked:
                return picked
        return serving_nodes(found)

    return list(ctx.memo("facts.serving_gpus", read))


def served_nodes(ctx: Context) -> frozenset[int]:
    """The KFD nodes of serving_gpus, for membership in a loop over every GPU (a list was N x N)."""
    return ctx.memo("facts.served_nodes", lambda: frozenset(g.node for g in serving_gpus(ctx)))


def gpu_identity(ctx: Context, gpu: GpuNode) -> dict[str, Any]:
    """How a finding names a GPU: stable identity (KFD node, PCI slot, render node), the index
    ROCR_VISIBLE_DEVICES uses for it, and whether vLLM serves on it by default."""
    unambiguous = ctx.memo("facts.unambiguous", lambda: bool(ctx.options.gpus) or not ambiguous(gpus(ctx)))
    return {
        "kfd_node": gpu.node,
        "pci_slot": gpu.pci_slot,
        "render_node": f"/dev/dri/renderD{gpu.render_minor}" if gpu.render_minor is not None else None,
        "rocr_index": rocr_index(ctx, gpu),
        "served": gpu.node in served_nodes(ctx) and unambiguous,
    }


def gpu_label(ctx: Context, gpu: GpuNode) -> str:
    """'gfx1201 node 1 (0000:05:00.0, renderD128, ROCR index 0)'."""
    where = [gpu.pci_slot or "no PCI address"]
    if gpu.render_minor is not None:
        where.append(f"renderD{gpu.render_minor}")
    where.append(f"ROCR index {rocr_index(ctx, gpu)}")
    return f"{gpu.gfx} node {gpu.node} ({', '.join(where)})"


def not_served(ctx: Context) -> list[str]:
    """The GPUs vLLM does not serve on by default, each with why (for the findings that skip them)."""
    found = gpus(ctx)
    served = served_nodes(ctx)
    out = []
    for gpu in found:
        if gpu.node in served:
            continue
        if not gpu.family:
            why = f"no vllm-rocm bundle for {gpu.gfx}"
        elif ctx.options.gpus:
            why = "not named by --gpu"
        else:
            why = "an iGPU beside a supported dGPU"
        out.append(f"{gpu_label(ctx, gpu)}: {why}")
    return out
