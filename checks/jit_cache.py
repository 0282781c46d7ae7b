"""The service's JIT caches (Triton, inductor, vLLM, AITER): built for the current bundle and GPU, and
complete.

The unit keeps them under /var/lib/vllm/jit/<gfx>-<digest prefix>/ (provision/server/jit_cache.py): a
directory whose key or fingerprint.json names another bundle or GPU is stale (objects built for
another GPU segfault, aiter#3846); an interrupted write leaves a partial entry that is reused forever
(aiter#4799): Triton's `tmp.pid_*` staging directories (triton/runtime/cache.py FileCacheManager.put
writes there, then renames), and an AITER module build directory with no built `.so` beside it.
"""

from __future__ import annotations

from typing import Any

from rocmdoctor.checks import check
from rocmdoctor.checks.facts import gpus
from rocmdoctor.documents import load_value
from rocmdoctor.facts.installed_bundle import METADATA, VLLM_METADATA, read_installed
from rocmdoctor.model import Result, Severity, passed, skipped, warned
from rocmdoctor.registry import DEFAULT_PREFIX, Context

STATE_JIT = "/var/lib/vllm/jit"
RECORD = ".rocmdoctor-qualification.json"  # facts.installed_bundle.QUALIFICATION
FINGERPRINT = "fingerprint.json"
PURGE = "rocmdoctor bundle cache purge"


def _current(ctx: Context) -> tuple[str | None, str | None]:
    """(bundle digest, tag) of the current bundle: `facts.installed_bundle`'s, the one digest every
    report gives it."""
    bundle = read_installed(ctx.host, ctx.options.prefix or DEFAULT_PREFIX)
    return bundle.digest, bundle.tag


def expected_key(digest: str, gfx: str | None) -> str:
    return f"{gfx or 'nogpu'}-{digest.split(':', 1)[-1][:16]}"


def partial_entries(ctx: Context, key_dir: str) -> list[str]:
    found = list(ctx.host.glob(f"{key_dir}/triton/*/tmp.pid_*"))
    for build in ctx.host.glob(f"{key_dir}/aiter/build/*"):
        module = build.rsplit("/", 1)[-1]
        if not ctx.host.glob(f"{key_dir}/aiter/{module}*.so"):
            found.append(build)
    return found


@check(
    "bundle.jit_cache",
    "The service's JIT caches belong to the current bundle and GPU and are complete",
    severity=Severity.DEGRADING,
    reads=(
        f"{DEFAULT_PREFIX}/current",
        f"{DEFAULT_PREFIX}/current/{METADATA}",
        f"{DEFAULT_PREFIX}/current/{RECORD}",
        f"{DEFAULT_PREFIX}/current/{VLLM_METADATA}",
        f"{STATE_JIT}/*/{FINGERPRINT}",
        f"{STATE_JIT}/*/triton/*/tmp.pid_*",
        f"{STATE_JIT}/*/aiter/build/*",
        f"{STATE_JIT}/*/aiter/*.so",
    ),
)
def jit_cache(ctx: Context) -> Result:
    keys = ctx.host.listdir(STATE_JIT) if ctx.host.is_dir(STATE_JIT) else []
    if not keys:
        return skipped(f"no JIT cache under {STATE_JIT}")
    digest, tag = _current(ctx)
    found = sorted({g.gfx for g in gpus(ctx) if g.gfx})
    gfx = found[0] if len(found) == 1 else None
    want = expected_key(digest, gfx) if digest else None
    stale, partial = [], []
    details: dict[str, Any] = {"caches": sorted(keys), "current_key": want}
    for key in sorted(keys):
        key_dir = f"{STATE_JIT}/{key}"
        read = ctx.host.read_text(f"{key_dir}/{FINGERPRINT}", limit=1 << 16)
        try:
            print_ = load_value(str(read.value), read.path, 1 << 16) if read.ok else {}
        except ValueError:
            print_ = {"damaged": True}
        mismatch = want is not None and key != want
        if isinstance(print_, dict) and print_ and digest and gfx:
            mismatch = mismatch or print_.get("bundle_digest") != digest or print_.get("gfx") != gfx
        if mismatch:
            what = (
                f"{print_.get('tag')} on {print_.get('gfx')}" if isinstance(print_, dict) and print_ else key
            )
            stale.append(f"{key_dir} (built for {what})")
        partial += partial_entries(ctx, key_dir)
    details.update(stale=stale, partial=partial)
    if not stale and not partial:
        return passed(f"{len(keys)} JIT cache(s), all for {tag or 'the current bundle'} on {gfx}", **details)
    findings = []
    if stale:
        findings.append(f"caches not for the current bundle ({tag}) and GPU ({gfx}): {', '.join(stale)}")
    if partial:
        findings.append(f"partial entries an interrupted build left: {', '.join(partial[:5])}")
    return warned(
        "; ".join(findings),
        f"`{PURGE}` removes every cache but the current bundle's (`--all`: that one too)",
        **details,
    )
