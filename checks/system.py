"""Operating system: the distribution and whether rocmdoctor has guidance for it."""

from __future__ import annotations

from ..model import Result, Severity, passed, warned
from ..registry import Context
from . import check
from .facts import DISTRO_READS, distro_info

# Distros the vllm-rocm bundle and the kernel guidance are written for.
KNOWN_DISTROS = {"ubuntu", "debian", "fedora", "arch", "opensuse-tumbleweed", "opensuse-leap", "opensuse"}


@check(
    "os.distro",
    "Distribution is a known target",
    severity=Severity.ADVISORY,
    reads=DISTRO_READS,
)
def os_distro(ctx: Context) -> Result:
    info = distro_info(ctx)
    name = f"{info['name'] or info['id'] or 'unknown'} {info['version']}".strip()
    if not info["id"]:
        return warned(
            "cannot tell the distribution: /etc/os-release is missing or empty",
            "Restore /etc/os-release (package base-files or equivalent); kernel guidance needs it.",
            **info,
        )
    if info["id"] in KNOWN_DISTROS or any(like in KNOWN_DISTROS for like in info["like"].split()):
        return passed(f"{name}", **info)
    return warned(
        f"{name} is not a distribution rocmdoctor has guidance for",
        "Expect to adapt `rocmdoctor fix-kernel` advice; Ubuntu, Debian, Fedora, Arch and openSUSE are covered.",
        **info,
    )
