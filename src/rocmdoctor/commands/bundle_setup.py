"""What every bundle command shares (`install`, `rollback`, `bundle ...`, `upgrade`): errors as exit
codes, progress, the prefix option, the family chosen from this host, the prune. Not a command:
commands import it, so no command imports another."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rocmdoctor import params
from rocmdoctor.commands.common import App, UserError, emit_json, refuse_root_facts_for_live_action
from rocmdoctor.commands.option_groups import (
    DownloadOptions,
    NetworkOptions,
    PinOptions,
    QualifyChoice,
    ReleaseSelection,
)
from rocmdoctor.facts.manifest import Manifest
from rocmdoctor.model import envelope

if TYPE_CHECKING:
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.provision.bundle.install import PruneResult


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


def run_prune(prefix: Path, keep: int, writer: HostWriter) -> PruneResult:
    from rocmdoctor.host import Host
    from rocmdoctor.provision.bundle.install import prune

    # Processes are this machine's, whatever --root the diagnosis reads.
    return prune(prefix, keep, Host(Path("/")), writer)


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
