"""`rocmdoctor install`, `rollback`, `bundles` and `bundle lock|fetch`: the vllm-rocm bundle on this host.

Output mirrors Ansible: `--json` prints {"schema_version": SCHEMA_VERSION, "changed": ..., "msg": ..., ...} on stdout
(with "failed": true on failure), so a playbook can use `changed_when`/`failed_when` on it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from rocmdoctor import params
from rocmdoctor.commands.bundle_qualify import (
    SKIP_WARNING,
    qualification_state,
    qualify_options,
    run_purge,
    run_qualify,
)
from rocmdoctor.commands.bundle_qualify import qualify_settings as _qualify_settings
from rocmdoctor.commands.bundle_qualify import summary as _qualification_summary
from rocmdoctor.commands.common import (
    WITH_ROOT_FACTS,
    App,
    UserError,
    emit_json,
    pass_app,
    refuse_root_facts_for_live_action,
)
from rocmdoctor.facts.manifest import Manifest
from rocmdoctor.model import SCHEMA_VERSION, envelope, state_diff

# Checks that make an install pointless: without them the bundle cannot run on this host.


class Failed(click.ClickException):
    """The operation ran and failed (network, digest, refusal): exit 1, message says what to do next."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        from rocmdoctor.sensitive import redact_message

        click.echo(f"rocmdoctor: {redact_message(self.format_message())}", err=True)


_prefix_option = params.prefix_option(
    "Where bundles live (bundles/<tag>, current, previous).", path_type=Path
)


def _pin_options(fn: Callable) -> Callable:
    """Where the manifest and lock come from (tests, fleets and internal builds pin their own)."""
    for decorator in reversed(
        [
            click.option(
                "--bundles-dir",
                type=params.NonEmptyPath(file_okay=False, path_type=Path),
                envvar="ROCMDOCTOR_BUNDLES",
                help="Directory with manifest.toml and lock.json to use instead of the shipped ones. "
                "[env: ROCMDOCTOR_BUNDLES]",
            ),
            click.option(
                "--manifest",
                "manifest_file",
                type=params.NonEmptyPath(dir_okay=False, path_type=Path),
                help="manifest.toml to use (overrides --bundles-dir).",
            ),
            click.option(
                "--lock",
                "lock_file",
                type=params.NonEmptyPath(dir_okay=False, path_type=Path),
                help="lock.json to use (default: <prefix>/lock.json if present, else the shipped one).",
            ),
            click.option(
                "--api-url",
                envvar="ROCMDOCTOR_GITHUB_API",
                default=None,
                help="GitHub API base URL (GitHub Enterprise, a mirror). [env: ROCMDOCTOR_GITHUB_API]",
            ),
            click.option(
                "--repo",
                default=None,
                help="owner/name of the releases (default: the manifest's, lemonade-sdk/vllm-rocm).",
            ),
        ]
    ):
        fn = decorator(fn)
    return fn


def _api_options(fn: Callable) -> Callable:
    for decorator in reversed(
        [
            click.option(
                "--connect-timeout",
                default=10.0,
                show_default=True,
                type=params.Duration(max_s=600),
                help="Seconds to connect (release API and downloads).",
            ),
            click.option(
                "--read-timeout",
                default=30.0,
                show_default=True,
                type=params.Duration(max_s=3600),
                help="Seconds without data before a retry (release API and downloads).",
            ),
            click.option(
                "--api-deadline",
                default=60.0,
                show_default=True,
                type=params.Duration(max_s=3600),
                help="Seconds for a whole release API answer, however slowly it trickles.",
            ),
        ]
    ):
        fn = decorator(fn)
    return fn


def _download_options(fn: Callable) -> Callable:
    for decorator in reversed(
        [
            click.option(
                "--retries",
                type=params.Count(0, 100),
                default=5,
                show_default=True,
                help="Retries per part (with backoff).",
            ),
            click.option(
                "--min-rate",
                default=16384.0,
                show_default=True,
                type=params.Rate(),
                help="Bytes/s a download must average over --rate-window, or it is retried (a stalled "
                "or trickling server fails; a slow mirror still works).",
            ),
            click.option(
                "--rate-window",
                default=30.0,
                show_default=True,
                type=params.Duration(max_s=3600),
                help="Seconds over which --min-rate is measured.",
            ),
        ]
    ):
        fn = decorator(fn)
    return _api_options(fn)


def _download_settings(kwargs: dict[str, Any]) -> Any:
    from rocmdoctor.provision.bundle.download import DownloadOptions

    return DownloadOptions(
        connect_timeout_s=kwargs["connect_timeout"],
        read_timeout_s=kwargs["read_timeout"],
        retries=kwargs["retries"],
        min_rate_bps=kwargs["min_rate"],
        rate_window_s=kwargs["rate_window"],
    )


def _api_settings(kwargs: dict[str, Any]) -> Any:
    from rocmdoctor.provision.bundle.github_release import ApiOptions

    return ApiOptions(
        connect_timeout_s=kwargs["connect_timeout"],
        read_timeout_s=kwargs["read_timeout"],
        deadline_s=kwargs["api_deadline"],
    )


def _load_pins(kwargs: dict[str, Any], prefix: Path) -> tuple[Any, Any, Any]:
    from rocmdoctor.facts.manifest import ManifestError
    from rocmdoctor.provision.bundle.manifest import PinSources

    sources = PinSources.resolve(
        kwargs["bundles_dir"], kwargs["manifest_file"], kwargs["lock_file"], prefix / "lock.json"
    )
    try:
        manifest, lock = sources.load()
    except ManifestError as exc:
        raise UserError(f"{exc}") from None
    if kwargs["repo"]:
        from rocmdoctor.facts.manifest import REPO_PATTERN

        if not REPO_PATTERN.fullmatch(kwargs["repo"]):
            raise UserError(f"--repo must look like owner/name, not {kwargs['repo']!r}")
        manifest.override_repo(kwargs["repo"])
    return sources, manifest, lock


@contextlib.contextmanager
def _failures(as_json: bool) -> Iterator[None]:
    """Turn the provisioning errors into exit codes and messages (and JSON with failed: true)."""
    from rocmdoctor.facts.manifest import ManifestError
    from rocmdoctor.provision.bundle.download import DownloadError, UnsafeDirectory
    from rocmdoctor.provision.bundle.install import InstallError, InvalidRequest, UnsafeBundle
    from rocmdoctor.provision.bundle.qualify import NotQualified
    from rocmdoctor.provision.bundle.selection import PlanError

    def report(message: str, exc_type: type[click.ClickException]) -> click.ClickException:
        from rocmdoctor.sensitive import redact_message

        message = redact_message(message)
        if as_json:
            emit_json(envelope(changed=False, failed=True, msg=message))
        return exc_type(message)

    try:
        yield
    except (PlanError, ManifestError, UnsafeDirectory, InvalidRequest, UnsafeBundle) as exc:
        raise report(str(exc), UserError) from None
    except UserError as exc:
        raise report(exc.format_message(), UserError) from None
    except (InstallError, DownloadError, NotQualified) as exc:
        raise report(str(exc), Failed) from None
    except Failed as exc:
        raise report(exc.format_message(), Failed) from None


@contextlib.contextmanager
def _progress(enabled: bool, total: int, extracting: bool = True) -> Iterator[tuple[Any, Any]]:
    """rich bars on a TTY (stderr); (download, extract) byte callbacks, None when silent."""
    if not enabled or not sys.stderr.isatty():
        yield None, None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from rocmdoctor.rendering.console import make_console

    with Progress(
        "{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=make_console(stderr=True),
        transient=False,
    ) as bars:
        download = bars.add_task("download", total=total)
        extract = bars.add_task("extract ", total=total) if extracting else None
        yield (
            functools.partial(bars.advance, download),
            functools.partial(bars.advance, extract) if extract is not None else None,
        )


def _auto_family(app: App, prefix: Path, force: bool, manifest: Manifest) -> tuple[str, list[str]]:
    """The family of this host's GPU, and what the policy says blocks an install (refused unless --force)."""
    from rocmdoctor.model import Action
    from rocmdoctor.policy import blocking
    from rocmdoctor.provision.bundle.selection import resolve_family
    from rocmdoctor.registry import Context, Options

    try:
        from rocmdoctor.checks import facts, load_registry
    except ImportError:
        raise UserError(
            "--family auto needs the host diagnosis, which this build lacks; pass --family "
            f"({', '.join(sorted(manifest.families))})"
        ) from None
    ctx = Context(app.host(), Options(prefix=str(prefix)), manifest=manifest)
    gpus = facts.gpus(ctx)
    families = sorted({g.family for g in gpus if g.family})
    registry = load_registry()
    verdict = blocking(registry.run(ctx, registry.select()), Action.INSTALL)
    problems = [b.line() for b in verdict.blockers]
    if problems and not force:
        raise Failed(
            "refusing to install while blocking checks fail (--force to install anyway):\n  "
            + "\n  ".join(problems)
        )
    if not families:
        unlisted = sorted({g.gfx for g in gpus if g.gfx})
        if unlisted:
            raise UserError(
                f"no bundle family in {manifest.source} runs on {', '.join(unlisted)} (its families: "
                f"{', '.join(manifest.family_names())}); pass --family, or add the target to a family's "
                "'targets' in that manifest"
            )
        raise UserError("no AMD GPU family found on this host (under --root); pass --family explicitly")
    if len(families) > 1:
        raise UserError(f"this host has GPUs of several families ({', '.join(families)}); pass --family")
    return resolve_family(families[0], manifest), problems


def _emit(result: dict[str, Any], as_json: bool, line: str) -> None:
    if as_json:
        emit_json(result)
    else:
        click.echo(line)


def _selection_options(fn: Callable) -> Callable:
    """Which release: the shared vocabulary of install, bundle lock and bundle fetch."""
    for decorator in reversed(
        [
            click.option(
                "--channel",
                type=click.Choice(["stable", "nightly"]),
                default=None,
                help="Newest release of this channel for the family, preferring qualified ones "
                "(default when the lock pins nothing: the manifest's channel, stable).",
            ),
            click.option(
                "--tag", default=None, help="This exact release; digests from the lock or the release API."
            ),
            click.option("--pinned", is_flag=True, help="The manifest's reviewed release for the family."),
            click.option(
                "--frozen",
                is_flag=True,
                help="Refuse any release the lock does not pin (no digests trusted on first use).",
            ),
        ]
    ):
        fn = decorator(fn)
    return fn


def _request(
    family: str, manifest: Any, lock: Any, kwargs: dict[str, Any], prefix: Path, mirror: str | None = None
) -> Any:
    """The plan.Request for one family from the selection options."""
    from rocmdoctor.provision.bundle.selection import Request

    channel, tag, pinned, frozen = kwargs["channel"], kwargs["tag"], kwargs["pinned"], kwargs["frozen"]
    if sum(bool(x) for x in (channel, tag, pinned)) > 1:
        raise UserError("pass at most one of --channel, --tag and --pinned")
    common = {"version": kwargs.get("version"), "frozen": frozen, "mirror": mirror, "prefix": prefix}
    if tag:
        return Request(family, mode="tag", tag=tag, **common)
    if pinned:
        return Request(family, mode="pinned", **common)
    entry = lock.families.get(family)
    if not channel and (frozen or (entry is not None and entry.pinned and entry.assets)):
        return Request(family, mode="lock", **common)
    default = manifest.families[family].channel if family in manifest.families else "stable"
    return Request(family, mode="channel", channel=channel or default, **common)


@click.command()
@click.option(
    "--family",
    default="auto",
    show_default=True,
    help="GPU family (gfx1151, gfx1150, gfx110X, gfx120X, gfx942, gfx950) or auto: from this host.",
)
@click.option("--version", "version", default=None, help="vLLM version the release must have (e.g. 0.20.1).")
@_selection_options
@_prefix_option
@click.option(
    "--mirror",
    envvar="ROCMDOCTOR_MIRROR",
    default=None,
    help="Directory or base URL with the same file names (see `bundle fetch`). [env: ROCMDOCTOR_MIRROR]",
)
@_pin_options
@_download_options
@click.option(
    "--force", is_flag=True, help="Reinstall even if current; install despite failing blocking checks."
)
@click.option(
    "--download-dir",
    type=params.NonEmptyPath(file_okay=False, path_type=Path),
    default=None,
    help="Stage downloaded parts here (default <prefix>/bundles/.downloads; kept there for resuming). "
    "Refused if another user can write it, unless it is sticky.",
)
@click.option("--precompile", is_flag=True, help="Compile the bundle's Python bytecode after extraction.")
@click.option(
    "--extractor",
    type=click.Choice(["auto", "tar", "python"]),
    default="auto",
    show_default=True,
    envvar="ROCMDOCTOR_EXTRACTOR",
    help="tar: GNU tar behind rocmdoctor's header checks (fast); python: tarfile with the data "
    "filter; auto: tar when GNU tar and pigz/gzip exist. [env: ROCMDOCTOR_EXTRACTOR]",
)
@click.option(
    "--prune", "prune_after", is_flag=True, help="Then remove bundles other than current and previous."
)
@qualify_options
@click.option(
    "--skip-qualify",
    is_flag=True,
    help="Activate without qualifying (experts only: loud, and recorded with the bundle).",
)
@click.option(
    "--retrust-tag",
    default=None,
    metavar="TAG",
    help="Accept new digests for TAG although <prefix>/lock.json recorded others for it (a release "
    "rebuilt under the same tag), and record the new ones. Without it such an install is refused.",
)
@WITH_ROOT_FACTS
@click.option("--check", is_flag=True, help="Dry run: say what would change, write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print an Ansible-style JSON result on stdout.")
@pass_app
def install(
    app: App,
    family: str,
    prefix: Path,
    mirror: str | None,
    force: bool,
    precompile: bool,
    extractor: str,
    download_dir: Path | None,
    prune_after: bool,
    retrust_tag: str | None,
    skip_qualify: bool,
    with_root_facts: bool,
    check: bool,
    as_json: bool,
    **kwargs: Any,
) -> None:
    """Fetch, verify, qualify and activate the vllm-rocm bundle for this GPU family.

    Without --channel/--tag/--pinned: the release the lock pins for the family, else the newest of the
    manifest's channel (stable), whose published digests are then recorded in <prefix>/lock.json."""
    from rocmdoctor.provision.bundle.github_release import api_url
    from rocmdoctor.provision.bundle.install import InstallPlan
    from rocmdoctor.provision.bundle.install import install as run_install
    from rocmdoctor.provision.bundle.selection import choose_release, family_from_tag, resolve_family

    prune_doc = None
    with _failures(as_json):
        _, manifest, lock = _load_pins(kwargs, prefix)
        if mirror and not mirror.startswith(("http://", "https://")) and not Path(mirror).is_dir():
            raise UserError(f"--mirror {mirror}: not a directory or http(s) URL")
        warnings: list[str] = []
        tag = kwargs["tag"]
        if tag:
            chosen = family_from_tag(tag)
            if family not in ("auto", chosen):
                raise UserError(f"--tag {tag} is for {chosen}, not --family {family}")
        elif family == "auto":
            refuse_root_facts_for_live_action(app, with_root_facts, "install --family auto")
            chosen, warnings = _auto_family(app, prefix, force, manifest)
        else:
            chosen = resolve_family(family, manifest)
        request = _request(chosen, manifest, lock, kwargs, prefix, mirror)
        choice = choose_release(request, manifest, lock, api_url(kwargs["api_url"]), _api_settings(kwargs))
        if retrust_tag is not None and retrust_tag != choice.tag:
            raise UserError(f"--retrust-tag {retrust_tag[:200]!r} is not the release chosen ({choice.tag})")
        plan = InstallPlan(
            prefix=prefix,
            family=chosen,
            tag=choice.tag,
            repo=manifest.repo_for(chosen),
            sources=choice.sources,
            force=force,
            precompile=precompile,
            download=_download_settings(kwargs),
            extractor=extractor,
            download_dir=download_dir,
            pins=choice.lock_entry if choice.trusted_on_first_use else None,
            retrust=retrust_tag is not None,
            qualify=_qualify_settings(app, kwargs, skip_qualify),
        )
        if skip_qualify and not check:
            click.echo(SKIP_WARNING.format(tag=choice.tag), err=True)
        with _progress(not as_json and not check, plan.total_bytes) as (on_download, on_extract):
            plan.on_download, plan.on_extract = on_download, on_extract
            result = run_install(plan, _prefix_writer(check))
        result.notes[:0] = choice.notes
        if prune_after:
            prune_doc = _run_prune(prefix, 2, check)
    doc = result.to_json()
    doc["qualified"] = choice.qualified
    if plan.qualify.last is not None:
        doc["qualification"] = _qualification_summary(plan.qualify.last.to_json())
    doc["trusted_on_first_use"] = choice.trusted_on_first_use
    if warnings:
        doc["forced_past"] = warnings
    if prune_doc is not None:
        doc["prune"] = prune_doc.to_json()
        doc["changed"] = doc["changed"] or prune_doc.changed
        doc["failed"] = prune_doc.failed
    lines = [f"{'changed' if doc['changed'] else 'ok'}: {result.msg} ({prefix}/current -> {result.current})"]
    lines += [f"  note: {n}" for n in result.notes]
    if prune_doc is not None:
        lines.append(f"  prune: {prune_doc.msg}")
    _emit(doc, as_json, "\n".join(lines))
    if prune_doc is not None and prune_doc.failed:
        sys.exit(1)


def _prefix_writer(check: bool) -> Any:
    """The writer for a bundle prefix: on this host (the prefix is the user's, never under --root)."""
    from rocmdoctor.host_writes import HostWriter

    return HostWriter(Path("/"), check_mode=check)


def _run_prune(prefix: Path, keep: int, check: bool) -> Any:
    from rocmdoctor.host import Host
    from rocmdoctor.provision.bundle.install import prune

    # Processes are this machine's, whatever --root the diagnosis reads.
    return prune(prefix, keep, Host(Path("/")), _prefix_writer(check))


@click.command()
@_prefix_option
@click.option(
    "--to", "to", default=None, metavar="TAG", help="Switch to this installed bundle (default: previous)."
)
@click.option("--force", is_flag=True, help="Switch even to a bundle that is not qualified for this host.")
@click.option("--check", is_flag=True, help="Dry run: say what would change, write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print an Ansible-style JSON result on stdout.")
def rollback(prefix: Path, to: str | None, force: bool, check: bool, as_json: bool) -> None:
    """Switch `current` back to the previous bundle (or --to TAG); only to a qualified one without --force."""
    from rocmdoctor.provision.bundle.install import rollback as run_rollback

    with _failures(as_json):
        result = run_rollback(prefix, _prefix_writer(check), to, force=force)
    _emit(result.to_json(), as_json, f"{'changed' if result.changed else 'ok'}: {result.msg}")


@click.command()
@_prefix_option
@click.option(
    "--available",
    is_flag=True,
    help="List what the release server offers for this host's family (or --family), "
    "marked installed/current.",
)
@click.option("--family", default="auto", show_default=True, help="With --available: the GPU family.")
@_pin_options
@_api_options
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON on stdout.")
@pass_app
def bundles(app: App, prefix: Path, available: bool, family: str, as_json: bool, **kwargs: Any) -> None:
    """List installed bundles and which one is current (--available: what the release server offers)."""
    from rocmdoctor.provision.bundle.install import Layout

    layout = Layout(prefix)  # reads only: a missing prefix lists nothing and is not created
    found = layout.installed()
    for entry in found:
        entry["qualification"], doc = qualification_state(Path(entry["path"]))
        entry["qualification_failure"] = _first_failure(doc)
    if available:
        _available(app, layout, found, family, as_json, kwargs)
        return
    if as_json:
        emit_json(
            {
                "schema_version": SCHEMA_VERSION,
                "prefix": str(prefix),
                "current": layout.current_tag(),
                "previous": layout.previous_tag(),
                "bundles": found,
            }
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


def _available(app: App, layout: Any, found: list[dict], family: str, as_json: bool, kwargs: dict) -> None:
    from rocmdoctor.provision.bundle.github_release import api_url
    from rocmdoctor.provision.bundle.selection import available, resolve_family

    with _failures(as_json):
        _, manifest, lock = _load_pins(kwargs, layout.prefix)
        chosen = (
            _auto_family(app, layout.prefix, True, manifest)[0]
            if family == "auto"
            else resolve_family(family, manifest)
        )
        rows, skipped = available(chosen, manifest, lock, api_url(kwargs["api_url"]), _api_settings(kwargs))
    installed = {b["tag"]: b for b in found}
    for row in rows:
        row["installed"] = row["tag"] in installed
        row["current"] = row["tag"] == layout.current_tag()
    if as_json:
        emit_json(
            {
                "schema_version": SCHEMA_VERSION,
                "family": chosen,
                "repo": manifest.repo_for(chosen),
                "current": layout.current_tag(),
                "available": rows,
                "skipped": skipped,
            }
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
@_prefix_option
@_pin_options
@_api_options
@click.option(
    "--out",
    type=params.NonEmptyPath(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the lock (default: --lock, <bundles-dir>/lock.json, else <prefix>/lock.json).",
)
@click.option("--check", is_flag=True, help="Dry run: say what would change, write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print an Ansible-style JSON result on stdout.")
def lock(
    families: tuple[str, ...], prefix: Path, out: Path | None, check: bool, as_json: bool, **kwargs: Any
) -> None:
    """Refresh the lock file (part names, sizes, sha256 digests) from the release API."""
    from rocmdoctor.provision.bundle.github_release import api_url
    from rocmdoctor.provision.bundle.install import write_json_atomic
    from rocmdoctor.provision.bundle.selection import family_from_tag, refresh_lock

    with _failures(as_json):
        sources, manifest, current = _load_pins(kwargs, prefix)
        target = out or sources.lock or prefix / "lock.json"
        if kwargs["tag"]:
            chosen = [family_from_tag(kwargs["tag"])]
            if families and list(families) != chosen:
                raise UserError(
                    f"--tag {kwargs['tag']} is for {chosen[0]}, not --family {', '.join(families)}"
                )
        else:
            chosen = _families(families, manifest)
        requests_ = [
            _request(f, manifest, current, {**kwargs, "frozen": False, "version": None}, prefix)
            for f in chosen
        ]
        # `bundle lock` always asks the API: a family the lock pins is re-read on its channel.
        requests_ = [
            r
            if r.mode != "lock"
            else type(r)(**{**vars(r), "mode": "channel", "channel": _channel_of(manifest, r.family)})
            for r in requests_
        ]
        updated, report = refresh_lock(
            manifest, current, requests_, api_url(kwargs["api_url"]), _api_settings(kwargs)
        )
        changed = any(r.get("changed") for r in report)
        if changed and not check:
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                write_json_atomic(target, updated.to_json())
            except OSError as exc:
                raise Failed(f"cannot write {target}: {exc.strerror or exc}; pass --out FILE") from None
    failed = [r for r in report if not r["pinned"]]
    verb = "would pin" if check else "pinned"
    moved = [r["family"] for r in report if r.get("changed")]
    doc = {
        "schema_version": SCHEMA_VERSION,
        "changed": changed,
        "check": check,
        "failed": bool(failed),
        "lock": str(target),
        "msg": f"{verb} {len(report) - len(failed)} of {len(report)} families into {target}",
        "diff": state_diff(
            {f: current.families[f].tag if f in current.families else None for f in moved},
            {f: updated.families[f].tag for f in moved},
        ),
        "families": report,
    }
    if as_json:
        emit_json(doc)
    else:
        for r in report:
            click.echo(f"{'ok  ' if r['pinned'] else 'FAIL'} {r['family']:<8} {r['tag'] or '-'}: {r['msg']}")
        click.echo(doc["msg"])
    if failed:
        sys.exit(1)


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
@_selection_options
@click.option("--mirror", default=None, help="Fetch from this directory or base URL instead of GitHub.")
@_prefix_option
@_pin_options
@_download_options
@click.option("--check", is_flag=True, help="Dry run: say which parts would be fetched, write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print an Ansible-style JSON result on stdout.")
def fetch(
    dest: Path,
    families: tuple[str, ...],
    mirror: str | None,
    prefix: Path,
    check: bool,
    as_json: bool,
    **kwargs: Any,
) -> None:
    """Download and verify bundle parts into a mirror directory (idempotent)."""
    from rocmdoctor.provision.bundle.download import lexists
    from rocmdoctor.provision.bundle.github_release import api_url
    from rocmdoctor.provision.bundle.install import fetch_to
    from rocmdoctor.provision.bundle.selection import choose_release, family_from_tag

    with _failures(as_json):
        _, manifest, lock_doc = _load_pins(kwargs, prefix)
        if kwargs["tag"]:
            chosen = [family_from_tag(kwargs["tag"])]
        elif families:
            chosen = _families(families, manifest)
        elif kwargs["channel"] or kwargs["pinned"]:
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
            request = _request(f, manifest, lock_doc, kwargs, prefix, mirror)
            api = api_url(kwargs["api_url"])
            sources += choose_release(request, manifest, lock_doc, api, _api_settings(kwargs)).sources
        if check:
            missing = [s.asset.name for s in sources if not lexists(dest / s.asset.name)]
            doc = {
                "schema_version": SCHEMA_VERSION,
                "changed": bool(missing),
                "check": True,
                "msg": f"would fetch {len(missing)} part(s) and verify {len(sources) - len(missing)} in {dest}",
                "fetched": missing,
                "mirror": str(dest),
            }
            _emit(doc, as_json, str(doc["msg"]))
            return
        with _progress(not as_json, sum(s.asset.size for s in sources), extracting=False) as (on_bytes, _):
            fetched = [
                (asset.name, new)
                for asset, new in fetch_to(sources, dest, _download_settings(kwargs), on_bytes)
            ]
    new = [name for name, was_new in fetched if was_new]
    doc = {
        "schema_version": SCHEMA_VERSION,
        "changed": bool(new),
        "msg": f"{len(new)} part(s) fetched, "
        f"{len(fetched) - len(new)} already present and verified in {dest}",
        "fetched": new,
        "mirror": str(dest),
    }
    _emit(doc, as_json, str(doc["msg"]))


@bundle.command("prune")
@_prefix_option
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
    with _failures(as_json):
        result = _run_prune(prefix, keep, check)
    _emit(result.to_json(), as_json, f"{'changed' if result.changed else 'ok'}: {result.msg}")
    if result.failed:
        sys.exit(1)


# One group for everything that handles bundles; the top-level `install`, `rollback` and `bundles`
# stay as the documented short forms of `bundle install`, `bundle rollback` and `bundle list`.
bundle.add_command(install, "install")
bundle.add_command(rollback, "rollback")
bundle.add_command(bundles, "list")


@bundle.command("qualify")
@click.argument("tag", required=False)
@_prefix_option
@qualify_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@pass_app
def qualify(app: App, tag: str | None, prefix: Path, as_json: bool, **kwargs: Any) -> None:
    """Check an installed bundle (default: current) for this host: libraries, symbols, GPU code
    objects, compiler, imports; record the result with it. Exit 1 when it is not qualified."""
    from rocmdoctor.provision.bundle.install import InvalidRequest

    with _failures(as_json):
        try:
            qualified = run_qualify(app, prefix, tag, as_json, kwargs)
        except InvalidRequest as exc:
            raise UserError(str(exc)) from None
    if not qualified:
        sys.exit(1)


@bundle.group("cache")
def cache() -> None:
    """The service's JIT caches (Triton, inductor, vLLM, AITER), keyed by bundle and GPU."""


@cache.command("purge")
@_prefix_option
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
    with _failures(as_json):
        try:
            run_purge(prefix, state_dir, everything, check, as_json)
        except OSError as exc:
            raise Failed(f"cannot purge {state_dir}/jit: {exc.strerror or exc}") from None
