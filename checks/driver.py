"""The amdgpu driver: loaded with its device nodes, and whether a DKMS build shadows the in-tree one."""

from __future__ import annotations

import re

from rocmdoctor.checks import check
from rocmdoctor.checks.container import ENV as CONTAINER_ENV
from rocmdoctor.checks.container import READS as CONTAINER_READS
from rocmdoctor.checks.container import detect as detect_container
from rocmdoctor.checks.container import run_remedy
from rocmdoctor.checks.facts import GPU_READS, OSRELEASE, GpuNode, gpus, kernel_release
from rocmdoctor.checks.host_rules import rules
from rocmdoctor.facts.remedies import fixable
from rocmdoctor.facts.vendor_advice import KnownIssue, known_issues, release_numbers
from rocmdoctor.model import Action, Result, failed, passed, warned
from rocmdoctor.registry import DEFAULT_PREFIX, Context
from rocmdoctor.textnum import is_decimal

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


# Instinct GPUs: amdgpu-dkms is AMD's supported datacenter driver; what matters is that it pairs with the ROCm
# userspace ("forward and backward compatibility between the KMD and its user space for +/- 2 releases",
# ROCm's User and kernel-space support matrix). The DKMS source version (/sys/module/amdgpu/version) names the
# ROCm release that shipped it: 6.16.6 beside amdgpu-core 7.1.70100 (captured, dpkg-amdgpu-dkms-packages-...);
# the others from the package versions in repo.radeon.com (amdgpu-dkms 6.12.12.60400 = ROCm 6.4, ...).
DKMS_ROCM_RELEASE = {
    (6, 3): (6, 0),
    (6, 7): (6, 1),
    (6, 8): (6, 2),
    (6, 10): (6, 3),
    (6, 12): (6, 4),
    (6, 14): (7, 0),
    (6, 16): (7, 1),
}
SUPPORTED_SKEW = 2  # releases either way
# Production releases in order; TheRock's 7.9+ previews (the bundles' rocm7.12/7.13) have no place in AMD's matrix.
# The releases after 7.2 (ROCm Core SDK 10.0, 10.1, 10.2) come from the vendor advice data with their sources.
KNOWN_RELEASES = ((6, 0), (6, 1), (6, 2), (6, 3), (6, 4), (7, 0), (7, 1), (7, 2), *release_numbers())
ROCM_INFO_VERSION = "/opt/rocm/.info/version"
ROCM_CORE_GLOB = "/opt/rocm/core-*"
BUNDLE_LINK = f"{DEFAULT_PREFIX}/current"
_ROCM_IN_TAG = re.compile(r"rocm(\d+)\.(\d+)")
_VERSION = re.compile(r"^(\d+)\.(\d+)")


def is_instinct(gpu: GpuNode) -> bool:
    """The GPU's class, not whether it has VRAM: the CDNA datacenter targets (host_rules.json `instinct`)
    are Instinct whether a part is an APU (MI300A) or not; other gfx9 targets count when they are not APUs
    (the rule before the datacenter APU)."""
    if gpu.gfx in rules()["instinct"]["gfx"]:
        return True
    return gpu.gfx.startswith("gfx9") and gpu.gfx not in ("gfx90c",) and gpu.apu is not True


def release_ordinal(release: tuple[int, int]) -> int | None:
    """ROCm releases in order (6.0 ... 6.4, then 7.0 ...), so that '+/- 2 releases' can be counted."""
    return KNOWN_RELEASES.index(release) if release in KNOWN_RELEASES else None


def dkms_rocm_release(version: str | None) -> tuple[int, int] | None:
    match = _VERSION.match(version or "")
    return DKMS_ROCM_RELEASE.get((int(match[1]), int(match[2]))) if match else None


def userspace_rocm(ctx: Context) -> tuple[tuple[int, int], str] | None:
    """(release, where it was seen): the installed bundle's ROCm (its tag), else the system's /opt/rocm."""
    prefix = (ctx.options.prefix or DEFAULT_PREFIX).rstrip("/")
    link = ctx.host.readlink(f"{prefix}/current")
    if link.ok and (match := _ROCM_IN_TAG.search(link.value)):
        return (int(match[1]), int(match[2])), f"the installed bundle {link.value.rsplit('/', 1)[-1]}"
    info = ctx.host.read_text(ROCM_INFO_VERSION, limit=256)
    if info.ok and (match := _VERSION.match(info.value.strip())):
        return (int(match[1]), int(match[2])), f"{ROCM_INFO_VERSION} ({info.value.strip()[:40]})"
    return rocm_core_sdk(ctx)


def rocm_core_sdk(ctx: Context) -> tuple[tuple[int, int], str] | None:
    """ROCm Core SDK 10+ (TheRock): /opt/rocm/core-<major>.<minor> from amdrocm-* packages, no .info/version
    at the old place (checks/data/host_rules.json rocm_layouts)."""
    for layout in rules()["rocm_layouts"]:
        for path in sorted(ctx.host.glob(layout["glob"]), reverse=True):
            match = _VERSION.match(path.rsplit("-", 1)[-1])
            if match and ctx.host.is_dir(path):
                return (
                    int(match[1]),
                    int(match[2]),
                ), f"{path} (ROCm Core SDK layout, {layout['packages']} packages)"
    return None


def affected_issues(ctx: Context, gfx: set[str]) -> list[tuple[KnownIssue, str, str]]:
    """(issue, ROCm release, where it was seen) for each vendor known issue (checks/data/vendor_advice.json)
    of a GPU in `gfx` that the host's ROCm userspace carries."""
    user = userspace_rocm(ctx)
    if user is None:
        return []
    release = ".".join(map(str, user[0]))
    found: list[tuple[KnownIssue, str, str]] = []
    for target in sorted(gfx):
        for issue in known_issues(target):
            if issue.affects(user[0]) and all(issue is not seen for seen, _, _ in found):
                found.append((issue, release, user[1]))
    return found


def instinct_dkms(ctx: Context, gpu: GpuNode, signals: dict[str, str]) -> Result:
    """On Instinct the DKMS driver is the supported one: judge its pairing with the ROCm userspace."""
    version_read = ctx.host.read_text("/sys/module/amdgpu/version", limit=256)
    version = version_read.value.strip()[:40] if version_read.ok else None
    driver_release = dkms_rocm_release(version)
    user = userspace_rocm(ctx)
    details = {
        "signals": signals,
        "instinct": True,
        "dkms_version": version,
        "dkms_rocm_release": ".".join(map(str, driver_release)) if driver_release else None,
        "userspace_rocm_release": ".".join(map(str, user[0])) if user else None,
    }
    named = f"amdgpu-dkms {version or '(version unknown)'}" + (
        f" (the ROCm {driver_release[0]}.{driver_release[1]} driver)" if driver_release else ""
    )
    if driver_release is None or user is None:
        unknown = (
            "which ROCm release this DKMS build belongs to"
            if driver_release is None
            else "the ROCm userspace"
        )
        return passed(
            f"{named} on {gpu.gfx}: AMD's supported driver on Instinct; cannot tell {unknown}, so keep the "
            f"userspace within {SUPPORTED_SKEW} releases of it (ROCm's user/kernel-space support matrix)",
            **details,
        )
    skew_a, skew_b = release_ordinal(driver_release), release_ordinal(user[0])
    skew = None if skew_a is None or skew_b is None else skew_b - skew_a
    details["release_skew"] = skew
    rocm = f"{user[0][0]}.{user[0][1]}"
    if skew is None:
        return passed(
            f"{named} on {gpu.gfx}: AMD's supported driver on Instinct; ROCm {rocm} userspace from {user[1]} is a "
            f"release rocmdoctor cannot place, so check it is within {SUPPORTED_SKEW} releases of the driver",
            **details,
        )
    if abs(skew) <= SUPPORTED_SKEW:
        return passed(
            f"{named} on {gpu.gfx} pairs with ROCm {rocm} userspace from {user[1]} (within AMD's "
            f"+/-{SUPPORTED_SKEW} releases)",
            **details,
        )
    return warned(
        f"{named} on {gpu.gfx} is {abs(skew)} releases from the "
        f"ROCm {rocm} userspace of {user[1]}: outside AMD's +/-{SUPPORTED_SKEW} release support",
        f"Keep amdgpu-dkms (AMD's datacenter driver) but move it to the ROCm {rocm} release: install that release's "
        f"amdgpu-install package, then `sudo amdgpu-install -y --usecase=dkms` and reboot; `rocmdoctor fix-kernel` "
        "has the steps.",
        rocm_release=rocm,
        **details,
    )


def render_nodes(ctx: Context) -> list[str]:
    return [p for p in ctx.host.glob(RENDER_NODES) if is_decimal(p.rsplit("renderD", 1)[-1])]


@check(
    "driver.loaded",
    "amdgpu loaded with /dev/kfd and a render node",
    depends=("gpu.present",),
    reads=("/sys/module/amdgpu", DEV_KFD, "/dev/dri", RENDER_NODES, *CONTAINER_READS),
    env=CONTAINER_ENV,
)
def driver_loaded(ctx: Context) -> Result:
    problems = []
    if not ctx.host.exists("/sys/module/amdgpu"):
        problems.append("the amdgpu module is not loaded (/sys/module/amdgpu is absent)")
    kfd = ctx.host.stat(DEV_KFD)
    unknowable = ctx.host.unknowable(DEV_KFD) if kfd is None else None
    if unknowable:
        return failed(
            f"cannot read {unknowable}, so whether {DEV_KFD} exists is unknown",
            f"Run rocmdoctor as root (`sudo rocmdoctor check`), or make {unknowable.split(' (')[0]} "
            "readable by this user (join its group, or chmod a+r it).",
            unreadable=[unknowable.split(" (")[0]],
        )
    if kfd is None:
        problems.append(f"{DEV_KFD} does not exist")
    elif kfd.type != "char":
        problems.append(f"{DEV_KFD} is a {kfd.type}, not a character device")
    renders = render_nodes(ctx)
    if not renders:
        problems.append("no /dev/dri/renderD* node")
    details = {"kfd": kfd.to_json() if kfd else None, "render_nodes": renders}
    container = detect_container(ctx)
    if container is not None and container.oci and (kfd is None or not renders):
        # Inside Docker/Podman the host's driver may be fine: the container was started without the nodes.
        return failed(
            "; ".join(problems) + f" in this {container.kind} container ({container.evidence})",
            run_remedy(ctx, container, [])
            + "; if the host lacks them too, run `rocmdoctor check` on the host.",
            container=container.to_json(),
            **details,
        )
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
        BUNDLE_LINK,
        ROCM_INFO_VERSION,
        ROCM_CORE_GLOB,
    ),
)
def driver_dkms(ctx: Context) -> Result:
    signals = dkms_signals(ctx)
    user = userspace_rocm(ctx)
    seen = {"userspace_rocm": {"release": ".".join(map(str, user[0])), "seen_in": user[1]}} if user else {}
    if not signals:
        return passed(
            "in-tree amdgpu (no module version, no amdkcl/amdttm, no updates/dkms or extra module)", **seen
        )
    apus = [g for g in gpus(ctx) if g.apu and g.gfx.startswith("gfx115")]
    evidence = "; ".join(signals.values())
    instinct = [g for g in gpus(ctx) if is_instinct(g)]
    if instinct and not apus:
        return instinct_dkms(ctx, instinct[0], signals)
    if apus:
        return failed(
            f"amdgpu DKMS build shadows the in-tree driver on {apus[0].gfx}: {evidence}",
            DKMS_REMEDY_APT,
            signals=signals,
            **fixable("dkms"),
        )
    return warned(
        f"amdgpu DKMS build in use: {evidence}",
        "Fine on supported dGPUs; if the GPU hangs or lacks the CWSR export, remove it: " + DKMS_REMEDY_APT,
        signals=signals,
        **seen,
    )
