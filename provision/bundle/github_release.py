"""Client for the GitHub releases API (or any server speaking it: GitHub Enterprise, a mirror, the tests').

Two calls: `GET /repos/<owner>/<repo>/releases/tags/<tag>` (one release) and
`GET /repos/<owner>/<repo>/releases?per_page=100&page=N` (the list, newest first). A release carries
`tag_name`, `draft`, `prerelease` and `assets[]` with `name`, `size`, `digest` ("sha256:<hex>", null on
assets older than 2025-06) and `browser_download_url`.

Every call has connect and read timeouts, a total deadline (a server that trickles one byte a second
still ends) and a body cap: an answer larger than a release list can be is refused, not buffered.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import quote

import msgspec
from msgspec import Meta

from rocmdoctor import documents
from rocmdoctor.facts.manifest import ManifestError, check_asset_name
from rocmdoctor.provision import bounded_http
from rocmdoctor.provision.bundle.manifest import MAX_PART_BYTES, Asset, order_parts, parse_asset
from rocmdoctor.sensitive import KeyFileError, check_token

DEFAULT_API_URL = "https://api.github.com"
API_ENV = "ROCMDOCTOR_GITHUB_API"
# A page of 100 releases with long notes is a few MB on GitHub; 16 MiB is far beyond any real answer.
BODY_LIMIT = 16 << 20
MAX_ASSETS = 10_000
MAX_PAGES = 10  # 1000 releases: the newest of every family is on the first page in practice
QUALIFICATION_REPORT = "qualification-report-{tag}.json"  # attached to releases that passed


class ReleaseError(RuntimeError):
    """The release could not be read; the message says what to do."""


class TokenError(ReleaseError):
    """GITHUB_TOKEN/GH_TOKEN is malformed (bad input: exit 2); the message never holds it."""


@dataclass(frozen=True)
class ApiOptions:
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    deadline_s: float = 60.0  # for the whole call (every page of a list), not per read


@dataclass(frozen=True)
class Release:
    repo: str
    tag: str
    parts: tuple[Asset, ...]  # in archive order; digest may be None
    prerelease: bool = False
    has_qualification_report: bool = False

    @property
    def undigested(self) -> list[str]:
        return [a.name for a in self.parts if a.digest is None]


@dataclass
class ReleaseList:
    releases: list[Release] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "tag: why" for releases that cannot be used


def api_url(explicit: str | None) -> str:
    return (explicit or os.environ.get(API_ENV) or DEFAULT_API_URL).rstrip("/")


def download_url(repo: str, tag: str, name: str) -> str:
    """github.com's download address; tag and name percent-encoded ('+' in nightly tags)."""
    return f"https://github.com/{repo}/releases/download/{quote(tag, safe='')}/{quote(name, safe='')}"


def is_bundle_asset(name: str, tag: str) -> bool:
    base = f"{tag}-x64."
    return name.startswith(base) and name.endswith(".tar.gz")


def _headers() -> dict[str, str]:
    headers = {
        "Accept": "application/vnd.github+json",
        "X-GitHub-Api-Version": "2022-11-28",
        "Accept-Encoding": "identity",  # the cap counts the bytes we parse
    }
    for name in ("GITHUB_TOKEN", "GH_TOKEN"):
        token = os.environ.get(name)
        if token:
            try:
                check_token(token.strip(), name)
            except KeyFileError as exc:
                raise TokenError(f"{exc}; fix {name} or unset it") from None
            headers["Authorization"] = f"Bearer {token.strip()}"
            break
    return headers


def _unreachable(base_url: str, why: str) -> ReleaseError:
    return ReleaseError(
        f"cannot reach the release API at {base_url}: {why}; check the network, or point "
        f"--api-url/{API_ENV} at a reachable mirror, or install from --mirror"
    )


class AssetDoc(msgspec.Struct, forbid_unknown_fields=False):
    """One asset of a release, as the API answers it (GitHub's REST schema "release-asset")."""

    name: Annotated[str, Meta(max_length=1024)] | None = None
    size: Annotated[int, Meta(ge=0, le=MAX_PART_BYTES)] | None = None
    digest: Annotated[str, Meta(max_length=200)] | None = None
    browser_download_url: Annotated[str, Meta(max_length=4096)] | None = None


class ReleaseDoc(msgspec.Struct, forbid_unknown_fields=False):
    """A release (GitHub's REST schema "release"): only the fields rocmdoctor reads."""

    tag_name: Annotated[str, Meta(max_length=300)] | None = None
    draft: bool = False
    prerelease: bool = False
    assets: Annotated[list[AssetDoc], Meta(max_length=MAX_ASSETS)] = []


ReleaseListDoc = Annotated[list[ReleaseDoc], Meta(max_length=100)]


def _get_json(
    url: str, base_url: str, options: ApiOptions, deadline: bounded_http.Deadline, schema: Any
) -> Any:
    """GET `url` and decode its JSON as `schema` (None on 404), ending by `deadline` whatever the server
    does."""
    try:
        answer = bounded_http.get(
            url,
            deadline=deadline,
            limit=BODY_LIMIT,
            headers=_headers(),
            connect_s=options.connect_timeout_s,
            read_s=options.read_timeout_s,
        )
    except bounded_http.HttpTimeout:
        raise ReleaseError(
            f"the release API at {base_url} did not finish answering {url} within the "
            f"{options.deadline_s:g}s deadline (a stalled or trickling server); retry later, raise "
            "--api-deadline, or install from --mirror"
        ) from None
    except bounded_http.HttpNoAnswer:
        raise _unreachable(
            base_url,
            f"no answer within {options.connect_timeout_s:g}s (connect) / {options.read_timeout_s:g}s (read)",
        ) from None
    except bounded_http.HttpError as exc:
        raise _unreachable(base_url, str(exc)) from None
    status = answer.status
    if status == 404:
        return None
    if status in (403, 429):
        raise ReleaseError(
            f"the release API refused the request ({status}, rate limit?); set GITHUB_TOKEN or retry later"
        )
    if status != 200:
        raise ReleaseError(f"the release API answered {status} for {url}; retry later")
    if len(answer.body) > BODY_LIMIT:
        raise ReleaseError(
            f"{url} sent more than {BODY_LIMIT >> 20} MiB; that is no release answer. Is --api-url a GitHub API?"
        )
    try:
        return documents.decode(answer.body, schema, url, BODY_LIMIT)
    except documents.DocumentError as exc:
        raise ReleaseError(f"{exc}; is --api-url a GitHub API?") from None


def _parse_release(doc: ReleaseDoc, repo: str, tag: str, where: str) -> Release:
    found = []
    names = set()
    for index, raw in enumerate(doc.assets):
        name = raw.name
        if name is not None:
            names.add(name)
        if name is None or not is_bundle_asset(name, tag):
            continue
        try:
            asset = parse_asset(
                {"name": name, "size": raw.size, "digest": raw.digest}, f"{where}: assets[{index}]", False
            )
            check_asset_name(asset.name, tag, f"{where}: assets[{index}]")  # names become file names
        except ManifestError as exc:
            raise ReleaseError(str(exc)) from None
        url = raw.browser_download_url
        url = url if url is not None and url.startswith(("http://", "https://")) else None
        found.append(Asset(asset.name, asset.size, asset.digest, url))
    if not found:
        raise ReleaseError(f"release {tag} in {repo} has no {tag}-x64 tarball assets")
    try:
        parts = order_parts(found, where)
    except ManifestError as exc:
        raise ReleaseError(str(exc)) from None
    return Release(
        repo,
        tag,
        parts,
        prerelease=doc.prerelease,
        has_qualification_report=QUALIFICATION_REPORT.format(tag=tag) in names,
    )


def fetch_release(repo: str, tag: str, base_url: str, options: ApiOptions | None = None) -> Release:
    options = options or ApiOptions()
    url = f"{base_url}/repos/{repo}/releases/tags/{quote(tag, safe='')}"
    doc = _get_json(url, base_url, options, bounded_http.Deadline(options.deadline_s), ReleaseDoc)
    if doc is None:
        raise ReleaseError(f"release {tag} not found in {repo} ({url}); check --tag and --repo")
    return _parse_release(doc, repo, tag, url)


def list_releases(repo: str, base_url: str, options: ApiOptions | None = None) -> ReleaseList:
    """Every published (non-draft) release with bundle assets; one deadline for all pages."""
    options = options or ApiOptions()
    deadline = bounded_http.Deadline(options.deadline_s)
    found = ReleaseList()
    for page in range(1, MAX_PAGES + 1):
        url = f"{base_url}/repos/{repo}/releases?per_page=100&page={page}"
        doc = _get_json(url, base_url, options, deadline, ReleaseListDoc)
        if doc is None:
            raise ReleaseError(f"no releases of {repo} at {url}; check --repo and --api-url")
        for raw in doc:
            tag = raw.tag_name
            if tag is None or raw.draft:
                continue
            try:
                found.releases.append(_parse_release(raw, repo, tag, f"{url}: {tag}"))
            except ReleaseError as exc:
                found.skipped.append(f"{tag}: {exc}")
        if len(doc) < 100:
            break
    return found
