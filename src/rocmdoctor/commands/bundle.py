"""`rocmdoctor install`, `rollback`, `bundles` and `bundle lock|fetch`: the vllm-rocm bundle on this host.

Output mirrors Ansible: `--json` prints {"schema_version": 1, "changed": ..., "msg": ..., ...} on stdout
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

from ..registry import DEFAULT_PREFIX
from .common import App, UserError, emit_json, pass_app

# Checks that make an install pointless: without them the bundle cannot run on this host.


class Failed(click.ClickException):
    """The operation ran and failed (network, digest, refusal): exit 1, message says what to do next."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"rocmdoctor: {self.format_message()}", err=True)


def _prefix_option(fn: Callable) -> Callable:
    return click.option(
        "--prefix",
        type=click.Path(file_okay=False, path_type=Path),
        default=DEFAULT_PREFIX,
        envvar="ROCMDOCTOR_PREFIX",
        show_default=True,
        help="Where bundles live (bundles/<tag>, current, previous). [env: ROCMDOCTOR_PREFIX]",
    )(fn)


def _pin_options(fn: Callable) -> Callable:
    """Where the manifest and lock come from (tests, fleets and internal builds pin their own)."""
    for decorator in reversed(
        [
            click.option(
                "--bundles-dir",
                type=click.Path(file_okay=False, path_type=Path),
                envvar="ROCMDOCTOR_BUNDLES",
                help="Directory with manifest.toml and lock.json to use instead of the shipped ones. "
                "[env: ROCMDOCTOR_BUNDLES]",
            ),
            click.option(
                "--manifest",
                "manifest_file",
                type=click.Path(dir_okay=False, path_type=Path),
                help="manifest.toml to use (overrides --bundles-dir).",
            ),
            click.option(
                "--lock",
                "lock_file",
                type=click.Path(dir_okay=False, path_type=Path),
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


def _download_options(fn: Callable) -> Callable:
    for decorator in reversed(
        [
            click.option("--connect-timeout", default=10.0, show_default=True, help="Seconds to connect."),
            click.option(
                "--read-timeout", default=30.0, show_default=True, help="Seconds without data before a retry."
            ),
            click.option("--retries", default=5, show_default=True, help="Retries per part (with backoff)."),
        ]
    ):
        fn = decorator(fn)
    return fn


def _download_settings(kwargs: dict[str, Any]) -> Any:
    from ..provision.download import DownloadOptions

    return DownloadOptions(
        connect_timeout_s=kwargs["connect_timeout"],
        read_timeout_s=kwargs["read_timeout"],
        retries=kwargs["retries"],
    )


def _load_pins(kwargs: dict[str, Any], prefix: Path) -> tuple[Any, Any, Any]:
    from ..provision.manifest import ManifestError, PinSources

    sources = PinSources.resolve(
        kwargs["bundles_dir"], kwargs["manifest_file"], kwargs["lock_file"], prefix / "lock.json"
    )
    try:
        manifest, lock = sources.load()
    except ManifestError as exc:
        raise UserError(f"{exc}") from None
    if kwargs["repo"]:
        from ..provision.manifest import REPO_PATTERN

        if not REPO_PATTERN.match(kwargs["repo"]):
            raise UserError(f"--repo must look like owner/name, not {kwargs['repo']!r}")
        manifest.repo = kwargs["repo"]
    return sources, manifest, lock


@contextlib.contextmanager
def _failures(as_json: bool) -> Iterator[None]:
    """Turn the provisioning errors into exit codes and messages (and JSON with failed: true)."""
    from ..provision.download import DownloadError
    from ..provision.install import InstallError
    from ..provision.manifest import ManifestError
    from ..provision.plan import PlanError

    def report(message: str, exc_type: type[click.ClickException]) -> click.ClickException:
        if as_json:
            emit_json({"schema_version": 1, "changed": False, "failed": True, "msg": message})
        return exc_type(message)

    try:
        yield
    except (PlanError, ManifestError) as exc:
        raise report(str(exc), UserError) from None
    except UserError as exc:
        raise report(exc.format_message(), UserError) from None
    except (InstallError, DownloadError) as exc:
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

    from ..console import make_console

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


def _auto_family(app: App, prefix: Path, force: bool, manifest: Any) -> tuple[str, list[str]]:
    """The family of this host's GPU, and what the policy says blocks an install (refused unless --force)."""
    from ..model import Action
    from ..policy import blocking
    from ..provision.plan import resolve_family
    from ..registry import Context, Options

    try:
        from ..checks import facts, load_registry
    except ImportError:
        raise UserError(
            "--family auto needs the host diagnosis, which this build lacks; pass --family "
            f"({', '.join(sorted(manifest.families))})"
        ) from None
    ctx = Context(app.host(), Options(prefix=str(prefix)))
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
        raise UserError("no AMD GPU family found on this host (under --root); pass --family explicitly")
    if len(families) > 1:
        raise UserError(f"this host has GPUs of several families ({', '.join(families)}); pass --family")
    return resolve_family(families[0], manifest), problems


def _emit(result: dict[str, Any], as_json: bool, line: str) -> None:
    if as_json:
        emit_json(result)
    else:
        click.echo(line)


@click.command()
@click.option(
    "--family",
    default="auto",
    show_default=True,
    help="GPU family (gfx1151, gfx1150, gfx110X, gfx120X, gfx942, gfx950) or auto: from this host.",
)
@click.option("--version", "version", default=None, help="vLLM version the pins must match (e.g. 0.20.1).")
@click.option(
    "--tag", default=None, help="Install this exact release; parts and digests from the release API."
)
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
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Stage downloaded parts here (default <prefix>/bundles/.downloads; kept there for resuming).",
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
@click.option("--json", "as_json", is_flag=True, help="Print an Ansible-style JSON result on stdout.")
@pass_app
def install(
    app: App,
    family: str,
    version: str | None,
    tag: str | None,
    prefix: Path,
    mirror: str | None,
    force: bool,
    precompile: bool,
    extractor: str,
    download_dir: Path | None,
    as_json: bool,
    **kwargs: Any,
) -> None:
    """Fetch, verify and activate the vllm-rocm bundle for this GPU family."""
    from ..provision.github_release import api_url
    from ..provision.install import InstallPlan
    from ..provision.install import install as run_install
    from ..provision.plan import family_from_tag, pinned_sources, release_sources, resolve_family

    with _failures(as_json):
        _, manifest, lock = _load_pins(kwargs, prefix)
        if mirror and not mirror.startswith(("http://", "https://")) and not Path(mirror).is_dir():
            raise UserError(f"--mirror {mirror}: not a directory or http(s) URL")
        warnings: list[str] = []
        if tag:
            chosen = family_from_tag(tag)
            if family not in ("auto", chosen):
                raise UserError(f"--tag {tag} is for {chosen}, not --family {family}")
            sources = release_sources(tag, manifest.repo, api_url(kwargs["api_url"]), lock, mirror)
        else:
            if family == "auto":
                chosen, warnings = _auto_family(app, prefix, force, manifest)
            else:
                chosen = resolve_family(family, manifest)
            tag, sources = pinned_sources(manifest, lock, chosen, version, mirror)
        plan = InstallPlan(
            prefix=prefix,
            family=chosen,
            tag=tag,
            repo=manifest.repo,
            sources=sources,
            force=force,
            precompile=precompile,
            download=_download_settings(kwargs),
            extractor=extractor,
            download_dir=download_dir,
        )
        with _progress(not as_json, plan.total_bytes) as (on_download, on_extract):
            plan.on_download, plan.on_extract = on_download, on_extract
            result = run_install(plan)
    doc = result.to_json()
    if warnings:
        doc["forced_past"] = warnings
    _emit(
        doc,
        as_json,
        f"{'changed' if result.changed else 'ok'}: {result.msg} ({prefix}/current -> {result.current})",
    )


@click.command()
@_prefix_option
@click.option(
    "--to", "to", default=None, metavar="TAG", help="Switch to this installed bundle (default: previous)."
)
@click.option("--json", "as_json", is_flag=True, help="Print an Ansible-style JSON result on stdout.")
def rollback(prefix: Path, to: str | None, as_json: bool) -> None:
    """Switch `current` back to the previous bundle (or --to TAG)."""
    from ..provision.install import rollback as run_rollback

    with _failures(as_json):
        result = run_rollback(prefix, to)
    _emit(result.to_json(), as_json, f"{'changed' if result.changed else 'ok'}: {result.msg}")


@click.command()
@_prefix_option
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON on stdout.")
def bundles(prefix: Path, as_json: bool) -> None:
    """List installed bundles and which one is current."""
    from ..provision.install import Layout

    layout = Layout(prefix)
    found = layout.installed()
    if as_json:
        emit_json(
            {
                "schema_version": 1,
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
        )


@click.group()
def bundle() -> None:
    """Maintain the pins (lock) and mirrors of the vllm-rocm bundles."""


def _families(requested: tuple[str, ...], manifest: Any) -> list[str]:
    from ..provision.plan import resolve_family

    return [resolve_family(f, manifest) for f in requested] or sorted(manifest.families)


@bundle.command("lock")
@click.option("--family", "families", multiple=True, help="Families to pin (default: all in the manifest).")
@_prefix_option
@_pin_options
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the lock (default: --lock, <bundles-dir>/lock.json, else <prefix>/lock.json).",
)
@click.option("--json", "as_json", is_flag=True, help="Print an Ansible-style JSON result on stdout.")
def lock(families: tuple[str, ...], prefix: Path, out: Path | None, as_json: bool, **kwargs: Any) -> None:
    """Refresh the lock file (part names, sizes, sha256 digests) from the release API."""
    from ..provision.github_release import api_url
    from ..provision.install import write_json_atomic
    from ..provision.plan import refresh_lock

    with _failures(as_json):
        sources, manifest, current = _load_pins(kwargs, prefix)
        target = out or sources.lock or prefix / "lock.json"
        updated, report = refresh_lock(
            manifest, current, _families(families, manifest), api_url(kwargs["api_url"])
        )
        changed = any(r.get("changed") for r in report)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(target, updated.to_json())
        except OSError as exc:
            raise Failed(f"cannot write {target}: {exc.strerror or exc}; pass --out FILE") from None
    failed = [r for r in report if not r["pinned"]]
    doc = {
        "schema_version": 1,
        "changed": changed,
        "failed": bool(failed),
        "lock": str(target),
        "msg": f"pinned {len(report) - len(failed)} of {len(report)} families into {target}",
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


@bundle.command("fetch")
@click.option(
    "--to",
    "dest",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Mirror directory to fill (flat file names, usable with install --mirror).",
)
@click.option("--family", "families", multiple=True, help="Families to fetch (default: every pinned one).")
@click.option(
    "--tag", default=None, help="Fetch this exact release (parts and digests from the release API)."
)
@click.option("--mirror", default=None, help="Fetch from this directory or base URL instead of GitHub.")
@_prefix_option
@_pin_options
@_download_options
@click.option("--json", "as_json", is_flag=True, help="Print an Ansible-style JSON result on stdout.")
def fetch(
    dest: Path,
    families: tuple[str, ...],
    tag: str | None,
    mirror: str | None,
    prefix: Path,
    as_json: bool,
    **kwargs: Any,
) -> None:
    """Download and verify bundle parts into a mirror directory (idempotent)."""
    from ..provision.github_release import api_url
    from ..provision.install import fetch_to
    from ..provision.plan import pinned_sources, release_sources

    with _failures(as_json):
        _, manifest, lock_doc = _load_pins(kwargs, prefix)
        if tag:
            sources = release_sources(tag, manifest.repo, api_url(kwargs["api_url"]), lock_doc, mirror)
        else:
            chosen = (
                _families(families, manifest)
                if families
                else sorted(f for f, e in lock_doc.families.items() if e.pinned and f in manifest.families)
            )
            if not chosen:
                raise UserError("no family is pinned in the lock; run `rocmdoctor bundle lock` first")
            sources = [s for f in chosen for s in pinned_sources(manifest, lock_doc, f, None, mirror)[1]]
        with _progress(not as_json, sum(s.asset.size for s in sources), extracting=False) as (on_bytes, _):
            fetched = [
                (asset.name, new)
                for asset, new in fetch_to(sources, dest, _download_settings(kwargs), on_bytes)
            ]
    new = [name for name, was_new in fetched if was_new]
    doc = {
        "schema_version": 1,
        "changed": bool(new),
        "msg": f"{len(new)} part(s) fetched, "
        f"{len(fetched) - len(new)} already present and verified in {dest}",
        "fetched": new,
        "mirror": str(dest),
    }
    _emit(doc, as_json, doc["msg"])
