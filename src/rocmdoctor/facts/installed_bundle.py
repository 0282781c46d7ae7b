"""The one reader of the bundle installed under a prefix: `InstalledBundle` (tag, family, digest, the
bundle's own vLLM version, its qualification), read through the `Host` so a replayed tree answers for
the machine it was captured on.

Everything that reports the installed bundle reads it here: the health textfile's
`rocmdoctor_bundle_info`, `cluster facts` (whose digests the pre-flight compares) and the JIT cache
check. "Digest" has one meaning: `bundle_digest`, sha256 over every part's name and published digest in
name order (what qualification records and what keys the JIT caches), never one part's digest.

Sources, each written by rocmdoctor's own install under `<prefix>/current` (a link to bundles/<tag>):
- `.rocmdoctor-bundle.json` (install): family, tag and the parts (`assets`: name, digest);
- `.rocmdoctor-qualification.json` (provision/bundle/qualify.py): qualified, host_gfx, the bundle_digest
  it was computed for (a record of other parts says nothing about these);
- `lib/python3.*/site-packages/vllm-*.dist-info/METADATA`: the bundle's own vLLM says its version
  (core metadata's `Version:` field); no tag is parsed for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rocmdoctor.host import Host

METADATA = ".rocmdoctor-bundle.json"
QUALIFICATION = ".rocmdoctor-qualification.json"
VLLM_METADATA = "lib/python3.*/site-packages/vllm-*.dist-info/METADATA"
METADATA_LIMIT = 1 << 20
RECORD_LIMIT = 4 << 20
DIST_METADATA_LIMIT = 1 << 20


def bundle_digest(assets: Iterable[tuple[str, str | None]]) -> str:
    """One digest for a bundle: sha256 over its parts' names and published digests, in name order."""
    import hashlib  # lazily: `check` imports this module for its constants

    digest = hashlib.sha256()
    for name, part in sorted(assets, key=lambda a: a[0]):
        digest.update(f"{name}\0{part or ''}\n".encode())
    return "sha256:" + digest.hexdigest()


def meta_assets(meta: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(name, digest) of each part a bundle's metadata lists."""
    assets = meta.get("assets")
    rows = assets if isinstance(assets, list) else []
    return [
        (str(a.get("name")), a.get("digest") if isinstance(a.get("digest"), str) else None)
        for a in rows
        if isinstance(a, dict) and isinstance(a.get("name"), str)
    ]


@dataclass(frozen=True)
class InstalledBundle:
    prefix: str
    tag: str | None
    family: str | None
    digest: str | None  # bundle_digest over every part
    vllm_version: str | None  # the bundle's own vLLM (its dist-info), None when it does not say
    qualified: bool | None  # the qualification record's verdict for these parts; None: no record
    host_gfx: str | None  # the GPU the record was made for
    record: str  # where the qualification record is (named in reports)
    problem: str | None = None  # why the identity is incomplete

    @property
    def present(self) -> bool:
        return self.tag is not None or self.digest is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "record": self.record,
            "tag": self.tag,
            "family": self.family,
            "digest": self.digest,
            "vllm_version": self.vllm_version,
            "qualified": self.qualified,
            "host_gfx": self.host_gfx,
            "problem": self.problem,
        }


def _document(host: Host, path: str, limit: int) -> tuple[dict[str, Any] | None, str | None]:
    """(the JSON object at path, why not): missing, unreadable and malformed all say why."""
    from rocmdoctor.documents import DocumentError, load_object  # msgspec, only when there is a bundle

    read = host.read_text(path, limit)
    if not read.ok:
        return None, read.describe()
    try:
        return load_object(str(read.value).encode(), path, limit), None
    except DocumentError as exc:
        return None, exc.why


def _text(doc: dict[str, Any] | None, key: str) -> str | None:
    value = (doc or {}).get(key)
    return value if isinstance(value, str) and value else None


def vllm_version(host: Host, tree: str) -> str | None:
    """The `Version:` of the bundle's own vLLM distribution (one dist-info; several: it cannot say)."""
    found = host.glob(f"{tree}/{VLLM_METADATA}")
    if len(found) != 1:
        return None
    read = host.read_text(found[0], DIST_METADATA_LIMIT)
    if not read.ok:
        return None
    for line in str(read.value).splitlines():
        if not line.strip():
            break  # the headers end at the first blank line; the description follows
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == "version" and value.strip():
            return value.strip()
    return None


def read_installed(host: Host, prefix: str) -> InstalledBundle:
    """The bundle `<prefix>/current` names (`present` is False when there is none)."""
    prefix = prefix.rstrip("/") or "/"
    tree = f"{prefix.rstrip('/')}/current"
    record_path = f"{tree}/{QUALIFICATION}"
    link = host.readlink(tree)
    meta, meta_problem = _document(host, f"{tree}/{METADATA}", METADATA_LIMIT)
    record, record_problem = _document(host, record_path, RECORD_LIMIT)
    assets = meta_assets(meta) if meta is not None else []
    digest = bundle_digest(assets) if assets else _text(record, "bundle_digest")
    recorded_for = _text(record, "bundle_digest")
    problem = None
    qualified = (record or {}).get("qualified")
    if record is not None and recorded_for != digest:
        problem = f"{record_path} was recorded for other parts ({recorded_for}); qualify this bundle again"
        qualified = None
    elif record is None:
        problem = record_problem
    if digest is None:
        problem = problem or meta_problem
    tag = (
        _text(meta, "tag")
        or _text(record, "tag")
        or (str(link.value).rsplit("/", 1)[-1] if link.ok else None)
    )
    return InstalledBundle(
        prefix=prefix,
        tag=tag,
        family=_text(meta, "family"),
        digest=digest,
        vllm_version=vllm_version(host, tree),
        qualified=qualified if isinstance(qualified, bool) else None,
        host_gfx=_text(record, "host_gfx"),
        record=record_path,
        problem=problem,
    )
