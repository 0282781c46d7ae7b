"""The multi-GPU environment (visibility masks, the IPC mode, iommu=pt, /dev/shm) and kernel/firmware/driver
combinations known to fail. The rules and their sources are data: checks/data/host_rules.json.

The environment judged is the effective one of each way vLLM is started here: this shell (what `serve`
inherits), and the unit `rocmdoctor unit` wrote (its Environment= lines and its EnvironmentFile).
"""

from __future__ import annotations

from rocmdoctor.checks import check
from rocmdoctor.checks.container import READS as CONTAINER_READS
from rocmdoctor.checks.container import detect as detect_container
from rocmdoctor.checks.driver import BUNDLE_LINK, ROCM_CORE_GLOB, ROCM_INFO_VERSION, affected_issues
from rocmdoctor.checks.facts import (
    DISTRO_READS,
    GPU_READS,
    OSRELEASE,
    distro_info,
    gpus,
    kernel_release,
    serving_gpus,
)
from rocmdoctor.checks.host_rules import rules
from rocmdoctor.checks.kernel_rules import parse_release
from rocmdoctor.facts.gpu_choice import serving_nodes
from rocmdoctor.model import Result, Severity, failed, passed, skipped, warned
from rocmdoctor.registry import Context

UNIT_FILE = "/etc/systemd/system/vllm.service"
UNIT_ENV_FILE = "/etc/rocmdoctor/vllm.env"
CMDLINE = "/proc/cmdline"
DEV_SHM = "/dev/shm"
AMDGPU_VERSION = "/sys/module/amdgpu/version"


def _assignments(words: list[str]) -> dict[str, str]:
    out = {}
    for word in words:
        key, sep, value = word.partition("=")
        if sep and key.replace("_", "").isalnum():
            out[key] = value.strip("\"'")
    return out


def unit_environment(ctx: Context) -> dict[str, str] | None:
    """The unit's Environment= assignments and its EnvironmentFile's, or None when no unit is written."""
    unit = ctx.host.read_text(UNIT_FILE)
    if not unit.ok:
        return None
    env: dict[str, str] = {}
    for line in unit.value.splitlines():
        if line.startswith("Environment="):
            env.update(_assignments(line[len("Environment=") :].split()))
    extra = ctx.host.read_text(UNIT_ENV_FILE)
    if extra.ok:
        env.update(_assignments([ln.strip() for ln in extra.value.splitlines() if not ln.startswith("#")]))
    if (
        "--distributed-executor-backend ray" in unit.value
        or "--distributed-executor-backend=ray" in unit.value
    ):
        env.setdefault("_ray", "1")
    return env


def _indices(value: str) -> list[int] | None:
    parts = [p.strip() for p in value.split(",") if p.strip()]
    return [int(p) for p in parts] if parts and all(p.isdigit() for p in parts) else None


def visibility_findings(where: str, env: dict[str, str], gpu_count: int) -> list[tuple[Severity, str, str]]:
    """(severity, finding, remedy) for the visibility variables of one environment."""
    data = rules()["visibility"]
    seen = {v: env[v] for v in data["variables"] if v in env}
    out: list[tuple[Severity, str, str]] = []
    hip, cuda, rocr = (
        seen.get(v) for v in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
    )
    if hip is not None and cuda is not None and hip != cuda:
        out.append(
            (
                Severity.BLOCKING,
                f"{where}: HIP_VISIBLE_DEVICES={hip} and CUDA_VISIBLE_DEVICES={cuda} disagree (vLLM refuses to "
                "start: 'Inconsistent GPU visibility env vars')",
                f"{where}: set one of them (vLLM's is CUDA_VISIBLE_DEVICES) or none; rocmdoctor's unit pins with "
                "ROCR_VISIBLE_DEVICES only",
            )
        )
    rocr_list = _indices(rocr) if rocr is not None else None
    for name, value, count in (
        ("ROCR_VISIBLE_DEVICES", rocr, gpu_count),
        ("HIP_VISIBLE_DEVICES", hip, len(rocr_list) if rocr_list else gpu_count),
        ("CUDA_VISIBLE_DEVICES", cuda, len(rocr_list) if rocr_list else gpu_count),
    ):
        listed = _indices(value) if value is not None else None
        if listed and count and max(listed) >= count:
            out.append(
                (
                    Severity.BLOCKING,
                    f"{where}: {name}={value} names index {max(listed)}, but only {count} GPU(s) are visible to it "
                    "('HIP error: invalid device ordinal')",
                    f"{where}: give indices below {count} (ROCR_VISIBLE_DEVICES counts GPU nodes in KFD order; "
                    "HIP/CUDA count what ROCR leaves)",
                )
            )
    if rocr is not None and (hip is not None or cuda is not None):
        out.append(
            (
                Severity.DEGRADING,
                f"{where}: ROCR_VISIBLE_DEVICES={rocr} and {'HIP' if hip is not None else 'CUDA'}_VISIBLE_DEVICES "
                "are both set: HIP numbers what ROCR leaves from 0 again, so the two masks compose",
                f"{where}: keep one mask (rocmdoctor's unit uses ROCR_VISIBLE_DEVICES alone)",
            )
        )
    if rocr is not None and env.get("_ray") and env.get(data["ray_noset"]) != "1":
        out.append(
            (
                Severity.DEGRADING,
                f"{where}: Ray workers with ROCR_VISIBLE_DEVICES set and {data['ray_noset']} unset: Ray re-masks "
                "each worker through ROCR and vLLM's CUDA indices then point past it (vllm#12572)",
                f"{where}: set {data['ray_noset']}=1 (as vLLM's ROCm images do)",
            )
        )
    return out


def multi_findings(ctx: Context, where: str, env: dict[str, str], served: int, rdna: bool) -> list[tuple]:
    data = rules()["ipc_legacy"]
    out: list[tuple[Severity, str, str]] = []
    if served >= 2 and rdna and env.get(data["variable"]) == data["bad_value"]:
        out.append(
            (
                Severity.DEGRADING,
                f"{where}: {data['variable']}=1 on a host with {served} RDNA GPUs: IPC fails on every GPU, so "
                "tensor parallelism cannot start (rocm-systems#2209)",
                f"{where}: set {data['variable']}=0 (or unset it); rocmdoctor's unit does so on multi-GPU RDNA "
                "hosts",
            )
        )
    return out


@check(
    "env.multi_gpu",
    "Multi-GPU environment: visibility masks, IPC mode, iommu=pt, /dev/shm",
    severity=Severity.DEGRADING,
    depends=("gpu.arch",),
    reads=(*GPU_READS, UNIT_FILE, UNIT_ENV_FILE, CMDLINE, DEV_SHM, *CONTAINER_READS),
    env=(
        *rules()["visibility"]["variables"],
        rules()["visibility"]["ray_noset"],
        rules()["ipc_legacy"]["variable"],
        "container",
    ),
)
def env_multi_gpu(ctx: Context) -> Result:
    found = gpus(ctx)
    served = serving_nodes(found)
    rdna = all(g.gfx.startswith(tuple(rules()["ipc_legacy"]["gfx_prefixes"])) for g in served)
    envs: dict[str, dict[str, str]] = {"this shell (and `serve`)": dict(ctx.host.env)}
    unit_env = unit_environment(ctx)
    if unit_env is not None:
        envs[f"the unit {UNIT_FILE}"] = unit_env
    findings: list[tuple[Severity, str, str]] = []
    for where, env in envs.items():
        findings += visibility_findings(where, env, len(found))
        findings += multi_findings(ctx, where, env, len(served), rdna)
    container = detect_container(ctx)
    if len(served) >= 2:
        cmdline = ctx.host.read_text(CMDLINE)
        words = cmdline.value.split() if cmdline.ok else []
        if cmdline.ok and "iommu=pt" not in words and "amd_iommu=off" not in words and container is None:
            findings.append(
                (
                    Severity.ADVISORY,
                    f"{len(served)} GPUs and no iommu=pt on the kernel command line: RCCL warns this can hang "
                    "multi-GPU hosts",
                    "Add iommu=pt to the kernel command line (`rocmdoctor fix --only cmdline.iommu` or "
                    "`rocmdoctor fix-kernel`), then reboot",
                )
            )
        shm = ctx.host.free_bytes(DEV_SHM) if ctx.host.stat(DEV_SHM) is not None else None
        need = rules()["shm"]["min_bytes_per_rank"] * len(served)
        if shm is not None and shm < need:
            remedy = (
                f"Recreate the container with --ipc=host or --shm-size={rules()['shm']['recommended']}"
                if container is not None and container.oci
                else f"Enlarge it: `sudo mount -o remount,size={rules()['shm']['recommended']} {DEV_SHM}` "
                "(and its /etc/fstab entry)"
            )
            findings.append(
                (
                    Severity.DEGRADING,
                    f"{DEV_SHM} has {shm / (1 << 30):.2f} GiB free; tensor parallelism over {len(served)} GPUs wants "
                    f"{need / (1 << 30):.0f} GiB or more",
                    remedy,
                )
            )
    details = {
        "environments": sorted(envs),
        "gpus": len(found),
        "served": [g.node for g in served],
        "findings": [{"severity": s.value, "finding": f, "remedy": r} for s, f, r in findings],
    }
    if not findings:
        if len(served) < 2:
            return passed(
                f"visibility variables consistent in {len(envs)} environment(s); one GPU served", **details
            )
        return passed(
            f"{len(served)} GPUs: masks, IPC mode, iommu=pt and /dev/shm as tensor parallelism needs",
            **details,
        )
    findings.sort(key=lambda f: [Severity.BLOCKING, Severity.DEGRADING, Severity.ADVISORY].index(f[0]))
    summary = "; ".join(f for _, f, _ in findings)
    remedy = "; ".join(r for _, _, r in findings) + "."
    if findings[0][0] is Severity.BLOCKING:
        return failed(summary, remedy, **details)
    return warned(summary, remedy, **details)


def _kernel_below(release: str | None, bound: str) -> bool:
    got, limit = parse_release(release), parse_release(bound)
    return got is not None and limit is not None and got.base < limit.base


@check(
    "kernel.combinations",
    "No kernel, firmware and driver combination known to fail",
    severity=Severity.DEGRADING,
    depends=("gpu.arch",),
    reads=(
        *GPU_READS,
        OSRELEASE,
        *DISTRO_READS,
        AMDGPU_VERSION,
        BUNDLE_LINK,
        ROCM_INFO_VERSION,
        ROCM_CORE_GLOB,
    ),
)
def kernel_combinations(ctx: Context) -> Result:
    """The host rules' known-bad combinations, and the vendor's known issues of the served GPUs with the
    ROCm userspace they run (checks/data/vendor_advice.json: gfx1103 on ROCm 10.0+, ROCm/TheRock#7702)."""
    kernel = kernel_release(ctx) or ""
    info = distro_info(ctx)
    gfx = {g.gfx for g in gpus(ctx)}
    issues = affected_issues(ctx, {g.gfx for g in serving_gpus(ctx)})
    dkms = ctx.host.read_text(AMDGPU_VERSION, limit=256)
    dkms_version = dkms.value.strip() if dkms.ok else None
    matched = []
    for rule in rules()["known_combinations"]:
        if "distro" in rule and (
            info["id"] != rule["distro"] or not (info["version"] or "").startswith(rule["distro_version"])
        ):
            continue
        if "kernel_prefix" in rule and not kernel.startswith(rule["kernel_prefix"]):
            continue
        if "kernel_below" in rule and not _kernel_below(kernel, rule["kernel_below"]):
            continue
        if "gfx" in rule and not gfx & set(rule["gfx"]):
            continue
        if "dkms_prefix" in rule and not (dkms_version or "").startswith(rule["dkms_prefix"]):
            continue
        matched.append(rule)
    details: dict = {"kernel": kernel, "dkms_version": dkms_version, "matched": [r["id"] for r in matched]}
    findings = [(f"{r['summary']} ({r['source']})", r["remedy"]) for r in matched]
    if issues:  # only then: the report of a host without one stays as it was
        details["vendor_issues"] = [
            {"source": i.source, "gfx": sorted(gfx & set(i.gfx)), "rocm": rocm, "rocm_seen_in": where}
            for i, rocm, where in issues
        ]
        findings += [
            (
                f"ROCm {rocm} ({where}) on {', '.join(sorted(gfx & set(i.gfx)))}: {i.summary} ({i.source})",
                i.remedy,
            )
            for i, rocm, where in issues
        ]
    if not kernel and not issues:
        return skipped(f"cannot read the kernel release ({OSRELEASE})", **details)
    if not findings:
        return passed(
            f"{kernel}: none of the {len(rules()['known_combinations'])} known-bad combinations", **details
        )
    return warned("; ".join(f for f, _ in findings), "; ".join(r for _, r in findings) + ".", **details)
