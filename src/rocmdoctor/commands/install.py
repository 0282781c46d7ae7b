"""`rocmdoctor install` and `rollback` (also `bundle install|rollback`): a bundle activated under a prefix,
and the helpers every bundle command shares (errors as exit codes, progress, the prefix's writer).

Output mirrors Ansible: `--json` prints {"schema_version": SCHEMA_VERSION, "changed": ..., "msg": ..., ...} on stdout
(with "failed": true on failure), so a playbook can use `changed_when`/`failed_when` on it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from rocmdoctor import params
from rocmdoctor.commands.bundle_qualify import SKIP_WARNING
from rocmdoctor.commands.bundle_qualify import summary as qualification_summary
from rocmdoctor.commands.common import (
    WITH_ROOT_FACTS,
    App,
    UserError,
    emit_change,
    emit_json,
    pass_app,
    refuse_root_facts_for_live_action,
)
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
from rocmdoctor.facts.manifest import Manifest
from rocmdoctor.model import envelope


class Failed(click.ClickException):
    """The operation ran and failed (network, digest, refusal): exit 1, message says what to do next."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        from rocmdoctor.sensitive import redact_message

        click.echo(f"rocmdoctor: {redact_message(self.format_message())}", err=True)


prefix_option = params.prefix_option("Where bundles live (bundles/<tag>, current, previous).", path_type=Path)


@contextlib.contextmanager
def failures(as_json: bool) -> Iterator[None]:
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
def progress(enabled: bool, total: int, extracting: bool = True) -> Iterator[tuple[Any, Any]]:
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


def auto_family(app: App, prefix: Path, force: bool, manifest: Manifest) -> tuple[str, list[str]]:
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


@click.command()
@click.option(
    "--family",
    default="auto",
    show_default=True,
    help="GPU family (gfx1151, gfx1150, gfx110X, gfx120X, gfx942, gfx950) or auto: from this host.",
)
@click.option("--version", "version", default=None, help="vLLM version the release must have (e.g. 0.20.1).")
@selection_options
@prefix_option
@click.option(
    "--mirror",
    envvar="ROCMDOCTOR_MIRROR",
    default=None,
    help="Directory or base URL with the same file names (see `bundle fetch`). [env: ROCMDOCTOR_MIRROR]",
)
@pin_options
@download_options
@network_options
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
    version: str | None,
    selection: ReleaseSelection,
    pins: PinOptions,
    download: DownloadOptions,
    network: NetworkOptions,
    qualification: QualifyChoice,
) -> None:
    """Fetch, verify, qualify and activate the vllm-rocm bundle for this GPU family.

    Without --channel/--tag/--pinned: the release the lock pins for the family, else the newest of the
    manifest's channel (stable), whose published digests are then recorded in <prefix>/lock.json."""
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.provision.bundle.install import install as run_install

    prune_doc = None
    writer = HostWriter(Path("/"), check_mode=check)  # a bundle prefix is this host's, never under --root
    with failures(as_json):
        plan, choice, warnings = install_plan(
            app,
            family,
            prefix,
            mirror,
            version,
            InstallSettings(
                force, precompile, extractor, download_dir, retrust_tag, skip_qualify, with_root_facts
            ),
            selection,
            pins,
            download,
            network,
            qualification,
        )
        if skip_qualify and not check:
            click.echo(SKIP_WARNING.format(tag=choice.tag), err=True)
        with progress(not as_json and not check, plan.total_bytes) as (on_download, on_extract):
            plan.on_download, plan.on_extract = on_download, on_extract
            result = run_install(plan, writer)
        result.notes[:0] = choice.notes
        if prune_after:
            prune_doc = run_prune(prefix, 2, writer)
    _emit_installed(prefix, plan, choice, warnings, result, prune_doc, as_json)


def _emit_installed(
    prefix: Path, plan: Any, choice: Any, warnings: list[str], result: Any, prune_doc: Any, as_json: bool
) -> None:
    """The install's one envelope (joined by the prune's with --prune): exit 1 when the prune failed."""
    extra: dict[str, Any] = {"qualified": choice.qualified}
    if plan.qualify.last is not None:
        extra["qualification"] = qualification_summary(plan.qualify.last.to_json())
    extra["trusted_on_first_use"] = choice.trusted_on_first_use
    if warnings:
        extra["forced_past"] = warnings
    change = result.change()
    details = [f"{prefix}/current -> {result.current}", *(f"note: {n}" for n in result.notes)]
    if prune_doc is not None:
        # the install's Change, joined by the prune's: one result, changed if either changed
        extra["prune"] = prune_doc.to_json()
        change = replace(
            change,
            changed=change.changed or prune_doc.changed,
            data={**change.data, "failed": prune_doc.failed},
        )
        details.append(f"prune: {prune_doc.msg}")
    emit_change(change, as_json, details, **extra)
    if prune_doc is not None and prune_doc.failed:
        sys.exit(1)


@dataclass(frozen=True)
class InstallSettings:
    """The install options other than the release's selection (defaults: `upgrade`'s)."""

    force: bool = False
    precompile: bool = False
    extractor: str = "auto"
    download_dir: Path | None = None
    retrust_tag: str | None = None
    skip_qualify: bool = False
    with_root_facts: bool = False


def install_plan(
    app: App,
    family: str,
    prefix: Path,
    mirror: str | None,
    version: str | None,
    settings: InstallSettings,
    selection: ReleaseSelection,
    pins: PinOptions,
    download: DownloadOptions,
    network: NetworkOptions,
    qualification: QualifyChoice,
) -> tuple[Any, Any, list[str]]:
    """The InstallPlan of the release the options choose, the choice, and the checks forced past:
    the one plan `install` runs and `upgrade` stages beside the current bundle."""
    from rocmdoctor.provision.bundle.install import InstallPlan
    from rocmdoctor.provision.bundle.selection import choose_release, family_from_tag, resolve_family

    _, manifest, lock = pins.load(prefix)
    if mirror and not mirror.startswith(("http://", "https://")) and not Path(mirror).is_dir():
        raise UserError(f"--mirror {mirror}: not a directory or http(s) URL")
    warnings: list[str] = []
    tag = selection.tag
    if tag:
        chosen = family_from_tag(tag)
        if family not in ("auto", chosen):
            raise UserError(f"--tag {tag} is for {chosen}, not --family {family}")
    elif family == "auto":
        refuse_root_facts_for_live_action(app, settings.with_root_facts, "install --family auto")
        chosen, warnings = auto_family(app, prefix, settings.force, manifest)
    else:
        chosen = resolve_family(family, manifest)
    request = selection.request(chosen, manifest, lock, prefix, mirror, version)
    choice = choose_release(request, manifest, lock, pins.release_api(), network.api())
    retrust_tag = settings.retrust_tag
    if retrust_tag is not None and retrust_tag != choice.tag:
        raise UserError(f"--retrust-tag {retrust_tag[:200]!r} is not the release chosen ({choice.tag})")
    plan = InstallPlan(
        prefix=prefix,
        family=chosen,
        tag=choice.tag,
        repo=manifest.repo_for(chosen),
        sources=choice.sources,
        force=settings.force,
        precompile=settings.precompile,
        download=download.settings(network),
        extractor=settings.extractor,
        download_dir=settings.download_dir,
        pins=choice.lock_entry if choice.trusted_on_first_use else None,
        retrust=retrust_tag is not None,
        qualify=qualification.settings(
            app,
            settings.skip_qualify,
            manifest.families[chosen].targets if chosen in manifest.families else (),
        ),
    )
    return plan, choice, warnings


def prefix_writer(check: bool) -> Any:
    """The writer for a bundle prefix: on this host (the prefix is the user's, never under --root).
    Only `upgrade` calls it still (another helper's module): a command builds its HostWriter itself."""
    from rocmdoctor.host_writes import HostWriter

    return HostWriter(Path("/"), check_mode=check)


def run_prune(prefix: Path, keep: int, writer: Any) -> Any:
    from rocmdoctor.host import Host
    from rocmdoctor.provision.bundle.install import prune

    # Processes are this machine's, whatever --root the diagnosis reads.
    return prune(prefix, keep, Host(Path("/")), writer)


@click.command()
@prefix_option
@click.option(
    "--to", "to", default=None, metavar="TAG", help="Switch to this installed bundle (default: previous)."
)
@click.option("--force", is_flag=True, help="Switch even to a bundle that is not qualified for this host.")
@click.option("--check", is_flag=True, help="Dry run: say what would change, write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print an Ansible-style JSON result on stdout.")
def rollback(prefix: Path, to: str | None, force: bool, check: bool, as_json: bool) -> None:
    """Switch `current` back to the previous bundle (or --to TAG); only to a qualified one without --force."""
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.provision.bundle.install import rollback as run_rollback

    with failures(as_json):
        result = run_rollback(prefix, HostWriter(Path("/"), check_mode=check), to, force=force)
    emit_change(result.change(), as_json)
