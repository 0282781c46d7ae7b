"""`rocmdoctor install` and `rollback` (also `bundle install|rollback`): a bundle activated under a prefix
(what every bundle command shares is in bundle_setup.py).

Output mirrors Ansible: `--json` prints {"schema_version": SCHEMA_VERSION, "changed": ..., "msg": ..., ...} on stdout
(with "failed": true on failure), so a playbook can use `changed_when`/`failed_when` on it.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rocmdoctor import params
from rocmdoctor.commands.bundle_qualify import SKIP_WARNING
from rocmdoctor.commands.bundle_qualify import summary as qualification_summary
from rocmdoctor.commands.bundle_setup import (
    InstallSettings,
    failures,
    install_plan,
    prefix_option,
    progress,
    run_prune,
)
from rocmdoctor.commands.common import (
    WITH_ROOT_FACTS,
    App,
    emit_change,
    pass_app,
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

if TYPE_CHECKING:
    from rocmdoctor.provision.bundle.install import InstallPlan, InstallResult, PruneResult
    from rocmdoctor.provision.bundle.selection import Choice


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
    prefix: Path,
    plan: InstallPlan,
    choice: Choice,
    warnings: list[str],
    result: InstallResult,
    prune_doc: PruneResult | None,
    as_json: bool,
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
