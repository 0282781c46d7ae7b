"""AMD GPUs on the PCI bus that no driver bound: named, with the likely reason amdgpu did not take them.

A GPU with no driver has no KFD node and no DRM device, so everything else in the report sees nothing,
or sees the firmware framebuffer (simpledrm/efifb) as an "unknown" display. The PCI bus still lists it:
/sys/bus/pci/devices/<slot>/{vendor,device,class} and, when bound, a `driver` link. AMD GPUs are PCI
base class 0x03 (display: VGA 0x0300, other 0x0380 as Strix Halo's 1002:1586 reports PCI_CLASS=38000)
or 0x12 (processing accelerator: Instinct parts).

The reasons looked for, each from a file the reason leaves behind:
- `blacklist amdgpu` / `install amdgpu /bin/false` in modprobe.d (modprobe.d(5));
- `nomodeset`, `amdgpu.modeset=0` or `modprobe.blacklist=amdgpu` on /proc/cmdline: amdgpu refuses to load
  without KMS (amdgpu_drv.c: "amdgpu is not loaded ... nomodeset");
- an amdgpu DKMS tree (/var/lib/dkms/amdgpu/<version>/) with no build for the running kernel: modprobe
  then finds no module, or the in-tree one when the package removed it;
- Secure Boot on (the SecureBoot EFI variable's value byte is 1) with a DKMS module: an unsigned or
  MOK-unenrolled module is refused ("Key was rejected by service");
- amdgpu loaded and still not bound: the probe failed (firmware missing, an unsupported device id).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rocmdoctor.checks import check
from rocmdoctor.checks.facts import GPU_READS, OSRELEASE, gpu_kinds, gpus, kernel_release
from rocmdoctor.model import Result, passed, skipped, warned
from rocmdoctor.registry import Context

PCI_DEVICES = "/sys/bus/pci/devices"
AMD_VENDOR_ID = 0x1002
GPU_CLASSES = (0x03, 0x12)  # display, processing accelerator
CMDLINE = "/proc/cmdline"
MODPROBE_DIRS = ("/etc/modprobe.d", "/usr/lib/modprobe.d", "/lib/modprobe.d", "/run/modprobe.d")
DKMS_TREE = "/var/lib/dkms/amdgpu"
SECURE_BOOT = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-e98c0bb7e4e5"
AMDGPU_MODULE = "/sys/module/amdgpu"

READS = (
    f"{PCI_DEVICES}/*/vendor",
    f"{PCI_DEVICES}/*/device",
    f"{PCI_DEVICES}/*/class",
    f"{PCI_DEVICES}/*/driver",
    CMDLINE,
    OSRELEASE,
    *(f"{d}/*.conf" for d in MODPROBE_DIRS),
    f"{DKMS_TREE}/*/*",
    SECURE_BOOT,
    AMDGPU_MODULE,
)


@dataclass(frozen=True)
class AmdPciGpu:
    slot: str
    device: int | None
    pci_class: int
    driver: str | None

    @property
    def name(self) -> str | None:
        if self.device is None:
            return None
        key = f"0x{self.device:04x}"
        kinds = gpu_kinds()
        instinct = kinds["device_ids"].get(key)
        return kinds.get("pci_names", {}).get(key) or (instinct[1] if instinct else None)

    def describe(self) -> str:
        device = f"{self.device:04x}" if self.device is not None else "?"
        name = f" ({self.name})" if self.name else ""
        return f"1002:{device}{name} at {self.slot}"


def amd_pci_gpus(ctx: Context) -> list[AmdPciGpu]:
    """AMD display and accelerator functions on the PCI bus, bound or not."""
    # Imported here: importing vendor at module load would register its check before gpu.present's.
    from rocmdoctor.checks.vendor import pci_display_devices

    return [
        AmdPciGpu(g.slot.lower(), g.device, g.pci_class, g.driver)
        for g in pci_display_devices(ctx, AMD_VENDOR_ID, GPU_CLASSES)
    ]


def _modprobe_blocks(ctx: Context) -> list[str]:
    out = []
    for folder in MODPROBE_DIRS:
        for path in ctx.host.glob(f"{folder}/*.conf"):
            raw = ctx.host.read_text(path)
            if not raw.ok:
                continue
            for line in raw.value.splitlines():
                words = line.split("#", 1)[0].split()
                if words[:2] == ["blacklist", "amdgpu"] or (
                    words[:2] == ["install", "amdgpu"]
                    and any(w.endswith(("false", "true")) for w in words[2:])
                ):
                    out.append(f"{path}: `{' '.join(words)}`")
    return out


def _cmdline_blocks(ctx: Context) -> list[str]:
    raw = ctx.host.read_text(CMDLINE)
    if not raw.ok:
        return []
    words = raw.value.split()
    found = [w for w in words if w in ("nomodeset", "amdgpu.modeset=0")]
    found += [
        w for w in words if w.startswith("modprobe.blacklist=") and "amdgpu" in w.split("=", 1)[1].split(",")
    ]
    return found


def _dkms_versions(ctx: Context) -> dict[str, list[str]]:
    """amdgpu DKMS source versions -> kernels it was built for (/var/lib/dkms/amdgpu/<ver>/<kernel>/)."""
    out: dict[str, list[str]] = {}
    for version in ctx.host.listdir(DKMS_TREE):
        if version in ("original_module", "kernel") or not ctx.host.is_dir(f"{DKMS_TREE}/{version}"):
            continue
        kernels = [k for k in ctx.host.listdir(f"{DKMS_TREE}/{version}") if k not in ("source", "build")]
        out[version] = kernels
    return out


def _secure_boot(ctx: Context) -> bool | None:
    raw = ctx.host.read_text(SECURE_BOOT, limit=64)
    if not raw.ok:
        return None
    return raw.value.endswith("\x01")


def unbound_reasons(ctx: Context) -> list[dict[str, str]]:
    """Likely reasons amdgpu did not bind, each {reason, evidence, remedy}; the first is the likeliest."""
    reasons: list[dict[str, str]] = []
    for entry in _modprobe_blocks(ctx):
        path = entry.split(":", 1)[0]
        reasons.append(
            {
                "reason": "blacklist",
                "evidence": entry,
                "remedy": f"remove that line from {path}, then `sudo update-initramfs -u` (or `dracut -f`) and reboot",
            }
        )
    for word in _cmdline_blocks(ctx):
        reasons.append(
            {
                "reason": "cmdline",
                "evidence": f"`{word}` on the kernel command line ({CMDLINE})",
                "remedy": f"remove `{word}` from the kernel command line (`rocmdoctor fix-kernel` names the "
                "distro's tool) and reboot",
            }
        )
    kernel = kernel_release(ctx)
    dkms = _dkms_versions(ctx)
    built = [v for v, kernels in dkms.items() if kernel and any(k == kernel for k in kernels)]
    if dkms and not built:
        versions = ", ".join(
            f"{v} (built for {', '.join(k) or 'no kernel'})" for v, k in sorted(dkms.items())
        )
        reasons.append(
            {
                "reason": "dkms_not_built",
                "evidence": f"amdgpu DKMS {versions}, none for the running kernel {kernel}",
                "remedy": f"build it for this kernel (`sudo dkms autoinstall -k {kernel}`; install the kernel "
                "headers first), or on a Ryzen AI / Radeon host remove amdgpu-dkms and use the in-tree driver "
                "(`sudo apt remove --purge amdgpu-dkms`), then reboot",
            }
        )
    if dkms and _secure_boot(ctx):
        reasons.append(
            {
                "reason": "secure_boot",
                "evidence": f"Secure Boot is on ({SECURE_BOOT}) and amdgpu comes from DKMS",
                "remedy": "enroll the DKMS signing key (`sudo mokutil --import /var/lib/dkms/mok.pub`, then "
                "confirm in MOK Manager at the next boot), or use the signed in-tree amdgpu",
            }
        )
    if not reasons and ctx.host.exists(AMDGPU_MODULE):
        reasons.append(
            {
                "reason": "probe_failed",
                "evidence": f"amdgpu is loaded ({AMDGPU_MODULE}) and did not bind",
                "remedy": "read `sudo dmesg | grep -i amdgpu` for the probe error (missing firmware: install "
                "the distro's linux-firmware; an unknown device id: a newer kernel)",
            }
        )
    if not reasons:
        reasons.append(
            {
                "reason": "not_loaded",
                "evidence": f"amdgpu is not loaded (no {AMDGPU_MODULE}) and nothing blocks it",
                "remedy": "load it (`sudo modprobe amdgpu`) and read `sudo dmesg | grep -i amdgpu` if it fails",
            }
        )
    return reasons


def unbound_finding(ctx: Context) -> tuple[str, str, dict[str, Any]] | None:
    """(summary, remedy, details) for AMD GPUs without a driver, or None when every one is bound."""
    unbound = [g for g in amd_pci_gpus(ctx) if g.driver is None]
    if not unbound:
        return None
    reasons = unbound_reasons(ctx)
    names = "; ".join(g.describe() for g in unbound)
    summary = f"AMD GPU with no driver bound: {names}; likely because {reasons[0]['evidence']}"
    remedy = "; ".join(r["remedy"] for r in reasons).rstrip(".") + "."
    remedy = remedy[:1].upper() + remedy[1:]
    details = {
        "unbound": [
            {
                "slot": g.slot,
                "pci_id": f"1002:{g.device or 0:04x}",
                "class": f"0x{g.pci_class:06x}",
                "name": g.name,
            }
            for g in unbound
        ],
        "reasons": reasons,
    }
    return summary, remedy, details


@check("gpu.unbound", "Every AMD GPU on the PCI bus has a driver bound", reads=(*READS, *GPU_READS))
def gpu_unbound(ctx: Context) -> Result:
    if not gpus(ctx):
        # One root cause, one failure: gpu.present names the unbound GPU and why.
        return skipped("no KFD GPU node: gpu.present reports what the PCI bus shows")
    pci = amd_pci_gpus(ctx)
    if not pci:
        return skipped(
            "no AMD display or accelerator function on the PCI bus (or /sys/bus/pci is not visible)"
        )
    finding = unbound_finding(ctx)
    if finding is None:
        bound = ", ".join(f"{g.describe()} ({g.driver})" for g in pci)
        return passed(f"bound: {bound}")
    summary, remedy, details = finding
    return warned(summary, remedy, **details)
