"""Free space for the bundle at the install prefix and for the weights in the model cache."""

from __future__ import annotations

from typing import Any

from rocmdoctor.checks import check
from rocmdoctor.checks.access import PASSWD, find_account, target_user
from rocmdoctor.model import Action, Result, Severity, failed, passed, warned
from rocmdoctor.registry import DEFAULT_PREFIX, Context

GB = 1000**3
# The vllm-rocm bundle unpacked (about 3.2 GB).
BUNDLE_BYTES = 3_200_000_000
CACHE_HOMES = ("/root", "/home/*", "/var/lib/*", "/opt/*", "/srv/*")
HF_CACHE = ".cache/huggingface/hub"


def model_cache(ctx: Context) -> str | None:
    if ctx.options.model_cache:
        return ctx.options.model_cache
    env = ctx.host.env
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    if env.get("HF_HOME"):
        return env["HF_HOME"].rstrip("/") + "/hub"
    name = target_user(ctx)
    account = find_account(ctx, name) if name else None
    home = account.home if account and account.home else env.get("HOME")
    return f"{home.rstrip('/')}/{HF_CACHE}" if home and home.startswith("/") else None


def measured_paths(ctx: Context) -> dict[str, int]:
    """path -> bytes needed there (snapshot records free space for exactly these)."""
    needs = {ctx.options.prefix: BUNDLE_BYTES}
    cache = model_cache(ctx)
    if cache:
        needs[cache] = needs.get(cache, 0) + ctx.options.model_bytes
    return needs


@check(
    "disk.space",
    "Free space for the bundle and model weights",
    severity=Severity.BLOCKING,
    blocks=(Action.INSTALL, Action.SERVE),
    reads=(PASSWD, DEFAULT_PREFIX, *(f"{h}/{HF_CACHE}" for h in CACHE_HOMES)),
    env=("HF_HOME", "HF_HUB_CACHE", "HOME"),
)
def disk_space(ctx: Context) -> Result:
    rows: list[dict[str, Any]] = []
    short: list[str] = []
    unknown: list[str] = []
    for path, need in measured_paths(ctx).items():
        free = ctx.host.free_bytes(path)
        rows.append({"path": path, "free_bytes": free, "needed_bytes": need})
        if free is None:
            unknown.append(path)
        elif free < need:
            short.append(f"{path}: {free / GB:.1f} GB free, {need / GB:.1f} GB needed")
    if short:
        return failed(
            "not enough space: " + "; ".join(short),
            "Free space there or choose another place (--prefix, HF_HOME).",
            paths=rows,
        )
    if unknown:
        return warned(
            f"cannot tell the free space at {', '.join(unknown)}",
            "Check `df -h` there; the bundle needs about 3.2 GB plus the model's weights.",
            paths=rows,
        )
    summary = ", ".join(f"{r['path']} {int(r['free_bytes']) / GB:.1f} GB free" for r in rows)
    return passed(
        f"{summary} (bundle {BUNDLE_BYTES / GB:.1f} GB, weights {ctx.options.model_bytes / GB:.1f} GB)",
        paths=rows,
    )
