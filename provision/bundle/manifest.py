"""The pinned description of the bundles: `manifest.toml` (what to install per family) and
`lock.json` (the exact part names, sizes and sha256 digests), both validated with errors naming the field.

manifest.toml:
    schema_version = 1
    repo = "lemonade-sdk/vllm-rocm"
    [families.gfx1151]
    tag = "vllm0.20.1-rocm7.12.0-gfx1151"   # optional: without it, install needs --tag
    repo = "owner/name"           # optional: where this family is published (default: the top repo)
    tag_pattern = "vllm[^-]+-rocm[^-]+-gfx942"  # optional: which of that repo's release tags count
    channel = "stable"            # stable | nightly
    parts = ["<tag>-x64.part01-of-02.tar.gz", ...]   # optional: the lock supplies them

lock.json:
    {"schema_version": 1, "repo": "...", "families": {"gfx1151": {"tag": "...", "pinned": true,
     "assets": [{"name": "...", "size": 123, "digest": "sha256:<64 hex>", "url": "optional"}]}}}
A family with "pinned": false has no verified digests yet. Install then takes the digests GitHub
publishes for the release it picks (trust on first use) and records them in `<prefix>/lock.json`;
`--frozen` refuses instead. A lock may pin another tag than the manifest's: the manifest's tag is the
reviewed default (`install --pinned`), the lock is what this prefix installs.

Release tags: `vllm<PEP 440 version>-rocm<ver>-<family>` (`vllm-omni<ver>-...` for the omni variant);
stable tags carry plain versions, nightly ones dev/pre versions with a local part
(`vllm0.25.2.dev0+rocm7.15.0a20260724.g752a3a504.d20260724-rocm7.15.0-gfx1151`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta
from packaging.version import InvalidVersion, Version

from rocmdoctor import documents
from rocmdoctor import host_files as files
from rocmdoctor.model import SCHEMA_VERSION

CHANNELS = ("stable", "nightly")
DEFAULT_REPO = "lemonade-sdk/vllm-rocm"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
REPO_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_PART = re.compile(r"\.part(\d{2})-of-(\d{2})\.tar\.gz\Z")
MAX_PART_BYTES = 1 << 44  # 16 TiB: a size that drives a download and a disk-space check
MAX_PATTERN = 200
PIN_FILE_LIMIT = 4 << 20  # a lock or manifest is a few kB; anything this large is not one


class ManifestError(ValueError):
    """A manifest or lock file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Asset:
    name: str
    size: int
    digest: str | None  # "sha256:<hex>"; None only for API answers without one
    url: str | None = None

    @property
    def hexdigest(self) -> str | None:
        return self.digest.split(":", 1)[1] if self.digest else None


@dataclass(frozen=True)
class FamilyPin:
    family: str
    tag: str | None  # None: a known family without a reviewed release (install needs --tag)
    channel: str
    parts: tuple[str, ...] = ()
    repo: str | None = None  # where this family is published, when not the manifest's repo
    tag_pattern: str | None = None  # the family's release tags in that repo (a regular expression)


@dataclass(frozen=True)
class LockEntry:
    family: str
    tag: str
    pinned: bool
    assets: tuple[Asset, ...] = ()


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

    def override_repo(self, repo: str) -> None:
        """--repo: every family from this repository."""
        self.repo = repo
        self.families = {f: replace(p, repo=None) for f, p in self.families.items()}


def _asset_json(asset: Asset) -> dict[str, Any]:
    return {k: v for k, v in vars(asset).items() if v is not None}


@dataclass
class Lock:
    repo: str
    families: dict[str, LockEntry] = field(default_factory=dict)
    source: str = ""
    # Trust on first use, per tag: the parts and digests this prefix first installed under each tag
    # (only in <prefix>/lock.json). Kept when a family's pin moves on, so a rebuilt release under an
    # older tag is still recognised.
    trusted: dict[str, tuple[Asset, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "repo": self.repo,
            "families": {
                f: {"tag": e.tag, "pinned": e.pinned, "assets": [_asset_json(a) for a in e.assets]}
                for f, e in sorted(self.families.items())
            },
        }
        if self.trusted:
            doc["trusted"] = {t: [_asset_json(a) for a in parts] for t, parts in sorted(self.trusted.items())}
        return doc

    def recorded(self, tag: str) -> tuple[Asset, ...]:
        """The parts recorded for `tag` (trusted, else a family entry pinning it with digests)."""
        if tag in self.trusted:
            return self.trusted[tag]
        for entry in self.families.values():
            if entry.tag == tag and entry.assets and all(a.digest for a in entry.assets):
                return entry.assets
        return ()


def with_entry(lock: Lock, entry: LockEntry, source: str | None = None) -> Lock:
    """A copy of `lock` that pins `entry` for its family (and records its parts as trusted for its tag)."""
    trusted = dict(lock.trusted)
    old = lock.families.get(entry.family)
    if old is not None and old.tag not in trusted and old.assets and all(a.digest for a in old.assets):
        trusted[old.tag] = old.assets  # the family's pin moves on; the record of its old tag stays
    if entry.assets and all(a.digest for a in entry.assets):
        trusted[entry.tag] = entry.assets
    return Lock(lock.repo, {**lock.families, entry.family: entry}, source or lock.source, trusted)


def _load_toml(text: str, where: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef,import-not-found,unused-ignore]
        except ModuleNotFoundError:
            raise ManifestError(
                f"{where}: reading TOML on Python 3.10 needs the 'tomli' package (pip install tomli)"
            ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{where}: not valid TOML: {exc}") from None


def _need(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in doc:
        raise ManifestError(f"{where}: missing field '{key}'")
    value = doc[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ManifestError(f"{where}: field '{key}' must be {names}, not {type(value).__name__}")
    return value


def _check_schema(doc: dict[str, Any], where: str) -> None:
    version = _need(doc, "schema_version", int, where)
    if version != SCHEMA_VERSION:
        raise ManifestError(
            f"{where}: field 'schema_version' is {version}; this rocmdoctor reads {SCHEMA_VERSION}"
        )


def _check_repo(doc: dict[str, Any], where: str) -> str:
    repo = _need(doc, "repo", str, where)
    if not REPO_PATTERN.fullmatch(repo):
        raise ManifestError(f"{where}: field 'repo' must look like owner/name, not {repo!r}")
    return repo


_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def check_tag(tag: str, family: str, where: str) -> None:
    """Tags become directory names under <prefix>/bundles: plain names only."""
    if not _TAG.fullmatch(tag) or not tag.endswith("-" + family):
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
    if not _TAG.fullmatch(tag):
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
    _check_schema(doc, where)
    manifest = Manifest(repo=_check_repo(doc, where), source=where)
    families = _need(doc, "families", dict, where)
    if not families:
        raise ManifestError(f"{where}: field 'families' is empty")
    for family, entry in families.items():
        at = f"{where}: families.{family}"
        if not isinstance(entry, dict):
            raise ManifestError(f"{at} must be a table")
        tag = _need(entry, "tag", str, at) if "tag" in entry else None
        if tag is not None:
            check_tag(tag, family, at)
        channel = _need(entry, "channel", str, at)
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
        manifest.families[family] = FamilyPin(family, tag, channel, tuple(parts), repo, pattern)
    return manifest


def _family_source(entry: dict[str, Any], tag: str | None, at: str) -> tuple[str | None, str | None]:
    """A family's own `repo` and `tag_pattern` (both optional)."""
    repo = _need(entry, "repo", str, at) if "repo" in entry else None
    if repo is not None and not REPO_PATTERN.match(repo):
        raise ManifestError(f"{at}: field 'repo' must look like owner/name, not {repo!r}")
    pattern = _need(entry, "tag_pattern", str, at) if "tag_pattern" in entry else None
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
    if not name.startswith(f"{tag}-x64.") or not (_PART.search(name) or name.endswith("-x64.tar.gz")):
        raise ManifestError(f"{where}: {name!r} is not a part of {tag} (<tag>-x64.partNN-of-MM.tar.gz)")


def parse_asset(doc: Any, where: str, digest_required: bool = True) -> Asset:
    if not isinstance(doc, dict):
        raise ManifestError(f"{where} must be an object")
    name = _need(doc, "name", str, where)
    size = _need(doc, "size", int, where)
    if not 0 < size <= MAX_PART_BYTES:
        raise ManifestError(f"{where}: field 'size' must be in 1..{MAX_PART_BYTES}, not {size}")
    digest = doc.get("digest")
    if digest is None and not digest_required:
        pass
    elif not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ManifestError(
            f"{where}: field 'digest' must be 'sha256:' and 64 lowercase hex digits, not {str(digest)[:80]!r}"
        )
    url = doc.get("url")
    if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        raise ManifestError(f"{where}: field 'url' must be an http(s) URL, not {str(url)[:200]!r}")
    return Asset(name, size, digest, url)


def order_parts(assets: list[Asset], where: str) -> tuple[Asset, ...]:
    """Parts in archive order; partNN-of-MM must be complete and consistent (or one plain tar.gz)."""
    if len(assets) == 1 and not _PART.search(assets[0].name):
        return tuple(assets)
    numbered = []
    for asset in assets:
        match = _PART.search(asset.name)
        if not match:
            raise ManifestError(f"{where}: {asset.name!r} mixes a plain tarball with split parts")
        numbered.append((int(match.group(1)), int(match.group(2)), asset))
    numbered.sort(key=lambda t: t[0])
    total = len(numbered)
    if [n for n, _, _ in numbered] != list(range(1, total + 1)) or any(m != total for _, m, _ in numbered):
        names = ", ".join(a.name for _, _, a in numbered)
        raise ManifestError(f"{where}: parts must be part01..part{total:02d}-of-{total:02d}, got {names}")
    return tuple(a for _, _, a in numbered)


class LockAssetDoc(msgspec.Struct, forbid_unknown_fields=False):
    name: Annotated[str, Meta(max_length=1024)]
    size: Annotated[int, Meta(ge=1, le=MAX_PART_BYTES)]
    digest: Annotated[str, Meta(max_length=200)] | None = None
    url: Annotated[str, Meta(max_length=4096)] | None = None


Parts = Annotated[list[LockAssetDoc], Meta(max_length=99)]


class LockFamilyDoc(msgspec.Struct, forbid_unknown_fields=False):
    tag: Annotated[str, Meta(max_length=300)]
    pinned: bool
    assets: Parts


class LockDoc(msgspec.Struct, forbid_unknown_fields=False):
    """lock.json's shape and ranges (the field rules below then check tags, digests and part names).
    Families and trusted tags are decoded one by one, so that an error names its key."""

    schema_version: int
    repo: Annotated[str, Meta(max_length=200)]
    families: Annotated[dict[str, msgspec.Raw], Meta(max_length=1000)]
    trusted: Annotated[dict[str, msgspec.Raw], Meta(max_length=100_000)] = {}


def _lock_field_error(where: str, prefix: str, exc: documents.DocumentError) -> ManifestError:
    """msgspec's `$.assets[0].size` said the way the other lock errors say a field."""
    path = prefix + exc.path if exc.path.startswith("[") else ".".join(p for p in (prefix, exc.path) if p)
    if not exc.path and not exc.problem:
        return ManifestError(f"{where}: {prefix}: {exc.why}" if prefix else str(exc))
    parent, _, name = path.rpartition(".")
    if name.endswith("]") or not name:  # an element of a list: the list is the field
        parent, name = path, ""
    problem = (exc.problem or exc.why).replace("`", "'")
    at = f"{where}: {parent}" if parent else where
    return ManifestError(f"{at}: field '{name}': {problem}" if name else f"{at}: {problem}")


def _typed_lock(data: bytes, where: str) -> None:
    try:
        top = documents.decode(data, LockDoc, where, PIN_FILE_LIMIT)
    except documents.DocumentError as exc:
        if exc.path.startswith("schema_version"):
            return  # said by its own rule, with the version this rocmdoctor reads
        raise _lock_field_error(where, "", exc) from None
    for section, schema in (("families", LockFamilyDoc), ("trusted", Parts)):
        for key, raw in getattr(top, section).items():
            try:
                documents.decode(bytes(raw), schema, where, PIN_FILE_LIMIT)
            except documents.DocumentError as exc:
                raise _lock_field_error(where, f"{section}.{key[:100]}", exc) from None


def parse_lock(text: str, where: str = "lock.json") -> Lock:
    data = text.encode("utf-8")
    _typed_lock(data, where)
    try:
        doc = documents.load_value(data, where, PIN_FILE_LIMIT)
    except documents.DocumentError as exc:
        raise ManifestError(str(exc)) from None
    if not isinstance(doc, dict):
        raise ManifestError(f"{where}: must be a JSON object")
    _check_schema(doc, where)
    lock = Lock(repo=_check_repo(doc, where), source=where)
    for family, entry in _need(doc, "families", dict, where).items():
        at = f"{where}: families.{family}"
        if not isinstance(entry, dict):
            raise ManifestError(f"{at} must be an object")
        tag = _need(entry, "tag", str, at)
        check_tag(tag, family, at)
        pinned = _need(entry, "pinned", bool, at)
        raw_assets = _need(entry, "assets", list, at)
        if pinned and not raw_assets:
            raise ManifestError(f"{at}: field 'assets' is empty but 'pinned' is true")
        assets = [parse_asset(a, f"{at}.assets[{i}]") for i, a in enumerate(raw_assets)]
        for i, asset in enumerate(assets):
            check_asset_name(asset.name, tag, f"{at}.assets[{i}]: field 'name'")
        lock.families[family] = LockEntry(family, tag, pinned, order_parts(assets, at) if assets else ())
    trusted = doc.get("trusted", {})
    if not isinstance(trusted, dict):
        raise ManifestError(f"{where}: field 'trusted' must be an object")
    for tag, raw_parts in trusted.items():
        at = f"{where}: trusted.{tag[:100]}"
        if not isinstance(raw_parts, list) or not raw_parts:
            raise ManifestError(f"{at} must be a non-empty list of parts")
        if not _TAG.fullmatch(tag) or len(tag) > 200:
            raise ManifestError(f"{at}: the tag is not a plain release tag")
        parts = [parse_asset(a, f"{at}[{i}]") for i, a in enumerate(raw_parts)]
        lock.trusted[tag] = order_parts(parts, at)
    return lock


@dataclass(frozen=True)
class PinSources:
    """Where the manifest and lock come from: explicit files, a directory with both, or the shipped pair."""

    manifest: Path | None = None
    lock: Path | None = None

    @classmethod
    def resolve(
        cls, bundles_dir: Path | None, manifest: Path | None, lock: Path | None, prefix_lock: Path | None
    ) -> PinSources:
        if bundles_dir is not None:
            manifest = manifest or bundles_dir / "manifest.toml"
            lock = lock or bundles_dir / "lock.json"
        if lock is None and prefix_lock is not None and files.lexists(prefix_lock):  # a FIFO: refused
            lock = prefix_lock
        return cls(manifest, lock)

    def _read(self, path: Path | None, shipped: str) -> tuple[str, str]:
        if path is None:
            return files.shipped_text("rocmdoctor.bundles", shipped), f"(shipped) {shipped}"
        return read_pin_file(Path(path)), str(path)

    def load(self) -> tuple[Manifest, Lock]:
        manifest = parse_manifest(*self._read(self.manifest, "manifest.toml"))
        lock = parse_lock(*self._read(self.lock, "lock.json"))
        for family, entry in lock.families.items():
            pin = manifest.families.get(family)
            if pin is None:
                continue
            where = f"{lock.source}: families.{family}"
            if entry.tag != pin.tag:
                continue  # the lock pins another release than the reviewed default: its own parts
            if pin.parts and entry.assets and tuple(a.name for a in entry.assets) != pin.parts:
                raise ManifestError(
                    f"{where}: field 'assets' names differ from the manifest's 'parts'; "
                    "run `rocmdoctor bundle lock` to refresh the lock"
                )
        return manifest, lock


def read_pin_file(path: Path) -> str:
    """A manifest or lock named by the user: bounded, never blocking (a FIFO or /dev/zero is refused)."""
    from rocmdoctor.rootfs import read_regular as read_regular_file

    try:
        return read_regular_file(path, PIN_FILE_LIMIT).decode("utf-8")
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise ManifestError(f"{path}: cannot read: not UTF-8 text") from None
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read: {exc.strerror or exc}") from None
