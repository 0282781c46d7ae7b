"""Client for the GitHub releases API (or any server speaking it: GitHub Enterprise, a mirror, the tests').

Only `GET /repos/<owner>/<repo>/releases/tags/<tag>` is used; its `assets[]` carry `name`, `size`,
`digest` ("sha256:<hex>", null on assets older than 2025-06) and `browser_download_url`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import requests

from .manifest import Asset, ManifestError, check_asset_name, order_parts, parse_asset

DEFAULT_API_URL = "https://api.github.com"
API_ENV = "ROCMDOCTOR_GITHUB_API"


class ReleaseError(RuntimeError):
    """The release could not be read; the message says what to do."""


@dataclass(frozen=True)
class Release:
    repo: str
    tag: str
    parts: tuple[Asset, ...]  # in archive order; digest may be None


def api_url(explicit: str | None) -> str:
    return (explicit or os.environ.get(API_ENV) or DEFAULT_API_URL).rstrip("/")


def is_bundle_asset(name: str, tag: str) -> bool:
    base = f"{tag}-x64."
    return name.startswith(base) and name.endswith(".tar.gz")


def fetch_release(repo: str, tag: str, base_url: str, timeout: tuple[float, float] = (10.0, 30.0)) -> Release:
    url = f"{base_url}/repos/{repo}/releases/tags/{tag}"
    headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}
    token = os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        response = requests.get(url, headers=headers, timeout=timeout)
    except requests.RequestException as exc:
        raise ReleaseError(
            f"cannot reach the release API at {base_url}: {exc}; check the network, or point "
            f"--api-url/{API_ENV} at a reachable mirror, or install from --mirror"
        ) from None
    if response.status_code == 404:
        raise ReleaseError(f"release {tag} not found in {repo} ({url}); check --tag and --repo")
    if response.status_code in (403, 429):
        raise ReleaseError(
            f"the release API refused the request ({response.status_code}, rate limit?); "
            "set GITHUB_TOKEN or retry later"
        )
    if response.status_code != 200:
        raise ReleaseError(f"the release API answered {response.status_code} for {url}; retry later")
    try:
        doc = response.json()
        raw_assets = doc["assets"]
        if not isinstance(raw_assets, list):
            raise TypeError("assets is not a list")
    except (ValueError, KeyError, TypeError) as exc:
        raise ReleaseError(
            f"{url} did not return a release object ({exc}); is --api-url a GitHub API?"
        ) from None
    found = []
    for index, raw in enumerate(raw_assets):
        if not isinstance(raw, dict) or not is_bundle_asset(str(raw.get("name", "")), tag):
            continue
        try:
            asset = parse_asset(
                {k: raw.get(k) for k in ("name", "size", "digest")},
                f"{url}: assets[{index}]",
                digest_required=False,
            )
            check_asset_name(asset.name, tag, f"{url}: assets[{index}]")  # names become file names
        except ManifestError as exc:
            raise ReleaseError(str(exc)) from None
        download = raw.get("browser_download_url")
        found.append(
            Asset(asset.name, asset.size, asset.digest, download if isinstance(download, str) else None)
        )
    if not found:
        raise ReleaseError(f"release {tag} in {repo} has no {tag}-x64 tarball assets")
    try:
        parts = order_parts(found, url)
    except ManifestError as exc:
        raise ReleaseError(str(exc)) from None
    return Release(repo, tag, parts)
