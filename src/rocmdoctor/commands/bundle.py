"""`rocmdoctor bundles` and the `bundle` group: list, lock (pins), fetch (mirrors), prune, qualify, cache.

`bundle install|rollback|list` are the group's spellings of the documented short forms `install`,
`rollback` and `bundles`. Output mirrors Ansible: `--json` prints the change envelope (schema_version,
changed, msg, ...; failed: true on failure), so a playbook can use `changed_when`/`failed_when` on it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rocmdoctor import params
from rocmdoctor.commands.bundle_qualify import qualification_state, run_purge, run_qualify
from rocmdoctor.commands.bundle_setup import Failed, auto_family, failures, prefix_option, progress, run_prune
from rocmdoctor.commands.common import App, UserError, emit_change, emit_json, pass_app
from rocmdoctor.commands.install import install, rollback  # the group's spellings of the two commands
from rocmdoctor.commands.option_groups import (
    DownloadOptions,
    NetworkOptions,
    PinOptions,
    QualifyChoice,
    ReleaseSelection,
    download_options,
    network_options,
    pin_options,
    qualify_options,
    selection_options,
)
from rocmdoctor.model import Change, envelope, state_diff

if TYPE_CHECKING:
    from rocmdoctor.facts.manifest import Manifest
    from rocmdoctor.provision.bundle.manifest import Lock
    from rocmdoctor.provision.bundle.selection import Request


@click.command()
@prefix_option
@click.option(
    "--available",
    is_flag=True,
    help="List what the release server offers for this host's family (or --family), "
    "marked installed/current.",
)
@click.option("--family", default="auto", show_default=True, help="With --available: the GPU family.")
@pin_options
@network_options
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON on stdout.")
@pass_app
def bundles(
    app: App,
    prefix: Path,
    available: bool,
    family: str,
    as_json: bool,
    pins: PinOptions,
    network: NetworkOptions,
) -> None:
    """List installed bundles and which one is current (--available: what the release server offers)."""
    from rocmdoctor.provision.bundle.install import Layout

    layout = Layout(prefix)  # reads only: a missing prefix lists nothing and is not created
    found = layout.installed()
    for entry in found:
        entry["qualification"], doc = qualification_state(Path(entry["path"]))
        entry["qualification_failure"] = _first_failure(doc)
    if available:
        _available(app, layout, found, family, as_json, pins, network)
        return
    if as_json:
        emit_json(
            envelope(
                prefix=str(prefix),
                current=layout.current_tag(),
                previous=layout.previous_tag(),
                bundles=found,
            )
        )
        return
    if not found:
        click.echo(f"no bundles under {prefix}")
        return
    for entry in found:
        mark = "*" if entry["current"] else ("<" if entry["previous"] else " ")
        click.echo(
            f"{mark} {entry['tag']:<40} {entry['family'] or '?':<8} {entry['installed_at'] or 'incomplete'}"
            f"  {entry['qualification']}"
        )
        if entry["qualification_failure"]:
            click.echo(f"    {entry['qualification_failure']}")


def _first_failure(doc: dict[str, Any] | None) -> str | None:
    from rocmdoctor.provision.bundle.qualify import first_failure

    return first_failure(doc) if doc is not None and not doc["qualified"] else None


def _available(
    app: App,
    layout: Any,
    found: list[dict],
    family: str,
    as_json: bool,
    pins: PinOptions,
    network: NetworkOptions,
) -> None:
    from rocmdoctor.provision.bundle.selection import available, resolve_family

    with failures(as_json):
        _, manifest, lock = pins.load(layout.prefix)
        chosen = (
            auto_family(app, layout.prefix, True, manifest)[0]
            if family == "auto"
            else resolve_family(family, manifest)
        )
        rows, skipped = available(chosen, manifest, lock, pins.release_api(), network.api())
    installed = {b["tag"]: b for b in found}
    for row in rows:
        row["installed"] = row["tag"] in installed
        row["current"] = row["tag"] == layout.current_tag()
    if as_json:
        emit_json(
            envelope(
                family=chosen,
                repo=manifest.repo_for(chosen),
                current=layout.current_tag(),
                available=rows,
                skipped=skipped,
            )
        )
        return
    if not rows:
        click.echo(f"the release server offers no {chosen} bundle for {manifest.repo_for(chosen)}")
    for row in rows:
        mark = "*" if row["current"] else ("i" if row["installed"] else " ")
        flags = [row["channel"], "qualified" if row["qualified"] else "not qualified"]
        flags += [f for f, on in (("pinned", row["pinned"]), ("reviewed", row["reviewed_default"])) if on]
        flags += [] if row["digests"] else ["NO DIGESTS"]
        click.echo(f"{mark} {row['tag']:<60} {', '.join(flags)}")


@click.group()
def bundle() -> None:
    """The vllm-rocm bundles: install, rollback, list, lock (pins), fetch (mirrors), prune, qualify."""


def _families(requested: tuple[str, ...], manifest: Any) -> list[str]:
    from rocmdoctor.provision.bundle.selection import resolve_family

    return [resolve_family(f, manifest) for f in requested] or sorted(manifest.families)


@bundle.command("lock")
@click.option("--family", "families", multiple=True, help="Families to pin (default: all in the manifest).")
@click.option(
    "--channel",
    type=click.Choice(["stable", "nightly"]),
    default=None,
    help="Pin the newest release of this channel (default: the manifest's channel per family).",
)
@click.option("--tag", default=None, help="Pin this exact release (its family only).")
@click.option("--pinned", is_flag=True, help="Pin the manifest's reviewed tag of each family.")
@prefix_option
@pin_options
@network_options
@click.option(
    "--out",
    type=params.NonEmptyPath(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the lock (default: --lock, <bundles-dir>/lock.json, else <prefix>/lock.json).",
)
@click.option("--check", is_flag=True, help="Dry run: say what would change, write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print an Ansible-style JSON result on stdout.")
def lock(
    families: tuple[str, ...],
    channel: str | None,
    tag: str | None,
    pinned: bool,
    prefix: Path,
    out: Path | None,
    check: bool,
    as_json: bool,
    pins: PinOptions,
    network: NetworkOptions,
) -> None:
    """Refresh the lock file (part names, sizes, sha256 digests) from the release API."""
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.provision.bundle.selection import refresh_lock

    # through the one write seam: under --check it records the write and makes none
    writer = HostWriter(Path("/"), check_mode=check)
    with failures(as_json):
        sources, manifest, current = pins.load(prefix)
        target = out or sources.lock or prefix / "lock.json"
        selection = ReleaseSelection(channel, tag, pinned, frozen=False)
        requests_ = _lock_requests(selection, families, manifest, current, prefix)
        updated, report = refresh_lock(manifest, current, requests_, pins.release_api(), network.api())
        changed = any(r.get("changed") for r in report)
        if changed:
            try:
                writer.trees.make_dirs(target.parent.absolute())
                lock_text = json.dumps(updated.to_json(), indent=2) + "\n"
                writer.write_file(str(target.absolute()), lock_text.encode())
            except OSError as exc:
                raise Failed(f"cannot write {target}: {exc.strerror or exc}; pass --out FILE") from None
    failed = [r for r in report if not r["pinned"]]
    moved = [r["family"] for r in report if r.get("changed")]
    diff = state_diff(
        {f: current.families[f].tag if f in current.families else None for f in moved},
        {f: updated.families[f].tag for f in moved},
    )
    change = Change(
        changed,
        f"{writer.past('pinned', 'pin')} {len(report) - len(failed)} of {len(report)} families into {target}",
        diff,
        {"check": writer.check_mode, "failed": bool(failed), "lock": str(target), "families": report},
    )
    rows = [
        f"{'ok  ' if r['pinned'] else 'FAIL'} {r['family']:<8} {r['tag'] or '-'}: {r['msg']}" for r in report
    ]
    emit_change(change, as_json, rows)
    if failed:
        sys.exit(1)


def _lock_requests(
    selection: ReleaseSelection, families: tuple[str, ...], manifest: Manifest, current: Lock, prefix: Path
) -> list[Request]:
    """What `bundle lock` asks the release API for each family (--tag: its own family only)."""
    from rocmdoctor.provision.bundle.selection import family_from_tag

    tag = selection.tag
    if tag:
        chosen = [family_from_tag(tag)]
        if families and list(families) != chosen:
            raise UserError(f"--tag {tag} is for {chosen[0]}, not --family {', '.join(families)}")
    else:
        chosen = _families(families, manifest)
    requests_ = [selection.request(f, manifest, current, prefix) for f in chosen]
    # `bundle lock` always asks the API: a family the lock pins is re-read on its channel.
    return [
        r
        if r.mode != "lock"
        else type(r)(**{**vars(r), "mode": "channel", "channel": _channel_of(manifest, r.family)})
        for r in requests_
    ]


def _channel_of(manifest: Any, family: str) -> str:
    return manifest.families[family].channel if family in manifest.families else "stable"


@bundle.command("fetch")
@click.option(
    "--to",
    "dest",
    required=True,
    type=params.NonEmptyPath(file_okay=False, path_type=Path),
    help="Mirror directory to fill (flat file names, usable with install --mirror). Refused if another "
    "user can write it, unless it is sticky.",
)
@click.option("--family", "families", multiple=True, help="Families to fetch (default: every pinned one).")
@selection_options
@click.option("--mirror", default=None, help="Fetch from this directory or base URL instead of GitHub.")
@prefix_option
@pin_options
@download_options
@network_options
@click.option("--check", is_flag=True, help="Dry run: say which parts would be fetched, write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print an Ansible-style JSON result on stdout.")
def fetch(
    dest: Path,
    families: tuple[str, ...],
    mirror: str | None,
    prefix: Path,
    check: bool,
    as_json: bool,
    selection: ReleaseSelection,
    pins: PinOptions,
    download: DownloadOptions,
    network: NetworkOptions,
) -> None:
    """Download and verify bundle parts into a mirror directory (idempotent)."""
    from rocmdoctor.provision.bundle.download import lexists
    from rocmdoctor.provision.bundle.install import fetch_to
    from rocmdoctor.provision.bundle.selection import choose_release, family_from_tag

    with failures(as_json):
        _, manifest, lock_doc = pins.load(prefix)
        if selection.tag:
            chosen = [family_from_tag(selection.tag)]
        elif families:
            chosen = _families(families, manifest)
        elif selection.channel or selection.pinned:
            chosen = sorted(manifest.families)
        else:
            chosen = sorted(f for f, e in lock_doc.families.items() if e.pinned and f in manifest.families)
            if not chosen:
                raise UserError(
                    "no family is pinned in the lock; pass --family F (newest stable), or run "
                    "`rocmdoctor bundle lock` first"
                )
        sources = []
        for f in chosen:
            request = selection.request(f, manifest, lock_doc, prefix, mirror)
            sources += choose_release(request, manifest, lock_doc, pins.release_api(), network.api()).sources
        if check:
            missing = [s.asset.name for s in sources if not lexists(dest / s.asset.name)]
            would = f"would fetch {len(missing)} part(s) and verify {len(sources) - len(missing)} in {dest}"
            emit_change(
                Change(bool(missing), would, data={"check": True}), as_json, fetched=missing, mirror=str(dest)
            )
            return
        with progress(not as_json, sum(s.asset.size for s in sources), extracting=False) as (on_bytes, _):
            fetched = [
                (asset.name, new)
                for asset, new in fetch_to(sources, dest, download.settings(network), on_bytes)
            ]
    new = [name for name, was_new in fetched if was_new]
    done = f"{len(new)} part(s) fetched, {len(fetched) - len(new)} already present and verified in {dest}"
    emit_change(Change(bool(new), done), as_json, fetched=new, mirror=str(dest))


@bundle.command("prune")
@prefix_option
@click.option(
    "--keep",
    type=click.IntRange(1, 1000),
    default=2,
    show_default=True,
    help="Bundles to keep: current, then previous, then the newest others.",
)
@click.option("--check", is_flag=True, help="Dry run: say what would be removed, remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print an Ansible-style JSON result on stdout.")
def prune(prefix: Path, keep: int, check: bool, as_json: bool) -> None:
    """Remove old bundles (keeps current and previous); refuses one a running process uses."""
    from rocmdoctor.host_writes import HostWriter

    with failures(as_json):
        result = run_prune(prefix, keep, HostWriter(Path("/"), check_mode=check))
    emit_change(result.change(), as_json)
    if result.failed:
        sys.exit(1)


# One group for everything that handles bundles; the top-level `install`, `rollback` and `bundles`
# stay as the documented short forms of `bundle install`, `bundle rollback` and `bundle list`.
bundle.add_command(install, "install")
bundle.add_command(rollback, "rollback")
bundle.add_command(bundles, "list")


@bundle.command("qualify")
@click.argument("tag", required=False)
@prefix_option
@qualify_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@pass_app
def qualify(app: App, tag: str | None, prefix: Path, as_json: bool, qualification: QualifyChoice) -> None:
    """Check an installed bundle (default: current) for this host: libraries, symbols, GPU code
    objects, compiler, imports; record the result with it. Exit 1 when it is not qualified."""
    from rocmdoctor.provision.bundle.install import InvalidRequest

    with failures(as_json):
        try:
            qualified = run_qualify(app, prefix, tag, as_json, qualification.settings(app))
        except InvalidRequest as exc:
            raise UserError(str(exc)) from None
    if not qualified:
        sys.exit(1)


@bundle.group("cache")
def cache() -> None:
    """The service's JIT caches (Triton, inductor, vLLM, AITER), keyed by bundle and GPU."""


@cache.command("purge")
@prefix_option
@click.option(
    "--state-dir",
    type=params.NonEmptyPath(file_okay=False, path_type=Path),
    default=Path("/var/lib/vllm"),
    show_default=True,
    help="The service's state directory (its caches are under jit/); `serve` uses ~/.cache/rocmdoctor.",
)
@click.option("--all", "everything", is_flag=True, help="Also the current bundle's cache.")
@click.option("--check", is_flag=True, help="Dry run: say what would be removed, remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print an Ansible-style JSON result on stdout.")
def cache_purge(prefix: Path, state_dir: Path, everything: bool, check: bool, as_json: bool) -> None:
    """Remove JIT caches built for other bundles or GPUs (and partial ones with them)."""
    from rocmdoctor.host_writes import HostWriter

    with failures(as_json):
        try:
            run_purge(prefix, state_dir, everything, HostWriter(Path("/"), check_mode=check), as_json)
        except OSError as exc:
            raise Failed(f"cannot purge {state_dir}/jit: {exc.strerror or exc}") from None
