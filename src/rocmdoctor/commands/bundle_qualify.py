"""`rocmdoctor bundle qualify [TAG]` and what install, list and rollback share of qualification."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rocmdoctor.commands.common import App, UserError, emit_change, emit_json
from rocmdoctor.host_writes import HostWriter

SKIP_WARNING = (
    "rocmdoctor: WARNING: --skip-qualify: {tag} is activated WITHOUT qualification (no check of its "
    "libraries, symbols, GPU code objects, compiler or imports); this is recorded with the bundle and "
    "`rocmdoctor bundle list` shows it as skipped. Run `rocmdoctor bundle qualify {tag}` to check it"
)


def host_gfx(app: App, given: str | None) -> str | None:
    """--gfx, else the one gfx of this host's GPUs (under --root); None without a GPU."""
    if given:
        if not given.startswith("gfx") or not given[3:].replace("-", "").isalnum() or len(given) > 32:
            raise UserError(f"--gfx {given!r}: pass an ISA name such as gfx1151 or gfx942")
        return given
    try:
        from rocmdoctor.checks import facts
    except ImportError:
        return None
    from rocmdoctor.registry import Context, Options

    found = sorted({g.gfx for g in facts.gpus(Context(app.host(), Options())) if g.gfx})
    if len(found) > 1:
        raise UserError(f"this host has GPUs of several ISAs ({', '.join(found)}); pass --gfx")
    return found[0] if found else None


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """What install's JSON carries of a qualification (the whole record stays with the bundle)."""
    return {
        "qualified": doc.get("qualified"),
        "skipped": doc.get("skipped", False),
        "host_gfx": doc.get("host_gfx"),
        "bundle_digest": doc.get("bundle_digest"),
        "elapsed_s": doc.get("elapsed_s"),
        "steps": {s["id"]: s["status"] for s in doc.get("steps", []) if isinstance(s, dict)},
        "failures": [f["message"] for s in doc.get("steps", []) for f in s.get("failures", [])][:20],
    }


def qualification_state(tree: Path) -> tuple[str, dict[str, Any] | None]:
    from rocmdoctor.provision.bundle.qualify import recorded, state

    doc = recorded(tree)
    return state(doc), doc


def run_qualify(app: App, prefix: Path, tag: str | None, as_json: bool, options: Any) -> bool:
    """Qualify an installed bundle (default: current) and record the result in it; True: qualified."""
    from rocmdoctor.model import envelope
    from rocmdoctor.provision.bundle.install import InstallError, Layout, bundle_name
    from rocmdoctor.provision.bundle.qualify import QUALIFICATION, bundle_qualify

    layout = Layout(prefix, HostWriter().trees)  # the record is written into the bundle's own tree
    chosen = bundle_name(layout, tag, "TAG") if tag else layout.current_tag()
    if chosen is None:
        raise UserError(f"no current bundle under {prefix}; pass a TAG that `rocmdoctor bundles` lists")
    meta = layout.metadata(chosen)
    if meta is None:
        raise InstallError(
            f"{chosen} is not a complete bundle under {layout.bundles}; `rocmdoctor bundles` lists what "
            "is installed"
        )
    result = bundle_qualify(layout.trees, layout.bundles / chosen, chosen, meta, options)
    # the record's own fields (its schema_version among them) after the envelope's
    doc = envelope(
        changed=True,
        failed=not result.qualified,
        msg=f"{chosen} is qualified for this host"
        if result.qualified
        else f"{chosen} is NOT qualified: {result.first_failure()}",
        record=str(layout.bundles / chosen / QUALIFICATION),
        **result.to_json(),
    )
    if as_json:
        emit_json(doc)
    else:
        for step in result.steps:
            click.echo(f"{step.status:<8} {step.id:<13} {step.detail}")
            for failure in step.failures[1:5]:
                click.echo(f"{'':<22} {failure.message}")
            if step.count > 5:
                click.echo(f"{'':<22} ... {step.count - 5} more in {doc['record']}")
        if result.vllm_surface:
            click.echo(f"{'vllm':<22} {result.vllm_surface}")
        click.echo(
            f"{'qualified' if result.qualified else 'NOT QUALIFIED'}: {chosen} "
            f"(gfx {result.host_gfx or 'unknown'}, {result.elf_files} ELF files, {result.elapsed_s} s)"
        )
    return result.qualified


def jit_environment(prefix: Path, state_dir: Path) -> dict[str, str]:
    """`serve`: the JIT cache variables for the current bundle and the gfx it was qualified for,
    under `state_dir/jit/<key>` (nothing when the bundle was never qualified: vLLM's defaults)."""
    from rocmdoctor.provision.bundle.qualify import recorded
    from rocmdoctor.provision.server import jit_cache

    doc = recorded(prefix / "current")
    if doc is None or not isinstance(doc.get("bundle_digest"), str):
        return {}
    try:
        return jit_cache.prepare(
            HostWriter().trees, state_dir, doc["bundle_digest"], doc.get("host_gfx"), str(doc.get("tag"))
        )
    except OSError as exc:
        raise UserError(f"cannot create the JIT cache under {state_dir}: {exc.strerror or exc}") from None


def run_purge(prefix: Path, state_dir: Path, everything: bool, writer: HostWriter, as_json: bool) -> None:
    from rocmdoctor.provision.bundle.qualify import recorded
    from rocmdoctor.provision.server import jit_cache

    doc = recorded(prefix / "current")
    keep = None
    if not everything and doc is not None and isinstance(doc.get("bundle_digest"), str):
        keep = jit_cache.cache_key(doc["bundle_digest"], doc.get("host_gfx"))
    try:
        result = jit_cache.purge(writer, state_dir, keep)
    except jit_cache.PurgeRefused as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot purge the JIT caches under {state_dir}: {exc.strerror or exc}") from None
    emit_change(result, as_json, check=writer.check_mode)
