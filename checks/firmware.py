"""GPU firmware known to hang gfx11 GPUs under sustained load (MES 0x83/0x86, linux-firmware 20251125)."""

from __future__ import annotations

import re

from rocmdoctor.checks import check
from rocmdoctor.checks.facts import GPU_READS, gpus
from rocmdoctor.model import Result, Severity, passed, skipped, warned
from rocmdoctor.registry import Context

BAD_MES = {0x83, 0x86}
BAD_LINUX_FIRMWARE = ("20251125",)
FIRMWARE_INFO = "/sys/kernel/debug/dri/*/amdgpu_firmware_info"
PACMAN_FIRMWARE = "/var/lib/pacman/local/linux-firmware-*"
_MES_LINE = re.compile(r"^MES feature version:\s*\d+,\s*firmware version:\s*0x([0-9a-fA-F]+)", re.MULTILINE)
REMEDY = (
    "Roll linux-firmware back to 20251111 or forward to 20260110+ and rebuild the initramfs "
    "(`dracut -f` / `update-initramfs -u`); meanwhile boot with amdgpu.cwsr_enable=0."
)


def mes_versions(ctx: Context) -> dict[str, int]:
    """MES firmware per DRM minor, from debugfs (root only)."""
    found = {}
    for path in ctx.host.glob(FIRMWARE_INFO):
        raw = ctx.host.read_text(path, limit=64 * 1024)
        match = _MES_LINE.search(raw.value) if raw.ok else None
        if match:
            found[path] = int(match.group(1), 16)
    return found


def linux_firmware_packages(ctx: Context) -> list[str]:
    """Package versions where the package database names them in paths (Arch's pacman)."""
    return [p.rsplit("/", 1)[-1][len("linux-firmware-") :] for p in ctx.host.glob(PACMAN_FIRMWARE)]


@check(
    "firmware.mes",
    "No known-bad MES / linux-firmware",
    severity=Severity.DEGRADING,
    depends=("gpu.arch",),
    reads=(*GPU_READS, "/sys/kernel/debug/dri", FIRMWARE_INFO, PACMAN_FIRMWARE),
)
def firmware_mes(ctx: Context) -> Result:
    gfx11 = [g for g in gpus(ctx) if g.gfx.startswith("gfx11")]
    mec = {g.node: g.properties.get("fw_version") for g in gpus(ctx)}
    mes = mes_versions(ctx)
    packages = linux_firmware_packages(ctx)
    details = {"mec_fw_version": mec, "mes": {k: hex(v) for k, v in mes.items()}, "linux_firmware": packages}
    if not gfx11:
        return passed("no gfx11 GPU: the MES 0x83/0x86 regression does not apply", **details)
    bad_mes = sorted({hex(v) for v in mes.values() if v in BAD_MES})
    bad_pkg = [p for p in packages if p.startswith(BAD_LINUX_FIRMWARE)]
    if bad_mes or bad_pkg:
        found = ", ".join([f"MES {v}" for v in bad_mes] + [f"linux-firmware {p}" for p in bad_pkg])
        return warned(
            f"known-bad GPU firmware: {found} (GPU hangs and page faults under load)", REMEDY, **details
        )
    if mes or packages:
        seen = ", ".join([f"MES {hex(v)}" for v in mes.values()] + [f"linux-firmware {p}" for p in packages])
        return passed(f"no known-bad firmware ({seen})", **details)
    return skipped(
        "MES firmware version not readable (needs root for debugfs) and no package database entry "
        "names linux-firmware",
        **details,
    )
