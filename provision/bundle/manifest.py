"""The pins of the bundles: `lock.json` (the exact part names, sizes and sha256 digests), validated with
errors naming the field, and where the manifest and lock come from (`PinSources`). The manifest itself is
read by `rocmdoctor.facts.manifest`.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from rocmdoctor import documents
from rocmdoctor import host_files as files
from rocmdoctor.facts.manifest import (
    PART_NAME,
    TAG_NAME,
    Manifest,
    ManifestError,
    check_asset_name,
    check_repo,
    check_schema,
    check_tag,
    need,
    parse_manifest,
)
from rocmdoctor.model import envelope

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
MAX_PART_BYTES = 1 << 44  # 16 TiB: a size that drives a download and a disk-space check
PIN_FILE_LIMIT = 4 << 20  # a lock or manifest is a few kB; anything this large is not one


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
class LockEntry:
    family: str
    tag: str
    pinned: bool
    assets: tuple[Asset, ...] = ()


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
        doc: dict[str, Any] = envelope(
            repo=self.repo,
            families={
                f: {"tag": e.tag, "pinned": e.pinned, "assets": [_asset_json(a) for a in e.assets]}
                for f, e in sorted(self.families.items())
            },
        )
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


def parse_asset(doc: Any, where: str, digest_required: bool = True) -> Asset:
    if not isinstance(doc, dict):
        raise ManifestError(f"{where} must be an object")
    name = need(doc, "name", str, where)
    size = need(doc, "size", int, where)
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
    if len(assets) == 1 and not PART_NAME.search(assets[0].name):
        return tuple(assets)
    numbered = []
    for asset in assets:
        match = PART_NAME.search(asset.name)
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
    check_schema(doc, where)
    lock = Lock(repo=check_repo(doc, where), source=where)
    for family, entry in need(doc, "families", dict, where).items():
        at = f"{where}: families.{family}"
        if not isinstance(entry, dict):
            raise ManifestError(f"{at} must be an object")
        tag = need(entry, "tag", str, at)
        check_tag(tag, family, at)
        pinned = need(entry, "pinned", bool, at)
        raw_assets = need(entry, "assets", list, at)
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
        if not TAG_NAME.fullmatch(tag) or len(tag) > 200:
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
