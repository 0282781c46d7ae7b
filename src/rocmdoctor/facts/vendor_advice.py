"""Vendor advice as data (checks/data/vendor_advice.json, each entry with its source): the environment AMD
tells bare-metal vLLM users on Instinct GPUs to set, the ROCm releases that exist, known issues by gfx.
Provisioning (the server's environment) and checks read the same file through this module."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

import msgspec

from rocmdoctor.documents import decode

LIMIT = 1 << 20


class _Environment(msgspec.Struct, frozen=True):
    gfx: list[str]
    environment: dict[str, str]
    why: str
    source: str


class _Release(msgspec.Struct, frozen=True):
    release: str
    source: str


class KnownIssue(msgspec.Struct, frozen=True):
    gfx: list[str]
    first_in: str
    summary: str
    source: str


class _Advice(msgspec.Struct, frozen=True):
    instinct_bare_metal: _Environment
    rocm_releases: list[_Release]
    known_issues: list[KnownIssue]


@cache
def advice() -> _Advice:
    data = (resources.files("rocmdoctor.checks") / "data" / "vendor_advice.json").read_bytes()
    return decode(data, _Advice, "checks/data/vendor_advice.json", LIMIT)


@dataclass(frozen=True)
class ServerEnvironment:
    environment: dict[str, str]
    reason: str


def server_environment(gfx: str | None) -> ServerEnvironment | None:
    """What the vendor tells a bare-metal vLLM on this GPU to have in its environment (None: nothing)."""
    entry = advice().instinct_bare_metal
    if gfx not in entry.gfx:
        return None
    return ServerEnvironment(dict(entry.environment), f"{entry.why} ({entry.source})")


def rocm_releases() -> list[str]:
    return [r.release for r in advice().rocm_releases]


def known_issues(gfx: str | None) -> list[KnownIssue]:
    return [issue for issue in advice().known_issues if gfx in issue.gfx]
