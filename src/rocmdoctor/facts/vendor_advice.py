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
    first_in: str  # the ROCm release (major.minor) the vendor first saw it in
    summary: str
    source: str
    remedy: str = ""  # what the source tells users to do (or that it gives nothing yet)
    fixed_in: str | None = None  # the release that fixes it; None while the source says it is open

    def affects(self, release: tuple[int, int]) -> bool:
        """Whether ROCm `release` carries it: from first_in on, until fixed_in."""
        first = _release(self.first_in)
        fixed = _release(self.fixed_in) if self.fixed_in else None
        return first is not None and release >= first and (fixed is None or release < fixed)


def _release(text: str) -> tuple[int, int] | None:
    major, _, rest = text.partition(".")
    minor = rest.partition(".")[0]
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


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


def release_numbers() -> tuple[tuple[int, int], ...]:
    """rocm_releases() as (major, minor), in the data's order (the order they shipped)."""
    return tuple(r for r in (_release(text) for text in rocm_releases()) if r is not None)


def known_issues(gfx: str | None) -> list[KnownIssue]:
    return [issue for issue in advice().known_issues if gfx in issue.gfx]
