"""Facts about the host's AMD GPUs and memory that several checks (and install/serve) share.

Everything here reads through `ctx.host` and is memoized on the context, so a run reads each
sysfs file once. The rules follow ../shared/reference/notes/host-facts.md: KFD `properties` are
parsed into dicts (kernels add and drop lines), gfx names use "gfx%d%x%x", a KFD node finds its
DRM device through `drm_render_minor`, falling back to the PCI address in location_id/domain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..families import family_for_gfx
from ..host import Read
from ..registry import Context

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
)
MEMINFO_READS = (MEMINFO,)
# What `distro` consults under a root: os-release, and release files such as /etc/debian_version,
# which give the point release (12.11 rather than 12).
DISTRO_READS = ("/etc/os-release", "/usr/lib/os-release", "/etc/*-release", "/etc/*_version")

AMD_VENDOR_ID = 0x1002
# Carve-outs of APUs are 512 MiB to 4 GiB (BIOS UMA setting); no ROCm-capable dGPU is that small.
APU_MAX_CARVEOUT = 4 << 30
# gfx targets that exist only as integrated GPUs (Phoenix, Strix Point, Strix Halo, Krackan, ...).
APU_ONLY_GFX = frozenset(
    {"gfx90c", "gfx1035", "gfx1036", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"}
)
# KFD mem bank heap types (kfd_crat.h): system memory (APU) vs frame buffer (dGPU VRAM).
HEAP_SYSTEM = 1
HEAP_FRAME_BUFFER = (2, 3)


@dataclass(frozen=True)
class GpuNode:
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

    @property
    def gfx_target_version(self) -> int:
        return self.properties.get("gfx_target_version", 0)


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
    return "gfx%d%x%x" % (major, minor, step)


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


def kfd_node_ids(ctx: Context) -> list[int]:
    return [int(n) for n in ctx.host.listdir(KFD_NODES) if n.isdigit()]


def drm_device_dirs(ctx: Context) -> list[str]:
    """card<N> and renderD<N> device directories in numeric order (card10 after card9)."""
    names = ctx.host.listdir(DRM)
    return [
        f"{DRM}/{n}/device"
        for n in names
        if (n.startswith("card") and n[4:].isdigit()) or (n.startswith("renderD") and n[7:].isdigit())
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
    if kfd_slot:
        for device_dir in drm_device_dirs(ctx):
            if _slot_of(ctx, device_dir) == kfd_slot:
                return device_dir, kfd_slot
    return None, kfd_slot


def _bank_sizes(ctx: Context, node: int) -> list[tuple[int, int]]:
    """(heap_type, size_in_bytes) of the node's KFD memory banks."""
    banks = []
    for bank in ctx.host.listdir(f"{KFD_NODES}/{node}/mem_banks"):
        props = read_properties(ctx, f"{KFD_NODES}/{node}/mem_banks/{bank}/properties")
        if "heap_type" in props:
            banks.append((props["heap_type"], props.get("size_in_bytes", 0)))
    return banks


def apu_signals(
    gfx: str,
    props: dict[str, int],
    banks: list[tuple[int, int]],
    vram_total: int | None,
    gtt_total: int | None,
    device_dir: str | None,
    ctx: Context,
) -> dict[str, bool]:
    """Independent hints; True votes APU, False votes dGPU (PCI class alone is not enough)."""
    signals: dict[str, bool] = {}
    if gfx in APU_ONLY_GFX:
        signals["apu_only_gfx"] = True
    heaps = {heap for heap, _ in banks}
    if HEAP_SYSTEM in heaps and not heaps & set(HEAP_FRAME_BUFFER):
        signals["kfd_system_heap"] = True
    elif heaps & set(HEAP_FRAME_BUFFER):
        signals["kfd_system_heap"] = False
    if vram_total is not None and vram_total > 0:
        carveout = vram_total <= APU_MAX_CARVEOUT and (gtt_total or 0) > vram_total
        signals["small_vram_carveout"] = carveout
    if "unique_id" in props:
        signals["kfd_unique_id_zero"] = props["unique_id"] == 0
    if device_dir is not None and ctx.host.exists(f"{device_dir}/board_info"):
        signals["board_info_present"] = False
    return signals


def decide_apu(signals: dict[str, bool]) -> bool | None:
    if signals.get("apu_only_gfx"):
        return True
    votes = list(signals.values())
    apu, dgpu = votes.count(True), votes.count(False)
    if apu == dgpu:
        return None
    return apu > dgpu


def _read_node(ctx: Context, node: int) -> GpuNode | None:
    props = read_properties(ctx, f"{KFD_NODES}/{node}/properties")
    gfx = gfx_name(props.get("gfx_target_version", 0))
    if gfx is None:
        return None  # a CPU node (or a properties file with no usable target)
    render_minor = props.get("drm_render_minor")
    kfd_slot = pci_slot_from_location(props.get("location_id"), props.get("domain"))
    device_dir, slot = find_drm_device(ctx, render_minor, kfd_slot)
    mem: dict[str, int | None] = {}
    for key in ("vram_total", "vram_used", "gtt_total", "gtt_used"):
        mem[key] = _read_int(ctx, f"{device_dir}/mem_info_{key}") if device_dir else None
    banks = _bank_sizes(ctx, node)
    if mem["vram_total"] is None:
        # dGPUs report their VRAM as the frame-buffer bank; APU banks are system memory, not VRAM.
        fb = [size for heap, size in banks if heap in HEAP_FRAME_BUFFER and size > 0]
        mem["vram_total"] = fb[0] if fb else None
    signals = apu_signals(gfx, props, banks, mem["vram_total"], mem["gtt_total"], device_dir, ctx)
    device_id = props.get("device_id") or None
    return GpuNode(
        node=node,
        gfx=gfx,
        family=family_for_gfx(gfx),
        apu=decide_apu(signals),
        vram_total=mem["vram_total"],
        vram_used=mem["vram_used"],
        gtt_total=mem["gtt_total"],
        gtt_used=mem["gtt_used"],
        render_minor=render_minor if render_minor is not None and render_minor >= 0 else None,
        pci_slot=slot,
        device_id=device_id,
        simd_count=props.get("simd_count"),
        properties=props,
    )


def gpus(ctx: Context) -> list[GpuNode]:
    """Every GPU node of the KFD topology (gfx_target_version != 0), in node order."""

    def read() -> list[GpuNode]:
        found = []
        for node in kfd_node_ids(ctx):
            gpu = _read_node(ctx, node)
            if gpu is not None:
                found.append(gpu)
        return found

    return ctx.memo("facts.gpus", read)


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


def usable_memory(ctx: Context, gpu: GpuNode) -> tuple[int | None, int | None]:
    """(total, free) as the HIP runtime reports them: VRAM on a dGPU; on an APU the GTT pool,
    whose free part is also bounded by what the kernel can still hand out (MemAvailable)."""
    if gpu.apu:
        if gpu.gtt_total is None:
            return None, None
        free = gpu.gtt_total - gpu.gtt_used if gpu.gtt_used is not None else gpu.gtt_total
        available = meminfo(ctx).get("MemAvailable")
        if available is not None:
            free = min(free, available)
        elif gpu.gtt_used is None:
            return gpu.gtt_total, None
        return gpu.gtt_total, max(0, free)
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


def gpu_summary(gpu: GpuNode) -> dict[str, Any]:
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
        "device_id": gpu.device_id,
        "simd_count": gpu.simd_count,
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
        "gpus": [gpu_summary(g) for g in gpus(ctx)],
    }
