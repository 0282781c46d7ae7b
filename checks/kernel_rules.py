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
    if text is None:
        return None
    match = _RELEASE.match(text.strip())
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


# The kernel's CWSR size, kfd_queue.c `kfd_queue_ctx_save_restore_size()` and its helpers, as in
# torvalds/linux drivers/gpu/drm/amd/amdkfd/kfd_queue.c at 1a2f09ae11b4657d49df6fa86744795f99c2ee27,
# plus upstream b42f3bf9536c9b710fd1d4deb7d1b0dc819dc72d ("GFX_VERSION_GFX1151" in the 0x60000 VGPR
# list; in 6.18.4+, 6.12.64+ and the Ubuntu HWE/OEM kernels, the "VGPR bump"). Per XCC:
#   cu      = simd_count / simd_per_cu / num_xcc
#   waves   = gfx < 10.1 ? min(cu * 40, arrays_per_xcc / simd_arrays_per_engine * 512) : cu * 32
#   wg      = ALIGN(cu * (vgpr(gfx) + SGPR 0x4000 + lds(gfx) + HWREG 0x1000), 4096)
#   ctl     = ALIGN(40 + waves * (gfx >= 10.1 ? 12 : 8) + 8, 4096), capped at 0x7000 on gfx10.x
#   cwsr    = ctl + wg
# lds(gfx) is LDS_SIZE_PER_CU 0x10000, except gfx950 where it is the node's lds_size_in_kb << 10
# (160 KiB on MI350X/MI355X: the term an older formula missed, 19542016 instead of 22687744).
# sysfs prints array_count multiplied by num_xcc (kfd_topology.c node_show), so it is divided back.
SGPR_SIZE_PER_CU = 0x4000
LDS_SIZE_PER_CU = 0x10000
HWREG_SIZE_PER_CU = 0x1000
CONTEXT_HEADER = 40
GFX_NAVI10 = 100100
GFX950 = 90500
VGPR_BYTES = {
    **{t: 0x80000 for t in (90402, 90010, 90008, 90500)},  # gfx942, gfx90a, gfx908, gfx950
    **{t: 0x60000 for t in (110000, 110001, 110501, 120000, 120001)},  # gfx1100/1101/1151/1200/1201
}
# The vgpr bump for gfx1151 (b42f3bf9536c) is what kernels older than the CWSR fix lack.
VGPR_BUMPED = frozenset({110501})
VGPR_DEFAULT = 0x40000


def vgpr_bytes(target: int) -> int:
    return VGPR_BYTES.get(target, VGPR_DEFAULT)


def lds_bytes(target: int, props: dict[str, int]) -> int:
    if target == GFX950:
        return props.get("lds_size_in_kb", 0) << 10
    return LDS_SIZE_PER_CU


def _align(value: int, to: int = 4096) -> int:
    return (value + to - 1) // to * to


def expected_cwsr(props: dict[str, int], vgpr: int | None = None) -> tuple[int, int] | None:
    """(cwsr_size, ctl_stack_size) per XCC that a fixed kernel prints for this node, or None when the
    node lacks what the formula needs. `vgpr` overrides the per-CU VGPR bytes (to model old kernels)."""
    try:
        target = props["gfx_target_version"]
        num_xcc = props.get("num_xcc", 1) or 1
        cu = props["simd_count"] // props["simd_per_cu"] // num_xcc
        if target < 80001:
            return None  # the kernel computes nothing before Carrizo
        if target >= GFX_NAVI10:
            waves = cu * 32
        else:
            arrays = props["array_count"] // num_xcc
            waves = min(cu * 40, arrays // props["simd_arrays_per_engine"] * 512)
    except (KeyError, ZeroDivisionError):
        return None
    lds = lds_bytes(target, props)
    if cu <= 0 or lds <= 0:
        return None
    ctl = _align(CONTEXT_HEADER + waves * (12 if target >= GFX_NAVI10 else 8) + 8)
    if target // 10000 * 10000 == 100000:
        ctl = min(ctl, 0x7000)  # "HW design limits control stack size to 0x7000"
    per_cu = (vgpr if vgpr is not None else vgpr_bytes(target)) + SGPR_SIZE_PER_CU + lds + HWREG_SIZE_PER_CU
    return ctl + _align(cu * per_cu), ctl
