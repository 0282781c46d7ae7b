"""Pure rules about kernels: release parsing, the minimum carrying the CWSR export, and the kernel's
CWSR size formula (kfd_queue.c `kfd_queue_ctx_save_restore_size`). No host access here."""

from __future__ import annotations

import re
from dataclasses import dataclass

# GPUs whose queues crash or hang without the exported sizes and the VGPR bump (gfx1151).
CWSR_REQUIRED_TARGETS = frozenset({110501})
GENERIC_MINIMUM = (6, 18, 4)
LTS_BACKPORT = (6, 12, 64)  # 6.12.y stable also carries the export
UBUNTU_HWE = ((6, 17, 0), 19)  # 6.17.0-19.19~24.04.2 (Launchpad bug 2134491)
UBUNTU_OEM = ((6, 14, 0), 1018)

_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:-(\d+))?(.*)$")


@dataclass(frozen=True)
class KernelRelease:
    text: str
    base: tuple[int, int, int]
    abi: int | None  # Ubuntu/Fedora package revision: 6.17.0-19-generic -> 19
    flavour: str  # what follows: '-generic', '-oem', '-1-cachyos', '.fc43.x86_64'

    @property
    def is_oem(self) -> bool:
        return "oem" in self.flavour


def parse_release(text: str | None) -> KernelRelease | None:
    match = _RELEASE.match((text or "").strip())
    if not match:
        return None
    major, minor, patch, abi, rest = match.groups()
    return KernelRelease(
        text.strip(), (int(major), int(minor), int(patch or 0)), int(abi) if abi else None, rest
    )


def minimum_for(distro_id: str | None, distro_version: str | None) -> str:
    """The minimum to name for this distro, as a user would install it."""
    if distro_id == "ubuntu" and (distro_version or "").startswith("24.04"):
        return "6.17.0-19 (HWE) or 6.14.0-1018 (OEM), or any 6.18.4+"
    if distro_id == "ubuntu" and (distro_version or "").startswith("22.04"):
        return "6.18.4 (Ubuntu 22.04 ships none: use a mainline build or upgrade to 24.04)"
    return "6.18.4 (or 6.12.64 on the 6.12 LTS line)"


def carries_cwsr_export(release: KernelRelease, distro_id: str | None) -> bool:
    """Whether this kernel release is known to carry the cwsr_size/ctl_stack_size export."""
    if release.base >= GENERIC_MINIMUM:
        return True
    if release.base[:2] == LTS_BACKPORT[:2] and release.base >= LTS_BACKPORT:
        return True
    if distro_id == "ubuntu" and release.abi is not None:
        base, abi = UBUNTU_OEM if release.is_oem else UBUNTU_HWE
        return release.base == base and release.abi >= abi
    return False


def vgpr_bytes(target: int) -> int:
    if target in (110000, 110001, 110501, 120000, 120001):
        return 0x60000
    if 90400 <= target < 90500 or target in (90010, 90008, 90500):
        return 0x80000
    return 0x40000


def _align(value: int, to: int = 4096) -> int:
    return (value + to - 1) // to * to


def expected_cwsr(props: dict[str, int]) -> tuple[int, int] | None:
    """(cwsr_size, ctl_stack_size) per XCC that a fixed kernel prints for this node, or None when the
    node lacks what the formula needs."""
    try:
        target = props["gfx_target_version"]
        num_xcc = props.get("num_xcc", 1) or 1
        cu = props["simd_count"] // props["simd_per_cu"] // num_xcc
        if target >= 100100:
            waves = cu * 32
        else:
            waves = min(cu * 40, props["array_count"] // props["simd_arrays_per_engine"] * 512)
    except (KeyError, ZeroDivisionError):
        return None
    if cu <= 0:
        return None
    ctl = _align(40 + waves * (12 if target >= 100100 else 8) + 8)
    workgroup = _align(cu * (vgpr_bytes(target) + 0x4000 + 0x10000 + 0x1000))
    return ctl + workgroup, ctl
