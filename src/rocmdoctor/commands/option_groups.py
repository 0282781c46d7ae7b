"""Option groups: options that travel together, declared once and parsed once into a frozen dataclass.

`@option_group(Cls, "name", *click_options)` declares the options on a command and hands the command one
`Cls` instance as the keyword `name` (the dataclass's fields are the options' parameter names), so a
command body never reads options out of a `dict[str, Any]` and two commands cannot spell a group
differently. The groups of the bundle commands (`install`, `bundles --available`, `bundle lock|fetch`,
`bundle qualify`) are here.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from rocmdoctor import params
from rocmdoctor.cli import App, UserError

F = TypeVar("F", bound=Callable[..., Any])


def option_group(cls: type, name: str, *options: Callable[[F], F]) -> Callable[[F], F]:
    fields = [f.name for f in dataclasses.fields(cls)]

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = cls(**{field: kwargs.pop(field) for field in fields})
            return fn(*args, **kwargs)

        for option in reversed(options):
            command = option(command)
        return command  # type: ignore[return-value]

    return decorate


@dataclass(frozen=True)
class PinOptions:
    """Where the manifest and lock come from (tests, fleets and internal builds pin their own)."""

    bundles_dir: Path | None
    manifest_file: Path | None
    lock_file: Path | None
    api_url: str | None
    repo: str | None

    def load(self, prefix: Path) -> tuple[Any, Any, Any]:
        """(PinSources, Manifest, Lock): the one place the pins are read; a bad file is exit 2."""
        from rocmdoctor.facts.manifest import REPO_PATTERN, ManifestError
        from rocmdoctor.provision.bundle.manifest import PinSources

        sources = PinSources.resolve(
            self.bundles_dir, self.manifest_file, self.lock_file, prefix / "lock.json"
        )
        try:
            manifest, lock = sources.load()
        except ManifestError as exc:
            raise UserError(f"{exc}") from None
        if self.repo:
            if not REPO_PATTERN.fullmatch(self.repo):
                raise UserError(f"--repo must look like owner/name, not {self.repo!r}")
            manifest.override_repo(self.repo)
        return sources, manifest, lock

    def release_api(self) -> str:
        from rocmdoctor.provision.bundle.github_release import api_url

        return api_url(self.api_url)


pin_options = option_group(
    PinOptions,
    "pins",
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
)


@dataclass(frozen=True)
class NetworkOptions:
    """Deadlines of the release API and the downloads; with `--retries/--min-rate/--rate-window` (the
    download group) also how a slow part is retried."""

    connect_timeout: float
    read_timeout: float
    api_deadline: float

    def api(self) -> Any:
        from rocmdoctor.provision.bundle.github_release import ApiOptions

        return ApiOptions(
            connect_timeout_s=self.connect_timeout,
            read_timeout_s=self.read_timeout,
            deadline_s=self.api_deadline,
        )


network_options = option_group(
    NetworkOptions,
    "network",
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
)


@dataclass(frozen=True)
class DownloadOptions:
    """How a part is downloaded: retries and the rate below which a transfer counts as stalled."""

    retries: int
    min_rate: float
    rate_window: float

    def settings(self, network: NetworkOptions) -> Any:
        from rocmdoctor.provision.bundle.download import DownloadOptions as Settings

        return Settings(
            connect_timeout_s=network.connect_timeout,
            read_timeout_s=network.read_timeout,
            retries=self.retries,
            min_rate_bps=self.min_rate,
            rate_window_s=self.rate_window,
        )


download_options = option_group(
    DownloadOptions,
    "download",
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
)


@dataclass(frozen=True)
class ReleaseSelection:
    """Which release: the shared vocabulary of install, bundle lock and bundle fetch."""

    channel: str | None
    tag: str | None
    pinned: bool
    frozen: bool

    def request(
        self,
        family: str,
        manifest: Any,
        lock: Any,
        prefix: Path,
        mirror: str | None = None,
        version: str | None = None,
    ) -> Any:
        """The selection.Request for one family."""
        from rocmdoctor.provision.bundle.selection import Request

        if sum(bool(x) for x in (self.channel, self.tag, self.pinned)) > 1:
            raise UserError("pass at most one of --channel, --tag and --pinned")
        request = functools.partial(
            Request, version=version, frozen=self.frozen, mirror=mirror, prefix=prefix
        )
        if self.tag:
            return request(family, mode="tag", tag=self.tag)
        if self.pinned:
            return request(family, mode="pinned")
        entry = lock.families.get(family)
        if not self.channel and (self.frozen or (entry is not None and entry.pinned and entry.assets)):
            return request(family, mode="lock")
        default = manifest.families[family].channel if family in manifest.families else "stable"
        return request(family, mode="channel", channel=self.channel or default)


selection_options = option_group(
    ReleaseSelection,
    "selection",
    click.option(
        "--channel",
        type=click.Choice(["stable", "nightly"]),
        default=None,
        help="Newest release of this channel for the family, preferring qualified ones "
        "(default when the lock pins nothing: the manifest's channel, stable).",
    ),
    click.option("--tag", default=None, help="This exact release; digests from the lock or the release API."),
    click.option("--pinned", is_flag=True, help="The manifest's reviewed release for the family."),
    click.option(
        "--frozen",
        is_flag=True,
        help="Refuse any release the lock does not pin (no digests trusted on first use).",
    ),
)


@dataclass(frozen=True)
class QualifyChoice:
    """What qualification checks a bundle for: the GPU ISA and how long its Python may take to import."""

    gfx: str | None
    import_timeout: float

    def settings(self, app: App, skip: bool = False, family_targets: tuple[str, ...] = ()) -> Any:
        """`family_targets`: the ISAs of the bundle's family. Without --gfx and without a GPU of the
        family on this host (a build host), code objects are checked for every one of them."""
        from rocmdoctor.commands.bundle_qualify import host_gfx
        from rocmdoctor.provision.bundle.qualify import QualifyOptions

        gfx = host_gfx(app, self.gfx)
        if self.gfx is None and family_targets and gfx not in family_targets:
            return QualifyOptions(
                gfx=None,
                skip=skip,
                import_timeout_s=self.import_timeout,
                targets=family_targets,
                host_root=app.root,
            )
        return QualifyOptions(gfx=gfx, skip=skip, import_timeout_s=self.import_timeout, host_root=app.root)


qualify_options = option_group(
    QualifyChoice,
    "qualification",
    click.option(
        "--gfx",
        default=None,
        metavar="GFX",
        help="The GPU ISA to qualify the bundle's code objects for (default: this host's GPU, "
        "from the diagnosis; none found: that step is skipped).",
    ),
    click.option(
        "--import-timeout",
        default=180.0,
        show_default=True,
        type=params.Duration(max_s=3600),
        help="Seconds the bundle's Python may take to import torch and vllm._C.",
    ),
)
