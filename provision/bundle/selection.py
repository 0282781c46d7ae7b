"""Turn what the user asked for (family, channel, tag, mirror) and the pins into an InstallPlan:
which release, which parts, with which digests, from where. Nothing is downloaded here except release
metadata.

Which release:
    lock      the lock in force pins the family (and nothing else was asked): that pin, no network
    channel   --channel stable|nightly: the newest release of that channel for the family, preferring
              releases the project qualified (published as full releases, not prereleases)
    pinned    --pinned: the manifest's reviewed tag
    tag       --tag: that exact release
Where the digests come from: the lock when it pins that tag (cross-checked against the API when the
API is asked anyway); otherwise the `digest` GitHub publishes for each asset, trusted on first use
and recorded in <prefix>/lock.json by the install. `frozen` refuses anything the lock does not pin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from rocmdoctor.facts.manifest import (
    CHANNELS,
    Manifest,
    ManifestError,
    ReleaseTag,
    check_tag,
    parse_release_tag,
    tag_allowed,
)
from rocmdoctor.host_files import is_file
from rocmdoctor.provision.bundle.github_release import (
    ApiOptions,
    Release,
    ReleaseError,
    ReleaseList,
    TokenError,
    download_url,
    fetch_release,
    list_releases,
)
from rocmdoctor.provision.bundle.install import InstallError, Source
from rocmdoctor.provision.bundle.manifest import Asset, Lock, LockEntry


class PlanError(ValueError):
    """The request cannot be satisfied as given (unknown family, unpinned, ...); says what to do."""


def family_from_tag(tag: str) -> str:
    return tag.rsplit("-", 1)[-1]


def resolve_family(requested: str, manifest: Manifest) -> str:
    if requested in manifest.families:
        return requested
    mapped = manifest.family_for_gfx(requested)
    if mapped in manifest.families:
        return mapped
    raise PlanError(
        f"unknown GPU family {requested!r}; known: {', '.join(sorted(manifest.families))} "
        f"(from {manifest.source})"
    )


@dataclass(frozen=True)
class Request:
    """What the user asked for. `mode`: lock | channel | pinned | tag (see the module docstring)."""

    family: str
    mode: str = "channel"
    channel: str = "stable"
    tag: str | None = None
    version: str | None = None
    frozen: bool = False
    mirror: str | None = None
    prefix: Path | None = None  # for the messages that name the pinning command


@dataclass
class Choice:
    """The release to install and how its digests are known."""

    family: str
    tag: str
    sources: list[Source]
    trusted_on_first_use: bool  # digests from the release API, not from the lock
    qualified: bool | None = None  # False: published as a prerelease; None: not looked up
    notes: list[str] = field(default_factory=list)

    @property
    def lock_entry(self) -> LockEntry:
        return LockEntry(self.family, self.tag, True, tuple(s.asset for s in self.sources))


def _sources(assets: tuple[Asset, ...], repo: str, tag: str, mirror: str | None) -> list[Source]:
    sources = []
    for asset in assets:
        if mirror and mirror.startswith(("http://", "https://")):
            sources.append(Source(asset, url=f"{mirror.rstrip('/')}/{asset.name}"))
        elif mirror:
            local = Path(mirror) / asset.name
            if not is_file(local):
                raise PlanError(
                    f"the mirror {mirror} lacks {asset.name}; fill it with "
                    f"`rocmdoctor bundle fetch --tag {tag} --to {mirror}`"
                )
            sources.append(Source(asset, local=local))
        else:
            sources.append(Source(asset, url=asset.url or download_url(repo, tag, asset.name)))
    return sources


def _version_matches(want: str | None, tag: str) -> bool:
    if want is None:
        return True
    parsed = parse_release_tag(tag)
    try:
        wanted = Version(want.removeprefix("vllm"))
    except InvalidVersion:
        raise PlanError(f"--version {want!r} is not a version (e.g. 0.22.1)") from None
    return parsed is not None and parsed.version.release[: len(wanted.release)] == wanted.release


def _lock_command(request: Request, tag: str) -> str:
    prefix = f" --prefix {request.prefix}" if request.prefix else ""
    return f"rocmdoctor bundle lock --family {request.family} --tag {tag}{prefix}"


def _pinned_entry(lock: Lock, family: str, tag: str) -> LockEntry | None:
    entry = lock.families.get(family)
    return entry if entry is not None and entry.pinned and entry.tag == tag and entry.assets else None


def _from_release(release: Release, lock: Lock, request: Request, repo: str) -> Choice:
    """Digests for `release`: the lock's pins (which must agree with the API) or the API's own."""
    pinned = _pinned_entry(lock, request.family, release.tag)
    pins = {a.name: a for a in pinned.assets} if pinned else {}
    if request.frozen and not pinned:
        raise PlanError(
            f"--frozen: {release.tag} is not pinned in {lock.source}; review it and pin it with "
            f"`{_lock_command(request, release.tag)}` (or install without --frozen to trust the "
            "release's digests on first use)"
        )
    assets = []
    for asset in release.parts:
        pin = pins.get(asset.name)
        if pin and asset.digest and pin.digest != asset.digest:
            raise PlanError(
                f"{asset.name}: the release API says {asset.digest} but {lock.source} pins {pin.digest}: "
                "the release was rebuilt under the same tag; review it, then "
                f"`{_lock_command(request, release.tag)}`"
            )
        digest = asset.digest or (pin.digest if pin else None)
        if digest is None:
            raise PlanError(
                f"{asset.name} of {release.tag} has no digest in the release API and {lock.source} does "
                "not pin it; refusing to install unverified bytes (pin it in a lock file, --lock FILE)"
            )
        assets.append(Asset(asset.name, asset.size, digest, asset.url))
    if pinned and [a.name for a in assets] != [a.name for a in pinned.assets]:
        raise PlanError(
            f"the parts of {release.tag} in the release API differ from {lock.source}; the release was "
            f"rebuilt; review it, then `{_lock_command(request, release.tag)}`"
        )
    choice = Choice(
        request.family,
        release.tag,
        _sources(tuple(assets), repo, release.tag, request.mirror),
        trusted_on_first_use=not pinned,
        qualified=not release.prerelease,
    )
    if release.prerelease:
        choice.notes.append(
            f"{release.tag} is published as a prerelease: the project's qualification did not pass it"
        )
    return choice


@dataclass(frozen=True)
class Candidate:
    release: Release
    parsed: ReleaseTag

    @property
    def qualified(self) -> bool:
        return not self.release.prerelease


def candidates(listing: ReleaseList, family: str, channel: str | None = None) -> list[Candidate]:
    """vLLM (not omni) releases of `family`, newest first by PEP 440 order."""
    found = []
    for release in listing.releases:
        parsed = parse_release_tag(release.tag)
        if parsed is None or parsed.product != "vllm" or parsed.family != family:
            continue
        if channel is None or parsed.channel == channel:
            found.append(Candidate(release, parsed))
    return sorted(found, key=lambda c: c.parsed.version, reverse=True)


def choose(
    listing: ReleaseList, request: Request, repo: str, pattern: str | None = None
) -> tuple[Release, list[str]]:
    """The newest qualified release of the channel; the newest unqualified one only when no
    qualified one exists (and then say so)."""
    found = [
        c
        for c in candidates(listing, request.family, request.channel)
        if _version_matches(request.version, c.release.tag) and tag_allowed(pattern, c.release.tag)
    ]
    if not found:
        others = sorted({c.parsed.channel for c in candidates(listing, request.family)} - {request.channel})
        hint = f"; releases exist on: {', '.join(others)} (--channel)" if others else ""
        wanted = f" of vLLM {request.version}" if request.version else ""
        raise PlanError(
            f"no {request.channel} release{wanted} for {request.family} in {repo}{hint}; "
            "`rocmdoctor bundles --available` lists what the release server offers"
        )
    qualified = [c for c in found if c.qualified]
    notes = []
    if not qualified:
        notes.append(f"no qualified {request.channel} release of {request.family}; taking the newest")
    return (qualified or found)[0].release, notes


def choose_release(request: Request, manifest: Manifest, lock: Lock, api: str, options: ApiOptions) -> Choice:
    """Everything `install` and `bundle lock|fetch` need to know about the release to use."""
    repo = manifest.repo_for(request.family)
    pattern = manifest.tag_pattern(request.family)
    try:
        if request.mode == "lock":
            entry = lock.families.get(request.family)
            if entry is None or not entry.pinned or not entry.assets:
                prefix = f" --prefix {request.prefix}" if request.prefix else ""
                raise PlanError(
                    f"--frozen: {request.family} has no pinned digests in {lock.source}; review and pin "
                    f"the newest stable release with `rocmdoctor bundle lock --family {request.family}"
                    f"{prefix}` (or --tag TAG), or install without --frozen to trust the release's "
                    "digests on first use"
                )
            if not _version_matches(request.version, entry.tag):
                raise PlanError(
                    f"the pins install {entry.tag}, not vLLM {request.version}; pass --channel or "
                    "--tag vllm<ver>-rocm<ver>-<family> for another release"
                )
            return Choice(
                request.family,
                entry.tag,
                _sources(entry.assets, repo, entry.tag, request.mirror),
                trusted_on_first_use=False,
            )
        if request.mode == "pinned":
            tag = manifest.families[request.family].tag
            if tag is None:
                raise PlanError(
                    f"no release of {request.family} is pinned in {manifest.source}; pass --channel or "
                    f"--tag vllm<ver>-rocm<ver>-{request.family}"
                )
            if not _version_matches(request.version, tag):
                raise PlanError(
                    f"the pins install {tag}, not vLLM {request.version}; pass --tag "
                    "vllm<ver>-rocm<ver>-<family> for another release"
                )
            return _by_tag(tag, request, lock, repo, api, options)
        if request.mode == "tag":
            assert request.tag is not None
            try:
                check_tag(request.tag, request.family, "--tag")
            except ManifestError as exc:
                raise PlanError(str(exc)) from None
            if not tag_allowed(pattern, request.tag):
                raise PlanError(
                    f"--tag {request.tag} is not a {request.family} release of {repo} (its tags match "
                    f"{pattern!r} in {manifest.source})"
                )
            return _by_tag(request.tag, request, lock, repo, api, options)
        if request.channel not in CHANNELS:
            raise PlanError(f"--channel must be one of {', '.join(CHANNELS)}, not {request.channel!r}")
        release, notes = choose(list_releases(repo, api, options), request, repo, pattern)
        choice = _from_release(release, lock, request, repo)
        choice.notes[:0] = notes
        return choice
    except ReleaseError as exc:
        raise (PlanError if isinstance(exc, TokenError) else InstallError)(str(exc)) from None


def _by_tag(tag: str, request: Request, lock: Lock, repo: str, api: str, options: ApiOptions) -> Choice:
    pinned = _pinned_entry(lock, request.family, tag)
    if request.frozen and pinned is None:
        raise PlanError(
            f"--frozen: {tag} is not pinned in {lock.source}; review it and pin it with "
            f"`{_lock_command(request, tag)}` (or install without --frozen to trust the release's "
            "digests on first use)"
        )
    return _from_release(fetch_release(repo, tag, api, options), lock, request, repo)


def available(
    family: str, manifest: Manifest, lock: Lock, api: str, options: ApiOptions
) -> tuple[list[dict], list[str]]:
    """What the release server offers for `family`, newest first, marked against the pins."""
    try:
        listing = list_releases(manifest.repo_for(family), api, options)
    except ReleaseError as exc:
        raise (PlanError if isinstance(exc, TokenError) else InstallError)(str(exc)) from None
    entry = lock.families.get(family)
    rows = []
    for c in candidates(listing, family):
        if not tag_allowed(manifest.tag_pattern(family), c.release.tag):
            continue
        rows.append(
            {
                "tag": c.release.tag,
                "version": str(c.parsed.version),
                "rocm": c.parsed.rocm,
                "channel": c.parsed.channel,
                "qualified": c.qualified,
                "qualification_report": c.release.has_qualification_report,
                "digests": not c.release.undigested,
                "size": sum(a.size for a in c.release.parts),
                "pinned": bool(entry and entry.pinned and entry.tag == c.release.tag),
                "reviewed_default": manifest.families[family].tag == c.release.tag,
            }
        )
    return rows, listing.skipped


def _identity(entry: LockEntry) -> tuple:
    return (entry.tag, [(a.name, a.size, a.digest) for a in entry.assets])


def refresh_lock(
    manifest: Manifest, lock: Lock, requests_: list[Request], api: str, options: ApiOptions
) -> tuple[Lock, list[dict]]:
    """Pin each request's release from the release API. Families whose release lacks digests (or
    cannot be read) stay as they were and are reported."""
    updated = Lock(repo=manifest.repo, families=dict(lock.families), source=lock.source)
    report = []
    for request in requests_:
        before = lock.families.get(request.family)
        # Re-reading the API is the point of `bundle lock`: do not reuse the lock's own pins.
        unpinned = Lock(
            lock.repo, {f: e for f, e in lock.families.items() if f != request.family}, lock.source
        )
        try:
            choice = choose_release(request, manifest, unpinned, api, options)
        except (PlanError, InstallError) as exc:
            report.append(
                {
                    "family": request.family,
                    "tag": request.tag,
                    "pinned": False,
                    "changed": False,
                    "msg": str(exc),
                }
            )
            continue
        entry = choice.lock_entry
        changed = before is None or not before.pinned or _identity(before) != _identity(entry)
        if not changed and before is not None:
            entry = before  # keep the lock byte for byte (URLs recorded earlier included)
        updated.families[request.family] = entry
        report.append(
            {
                "family": request.family,
                "tag": choice.tag,
                "pinned": True,
                "changed": changed,
                "qualified": choice.qualified,
                "msg": f"pinned {len(entry.assets)} part(s) of {choice.tag}"
                + ("".join(f"; {n}" for n in choice.notes)),
            }
        )
    return updated, report
