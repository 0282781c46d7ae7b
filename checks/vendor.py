"""Other GPU vendors beside the AMD GPU: an NVIDIA GPU with its driver makes vLLM refuse to start.

vLLM picks its platform by asking every built-in plugin (vllm/platforms/__init__.py,
`resolve_current_platform_cls_qualname`); with two active it raises "Only one platform plugin can be
activated, but got: ['cuda', 'rocm']". The CUDA plugin is active when NVML initialises and counts a
GPU (`cuda_platform_plugin`: `import_pynvml()`, `nvmlInit()`, `nvmlDeviceGetCount() > 0`), and
`import_pynvml` imports vLLM's own copy (`vllm.third_party.pynvml`), so no pip package decides it:
the NVIDIA kernel driver and its device nodes do. Measured on an H100 host (nvidia 580.159.04): with
/dev/nvidia* unopenable, `pynvml.nvmlInit()` raises NVMLError_NoPermission, whose class name holds
"nvml", which vLLM treats as "no CUDA"; but a root process whose /dev merely lacks the nodes gets them
recreated by NVML, so the remedy is a device cgroup or a non-root user (tests/fixtures/checks/_captures/).
"""

from __future__ import annotations

from dataclasses import dataclass

from rocmdoctor.checks import check
from rocmdoctor.checks.facts import DRM, drm_device_dirs, parse_uevent
from rocmdoctor.model import Result, Severity, passed, warned
from rocmdoctor.registry import Context

PCI_DEVICES = "/sys/bus/pci/devices"
NVIDIA_VENDOR_ID = 0x10DE
PCI_CLASS_DISPLAY = 0x03  # base class: VGA 0x0300, 3D controller 0x0302 (H100), other 0x0380
NVIDIA_PROC = "/proc/driver/nvidia"
NVIDIA_MODULE = "/sys/module/nvidia"
NVIDIA_NODES = "/dev/nvidia*"
VLLM_PLATFORM_ERROR = "Only one platform plugin can be activated, but got: ['cuda', 'rocm']"

REMEDY = (
    "vLLM's CUDA platform turns on whenever NVML (libnvidia-ml.so.1 of the NVIDIA driver) can open "
    "/dev/nvidia* and counts a GPU; vLLM carries its own pynvml (vllm.third_party.pynvml), so removing "
    "nvidia-ml-py or a CUDA torch from the environment does not help. Keep /dev/nvidia* away from vLLM: "
    "run it through `rocmdoctor unit` (its DevicePolicy=closed allows only /dev/kfd and the DRM nodes, "
    "so NVML fails and only ROCm activates; hiding the nodes alone is not enough for root, NVML recreates "
    "them), or in a container given only --device /dev/kfd "
    "--device /dev/dri, or for a foreground run `sudo systemd-run --pty --uid=$USER -p DevicePolicy=closed "
    "-p 'DeviceAllow=/dev/kfd rw' -p 'DeviceAllow=char-drm rw' vllm serve ...`; or unload the NVIDIA "
    "driver while vLLM runs (`sudo modprobe -r nvidia_drm nvidia_modeset nvidia_uvm nvidia`)."
)


@dataclass(frozen=True)
class PciGpu:
    slot: str
    vendor: int
    device: int | None
    pci_class: int
    driver: str | None

    def describe(self) -> str:
        device = f"{self.device:04x}" if self.device is not None else "?"
        return f"{self.vendor:04x}:{device} at {self.slot} (driver {self.driver or 'none'})"


def pci_display_devices(
    ctx: Context, vendor: int, classes: tuple[int, ...] = (PCI_CLASS_DISPLAY,)
) -> list[PciGpu]:
    """PCI functions of one vendor and base class (display by default: VGA, 3D, other), from
    /sys/bus/pci/devices."""
    found = []
    for path in ctx.host.glob(f"{PCI_DEVICES}/*"):
        vendor_read = ctx.host.read_int(f"{path}/vendor")
        if not vendor_read.ok or vendor_read.value != vendor:
            continue
        class_read = ctx.host.read_int(f"{path}/class")
        if not class_read.ok or class_read.value >> 16 not in classes:
            continue
        device_read = ctx.host.read_int(f"{path}/device")
        link = ctx.host.readlink(f"{path}/driver")
        found.append(
            PciGpu(
                slot=path.rsplit("/", 1)[-1],
                vendor=vendor,
                device=device_read.value if device_read.ok else None,
                pci_class=class_read.value,
                driver=link.value.rstrip("/").rsplit("/", 1)[-1] if link.ok else None,
            )
        )
    return found


def drm_display_devices(ctx: Context, vendor: int) -> list[PciGpu]:
    """The same from the DRM class (`card*`/`renderD*` `device/uevent`: PCI_ID, PCI_SLOT_NAME, DRIVER), which is
    all a host shows where /sys/bus/pci is not visible, and what gpu.present already reads."""
    found: dict[str, PciGpu] = {}
    for device_dir in drm_device_dirs(ctx):
        raw = ctx.host.read_text(f"{device_dir}/uevent", limit=64 * 1024)
        if not raw.ok:
            continue
        uevent = parse_uevent(raw.value)
        vendor_hex, _, device_hex = uevent.get("PCI_ID", "").partition(":")
        try:
            if int(vendor_hex, 16) != vendor:
                continue
            device = int(device_hex, 16)
        except ValueError:
            continue
        slot = uevent.get("PCI_SLOT_NAME", device_dir).lower()
        try:
            pci_class = int(uevent.get("PCI_CLASS", "0"), 16)
        except ValueError:
            pci_class = 0
        found.setdefault(slot, PciGpu(slot, vendor, device, pci_class, uevent.get("DRIVER") or None))
    return list(found.values())


def nvidia_gpus(ctx: Context) -> list[PciGpu]:
    """NVIDIA display devices from the PCI bus and the DRM class, one per PCI slot."""
    by_slot = {g.slot: g for g in pci_display_devices(ctx, NVIDIA_VENDOR_ID)}
    for gpu in drm_display_devices(ctx, NVIDIA_VENDOR_ID):
        by_slot.setdefault(gpu.slot, gpu)
    return list(by_slot.values())


def nvidia_driver_version(ctx: Context) -> str | None:
    """The loaded NVIDIA kernel driver's version, or None when it is not loaded."""
    version = ctx.host.read_text(f"{NVIDIA_MODULE}/version", limit=256)
    if version.ok:
        return version.value.strip()[:40]
    proc = ctx.host.read_text(f"{NVIDIA_PROC}/version", limit=4096)
    if proc.ok:
        first = proc.value.splitlines()[0] if proc.value.splitlines() else ""
        return " ".join(first.split())[:120] or "loaded"
    if ctx.host.exists(NVIDIA_MODULE) or ctx.host.exists(NVIDIA_PROC):
        return "loaded"
    return None


@check(
    "gpu.mixed_vendor",
    "No NVIDIA GPU that would start vLLM's CUDA platform beside ROCm",
    severity=Severity.DEGRADING,
    depends=("gpu.present",),
    reads=(
        f"{PCI_DEVICES}/*/vendor",
        f"{PCI_DEVICES}/*/class",
        f"{PCI_DEVICES}/*/device",
        f"{PCI_DEVICES}/*/driver",
        f"{NVIDIA_MODULE}/version",
        f"{NVIDIA_PROC}/version",
        NVIDIA_NODES,
        f"{DRM}/card*/device/uevent",
        f"{DRM}/renderD*/device/uevent",
    ),
)
def gpu_mixed_vendor(ctx: Context) -> Result:
    nvidia = nvidia_gpus(ctx)
    driver = nvidia_driver_version(ctx)
    if driver is None and any(g.driver == "nvidia" for g in nvidia):
        driver = "nvidia (bound to the GPU)"
    nodes = [p for p in ctx.host.glob(NVIDIA_NODES) if ctx.host.stat(p) is not None]
    details = {
        "nvidia_gpus": [g.describe() for g in nvidia],
        "nvidia_driver": driver,
        "nvidia_device_nodes": nodes,
    }
    if not nvidia and driver is None and not nodes:
        return passed("no NVIDIA GPU or driver: vLLM's ROCm platform is the only one", **details)
    if driver is None and not nodes:
        return passed(
            f"NVIDIA GPU {', '.join(g.describe() for g in nvidia)} without NVIDIA's driver: NVML cannot "
            "initialise, so vLLM activates only ROCm (installing the NVIDIA driver would change that)",
            **details,
        )
    what = ", ".join(g.describe() for g in nvidia) or "no PCI function visible"
    return warned(
        f"NVIDIA GPU beside the AMD one ({what}; driver {driver or 'device nodes only'}"
        f"{'; ' + ', '.join(nodes) if nodes else ''}): vLLM started with /dev/nvidia* visible fails with "
        f'"{VLLM_PLATFORM_ERROR}"',
        REMEDY,
        **details,
    )
