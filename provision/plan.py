"""Turn what the user asked for (family, version, tag, mirror) and the pins into an InstallPlan:
which parts, with which digests, from where. Nothing is downloaded here except release metadata."""

from __future__ import annotations

from pathlib import Path

from ..families import family_for_gfx
from .github_release import ReleaseError, fetch_release
from .install import InstallError, Source
from .manifest import Asset, Lock, LockEntry, Manifest, ManifestError, check_tag

GITHUB_DOWNLOAD = "https://github.com/{repo}/releases/download/{tag}/{name}"


class PlanError(ValueError):
    """The request cannot be satisfied as given (unknown family, unpinned, ...); says what to do."""


def family_from_tag(tag: str) -> str:
    return tag.rsplit("-", 1)[-1]


def resolve_family(requested: str, manifest: Manifest) -> str:
    if requested in manifest.families:
        return requested
    mapped = family_for_gfx(requested)
    if mapped in manifest.families:
        return mapped
    raise PlanError(
        f"unknown GPU family {requested!r}; known: {', '.join(sorted(manifest.families))} "
        f"(from {manifest.source})"
    )


def _sources(assets: tuple[Asset, ...], repo: str, tag: str, mirror: str | None) -> list[Source]:
    sources = []
    for asset in assets:
        if mirror and mirror.startswith(("http://", "https://")):
            sources.append(Source(asset, url=f"{mirror.rstrip('/')}/{asset.name}"))
        elif mirror:
            local = Path(mirror) / asset.name
            if not local.is_file():
                raise PlanError(
                    f"the mirror {mirror} lacks {asset.name}; fill it with "
                    f"`rocmdoctor bundle fetch --family {family_from_tag(tag)} --to {mirror}`"
                )
            sources.append(Source(asset, local=local))
        else:
            sources.append(
                Source(asset, url=asset.url or GITHUB_DOWNLOAD.format(repo=repo, tag=tag, name=asset.name))
            )
    return sources


def _check_version(version: str | None, tag: str) -> None:
    if version is None:
        return
    wanted = version if version.startswith("vllm") else f"vllm{version}-"
    if not tag.startswith(wanted):
        raise PlanError(
            f"the pins install {tag}, not vLLM {version}; pass --tag vllm<ver>-rocm<ver>-<family> "
            "for another release (or pin it with `rocmdoctor bundle lock`)"
        )


def pinned_sources(
    manifest: Manifest, lock: Lock, family: str, version: str | None, mirror: str | None
) -> tuple[str, list[Source]]:
    pin = manifest.families[family]
    if pin.tag is None:
        raise PlanError(
            f"no release of {family} is pinned in {manifest.source}; pass --tag "
            f"vllm<ver>-rocm<ver>-{family} (digests then come from the release API)"
        )
    _check_version(version, pin.tag)
    entry = lock.families.get(family)
    if entry is None or not entry.pinned:
        raise PlanError(
            f"{family} ({pin.tag}) has no pinned digests in {lock.source}; run "
            f"`rocmdoctor bundle lock --family {family}` (against GitHub or --api-url) and rerun"
        )
    return pin.tag, _sources(entry.assets, manifest.repo, pin.tag, mirror)


def release_sources(tag: str, repo: str, api_url: str, lock: Lock, mirror: str | None) -> list[Source]:
    """--tag: part names, sizes and digests from the release API; a digest the API lacks must be pinned."""
    try:
        check_tag(tag, family_from_tag(tag), "--tag")
    except ManifestError as exc:
        raise PlanError(str(exc)) from None
    try:
        release = fetch_release(repo, tag, api_url)
    except ReleaseError as exc:
        raise InstallError(str(exc)) from None
    entry = lock.families.get(family_from_tag(tag))
    pinned = {a.name: a for a in entry.assets} if entry and entry.tag == tag else {}
    assets = []
    for asset in release.parts:
        pin = pinned.get(asset.name)
        if pin and asset.digest and pin.digest != asset.digest:
            raise PlanError(
                f"{asset.name}: the release API says {asset.digest} but {lock.source} pins {pin.digest}: "
                "the release was rebuilt under the same tag; review it, then `rocmdoctor bundle lock`"
            )
        digest = asset.digest or (pin.digest if pin else None)
        if digest is None:
            raise PlanError(
                f"{asset.name} of {tag} has no digest in the release API and {lock.source} does not "
                "pin it; refusing to install unverified bytes (pin it in a lock file, --lock FILE)"
            )
        assets.append(Asset(asset.name, asset.size, digest, asset.url))
    return _sources(tuple(assets), repo, tag, mirror)


def refresh_lock(
    manifest: Manifest, lock: Lock, families: list[str], api_url: str
) -> tuple[Lock, list[dict]]:
    """Pin `families` from the release API. Families whose release lacks digests stay as they were."""
    updated = Lock(repo=manifest.repo, families=dict(lock.families), source=lock.source)
    report = []
    for family in families:
        tag = manifest.families[family].tag
        if tag is None:
            report.append(
                {
                    "family": family,
                    "tag": None,
                    "pinned": False,
                    "msg": f"the manifest names no release for {family}",
                }
            )
            continue
        try:
            release = fetch_release(manifest.repo, tag, api_url)
        except ReleaseError as exc:
            report.append({"family": family, "tag": tag, "pinned": False, "msg": str(exc)})
            continue
        unpinned = [a.name for a in release.parts if a.digest is None]
        if unpinned:
            report.append(
                {
                    "family": family,
                    "tag": tag,
                    "pinned": False,
                    "msg": f"the API gives no digest for {', '.join(unpinned)}; left unpinned",
                }
            )
            continue
        before = lock.families.get(family)
        entry = LockEntry(family, tag, True, release.parts)
        updated.families[family] = entry
        changed = before is None or before.assets != entry.assets or not before.pinned
        report.append(
            {
                "family": family,
                "tag": tag,
                "pinned": True,
                "changed": changed,
                "msg": f"pinned {len(release.parts)} part(s)",
            }
        )
    return updated, report
