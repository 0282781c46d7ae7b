"""The amdgpu driver: loaded with its device nodes, and whether a DKMS build shadows the in-tree one."""

from __future__ import annotations

from ..model import Action, Result, failed, passed, warned
from ..registry import Context
from . import check
from .facts import GPU_READS, OSRELEASE, gpus, kernel_release

DEV_KFD = "/dev/kfd"
RENDER_NODES = "/dev/dri/renderD*"
# Out-of-tree (DKMS) amdgpu ships its own copies of these helpers; in-tree builds never load them.
DKMS_COMPANIONS = ("amdkcl", "amdttm")
DKMS_MODULE_DIRS = ("updates/dkms", "extra")
INTREE_MODULE_DIR = "kernel/drivers/gpu/drm/amd/amdgpu"
DKMS_REMEDY_APT = (
    "sudo apt remove --purge amdgpu-dkms && sudo reboot "
    "(reinstall ROCm with `amdgpu-install -y --usecase=rocm --no-dkms`); `rocmdoctor fix-kernel` has the steps"
)


def render_nodes(ctx: Context) -> list[str]:
    return [p for p in ctx.host.glob(RENDER_NODES) if p.rsplit("renderD", 1)[-1].isdigit()]


@check(
    "driver.loaded",
    "amdgpu loaded with /dev/kfd and a render node",
    depends=("gpu.present",),
    reads=("/sys/module/amdgpu", DEV_KFD, "/dev/dri", RENDER_NODES),
)
def driver_loaded(ctx: Context) -> Result:
    problems = []
    if not ctx.host.exists("/sys/module/amdgpu"):
        problems.append("the amdgpu module is not loaded (/sys/module/amdgpu is absent)")
    kfd = ctx.host.stat(DEV_KFD)
    if kfd is None:
        problems.append(f"{DEV_KFD} does not exist")
    elif kfd.type != "char":
        problems.append(f"{DEV_KFD} is a {kfd.type}, not a character device")
    renders = render_nodes(ctx)
    if not renders:
        problems.append("no /dev/dri/renderD* node")
    details = {"kfd": kfd.to_json() if kfd else None, "render_nodes": renders}
    if problems:
        return failed(
            "; ".join(problems),
            "Load the driver (`sudo modprobe amdgpu`) and check `dmesg | grep -i -e amdgpu -e kfd`; in a container "
            "pass --device /dev/kfd --device /dev/dri.",
            **details,
        )
    return passed(
        f"amdgpu loaded; {DEV_KFD} and {len(renders)} render node(s): {', '.join(renders)}", **details
    )


def dkms_signals(ctx: Context) -> dict[str, str]:
    """Evidence of an out-of-tree amdgpu, each with what was seen (host-facts.md §4)."""
    signals: dict[str, str] = {}
    version = ctx.host.read_text("/sys/module/amdgpu/version")
    if version.ok:
        signals["module_version"] = (
            f"/sys/module/amdgpu/version is {version.value.strip()[:40]} (in-tree has none)"
        )
    for name in DKMS_COMPANIONS:
        if ctx.host.exists(f"/sys/module/{name}"):
            signals[f"{name}_loaded"] = f"/sys/module/{name} exists (a DKMS helper module)"
    modules = ctx.host.read_text("/proc/modules")
    if modules.ok:
        loaded = {line.split(" ", 1)[0] for line in modules.value.splitlines()}
        for name in DKMS_COMPANIONS:
            if name in loaded:
                signals.setdefault(f"{name}_loaded", f"{name} is in /proc/modules (a DKMS helper module)")
    kver = kernel_release(ctx)
    if kver and "/" not in kver:
        for subdir in DKMS_MODULE_DIRS:
            for path in ctx.host.glob(f"/lib/modules/{kver}/{subdir}/amdgpu.ko*"):
                signals[f"module_in_{subdir.replace('/', '_')}"] = (
                    f"{path} exists (out-of-tree install location)"
                )
        dep = ctx.host.read_text(f"/lib/modules/{kver}/modules.dep")
        if dep.ok:
            for line in dep.value.splitlines():
                target = line.split(":", 1)[0]
                if target.rsplit("/", 1)[-1].startswith("amdgpu.ko") and target.startswith(DKMS_MODULE_DIRS):
                    signals["modules_dep"] = f"modules.dep resolves amdgpu to {target}"
                    break
    return signals


@check(
    "driver.dkms",
    "No amdgpu DKMS build shadowing the in-tree driver",
    depends=("driver.loaded",),
    blocks=(Action.INSTALL, Action.SERVE),
    reads=(
        *GPU_READS,
        OSRELEASE,
        "/sys/module/amdgpu/version",
        "/sys/module/amdkcl",
        "/sys/module/amdttm",
        "/proc/modules",
        "/lib/modules/*/updates/dkms/amdgpu.ko*",
        "/lib/modules/*/extra/amdgpu.ko*",
        "/lib/modules/*/modules.dep",
    ),
)
def driver_dkms(ctx: Context) -> Result:
    signals = dkms_signals(ctx)
    if not signals:
        return passed("in-tree amdgpu (no module version, no amdkcl/amdttm, no updates/dkms or extra module)")
    apus = [g for g in gpus(ctx) if g.apu and g.gfx.startswith("gfx115")]
    evidence = "; ".join(signals.values())
    if apus:
        return failed(
            f"amdgpu DKMS build shadows the in-tree driver on {apus[0].gfx}: {evidence}",
            DKMS_REMEDY_APT,
            signals=signals,
        )
    return warned(
        f"amdgpu DKMS build in use: {evidence}",
        "Fine on supported dGPUs; if the GPU hangs or lacks the CWSR export, remove it: " + DKMS_REMEDY_APT,
        signals=signals,
    )
