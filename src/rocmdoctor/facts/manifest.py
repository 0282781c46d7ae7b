"""The bundles' manifest (`bundles/manifest.toml`, or the one a fleet or test pins): the one reader.

Which vllm-rocm bundle family runs on which GPU (`targets`), the reviewed tag per family and where its
releases come from. The diagnosis (`check` names a GPU's family), `install --family auto`, `bundles
--available` and the role all read it here; the command line puts the manifest the user chose
(`--bundles-dir`, `--manifest`) on the check context, so a fleet's own manifest can add a family.

manifest.toml:
    schema_version = 1
    repo = "lemonade-sdk/vllm-rocm"
    [families.gfx1151]
    targets = ["gfx1151"]         # the gfx ISAs this family's bundle runs on (default: the family's
                                  # own name when it is one gfx name)
    tag = "vllm0.20.1-rocm7.12.0-gfx1151"   # optional: without it, install needs --tag
    repo = "owner/name"           # optional: where this family is published (default: the top repo)
    tag_pattern = "vllm[^-]+-rocm[^-]+-gfx942"  # optional: which of that repo's release tags count
    channel = "stable"            # stable | nightly
    parts = ["<tag>-x64.part01-of-02.tar.gz", ...]   # optional: the lock supplies them

Release tags: `vllm<PEP 440 version>-rocm<ver>-<family>` (`vllm-omni<ver>-...` for the omni variant);
stable tags carry plain versions, nightly ones dev/pre versions with a local part
(`vllm0.25.2.dev0+rocm7.15.0a20260724.g752a3a504.d20260724-rocm7.15.0-gfx1151`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from packaging.version import InvalidVersion, Version

from rocmdoctor.model import SCHEMA_VERSION

CHANNELS = ("stable", "nightly")
DEFAULT_REPO = "lemonade-sdk/vllm-rocm"
REPO_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
PART_NAME = re.compile(r"\.part(\d{2})-of-(\d{2})\.tar\.gz\Z")
MAX_PATTERN = 200
MAX_MANIFEST_CHARS = 4 << 20  # a manifest of every family ever shipped is a few KiB
_GFX = re.compile(r"^gfx[0-9a-fA-F]{3,4}[A-Za-z]?$")


class ManifestError(ValueError):
    """A manifest or lock file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class FamilyPin:
    family: str
    tag: str | None  # None: a known family without a reviewed release (install needs --tag)
    channel: str
    parts: tuple[str, ...] = ()
    repo: str | None = None  # where this family is published, when not the manifest's repo
    tag_pattern: str | None = None  # the family's release tags in that repo (a regular expression)
    targets: tuple[str, ...] = ()  # the gfx ISAs this family's bundle runs on


@dataclass
class Manifest:
    repo: str
    families: dict[str, FamilyPin] = field(default_factory=dict)
    source: str = ""

    def repo_for(self, family: str) -> str:
        """The repository a family's releases come from: its own, else the manifest's."""
        pin = self.families.get(family)
        return pin.repo if pin is not None and pin.repo else self.repo

    def tag_pattern(self, family: str) -> str | None:
        pin = self.families.get(family)
        return pin.tag_pattern if pin is not None else None

    def family_for_gfx(self, gfx: str | None) -> str | None:
        """The bundle family a gfx target runs with, or None when no family lists it."""
        if not gfx:
            return None
        return next((f for f, pin in self.families.items() if gfx in pin.targets), None)

    def family_names(self) -> list[str]:
        """In the manifest's order (the order people see them in messages)."""
        return list(self.families)

    def override_repo(self, repo: str) -> None:
        """--repo: every family from this repository."""
        self.repo = repo
        self.families = {f: replace(p, repo=None) for f, p in self.families.items()}


def _load_toml(text: str, where: str) -> dict[str, Any]:
    from rocmdoctor.documents import DocumentError, load_toml

    try:
        return load_toml(text, where, MAX_MANIFEST_CHARS)
    except DocumentError as exc:
        raise ManifestError(str(exc)) from None


def need(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in doc:
        raise ManifestError(f"{where}: missing field '{key}'")
    value = doc[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ManifestError(f"{where}: field '{key}' must be {names}, not {type(value).__name__}")
    return value


def check_schema(doc: dict[str, Any], where: str) -> None:
    version = need(doc, "schema_version", int, where)
    if version != SCHEMA_VERSION:
        raise ManifestError(
            f"{where}: field 'schema_version' is {version}; this rocmdoctor reads {SCHEMA_VERSION}"
        )


def check_repo(doc: dict[str, Any], where: str) -> str:
    repo = need(doc, "repo", str, where)
    if not REPO_PATTERN.fullmatch(repo):
        raise ManifestError(f"{where}: field 'repo' must look like owner/name, not {repo!r}")
    return repo


TAG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def check_tag(tag: str, family: str, where: str) -> None:
    """Tags become directory names under <prefix>/bundles: plain names only."""
    if not TAG_NAME.fullmatch(tag) or not tag.endswith("-" + family):
        raise ManifestError(
            f"{where}: field 'tag' {tag!r} must end with '-{family}' (vllm<ver>-rocm<ver>-<family>)"
        )


@dataclass(frozen=True)
class ReleaseTag:
    """What a release tag says: product (vllm | vllm-omni), version, ROCm, family, channel."""

    tag: str
    product: str
    version: Version
    rocm: str | None
    family: str

    @property
    def channel(self) -> str:
        # Stable builds strip the local part; nightlies are dev/pre releases built on ROCm nightlies.
        v = self.version
        return "nightly" if v.is_prerelease or v.is_devrelease or v.local is not None else "stable"


def parse_release_tag(tag: str) -> ReleaseTag | None:
    """Parse a release tag; None when it is not one (an unrelated release in the same repo).

    Split only on '-' from the right (family, then ROCm) and hand the rest to `packaging`: the
    version's local part may hold '+' and '.' but never '-'."""
    if not TAG_NAME.fullmatch(tag):
        return None
    head, _, family = tag.rpartition("-")
    if not head or not family.startswith("gfx"):
        return None
    rocm = None
    rest, _, last = head.rpartition("-")
    if rest and last.startswith("rocm"):
        head, rocm = rest, last
    for product in ("vllm-omni", "vllm"):
        if head.startswith(product):
            try:
                version = Version(head[len(product) :])
            except InvalidVersion:
                return None
            return ReleaseTag(tag, product, version, rocm, family)
    return None


def parse_manifest(text: str, where: str = "manifest.toml") -> Manifest:
    doc = _load_toml(text, where)
    check_schema(doc, where)
    manifest = Manifest(repo=check_repo(doc, where), source=where)
    families = need(doc, "families", dict, where)
    if not families:
        raise ManifestError(f"{where}: field 'families' is empty")
    for family, entry in families.items():
        at = f"{where}: families.{family}"
        if not isinstance(entry, dict):
            raise ManifestError(f"{at} must be a table")
        tag = need(entry, "tag", str, at) if "tag" in entry else None
        if tag is not None:
            check_tag(tag, family, at)
        channel = need(entry, "channel", str, at)
        if channel not in CHANNELS:
            raise ManifestError(
                f"{at}: field 'channel' must be one of {', '.join(CHANNELS)}, not {channel!r}"
            )
        parts = entry.get("parts", [])
        if not isinstance(parts, list) or not all(isinstance(p, str) and p for p in parts):
            raise ManifestError(f"{at}: field 'parts' must be a list of file names")
        if parts and tag is None:
            raise ManifestError(f"{at}: field 'parts' needs a 'tag'")
        for part in parts:
            check_asset_name(part, str(tag), f"{at}: field 'parts'")
        repo, pattern = _family_source(entry, tag, at)
        targets = _targets(entry, at, manifest)
        manifest.families[family] = FamilyPin(family, tag, channel, tuple(parts), repo, pattern, targets)
    return manifest


def _targets(entry: dict[str, Any], at: str, manifest: Manifest) -> tuple[str, ...]:
    """A family's gfx targets: each a gfx name, and in one family only (else `--family auto` would guess).
    Without `targets`, a family named after one gfx target (gfx1151) runs on that target alone."""
    family = at.rsplit(".", 1)[-1]
    targets = entry.get("targets", [family] if _GFX.fullmatch(family) else [])
    if not isinstance(targets, list) or not all(isinstance(t, str) and _GFX.fullmatch(t) for t in targets):
        raise ManifestError(f"{at}: field 'targets' must be a list of gfx names (e.g. [\"gfx1151\"])")
    for target in targets:
        other = manifest.family_for_gfx(target)
        if other is not None:
            raise ManifestError(f"{at}: field 'targets': {target} is already a target of family {other}")
    return tuple(targets)


def _family_source(entry: dict[str, Any], tag: str | None, at: str) -> tuple[str | None, str | None]:
    """A family's own `repo` and `tag_pattern` (both optional)."""
    repo = need(entry, "repo", str, at) if "repo" in entry else None
    if repo is not None and not REPO_PATTERN.match(repo):
        raise ManifestError(f"{at}: field 'repo' must look like owner/name, not {repo!r}")
    pattern = need(entry, "tag_pattern", str, at) if "tag_pattern" in entry else None
    if pattern is not None:
        if not pattern or len(pattern) > MAX_PATTERN:
            raise ManifestError(
                f"{at}: field 'tag_pattern' must be a regular expression of 1 to {MAX_PATTERN} characters"
            )
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ManifestError(f"{at}: field 'tag_pattern' is not a regular expression ({exc})") from None
        if tag is not None and not compiled.fullmatch(tag):
            raise ManifestError(f"{at}: field 'tag' {tag!r} does not match its 'tag_pattern' {pattern!r}")
    return repo, pattern


def tag_allowed(pattern: str | None, tag: str) -> bool:
    return pattern is None or re.fullmatch(pattern, tag) is not None


def check_asset_name(name: str, tag: str, where: str) -> None:
    if "/" in name or name.startswith("."):
        raise ManifestError(f"{where}: {name!r} is not a plain file name")
    if not name.startswith(f"{tag}-x64.") or not (PART_NAME.search(name) or name.endswith("-x64.tar.gz")):
        raise ManifestError(f"{where}: {name!r} is not a part of {tag} (<tag>-x64.partNN-of-MM.tar.gz)")


@lru_cache(maxsize=1)
def shipped_manifest() -> Manifest:
    """The manifest shipped in the wheel: what the diagnosis uses when the user named none."""
    text = resources.files("rocmdoctor.bundles").joinpath("manifest.toml").read_text(encoding="utf-8")
    return parse_manifest(text, "(shipped) manifest.toml")
