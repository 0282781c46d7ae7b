"""Where the GPU probe ships and the environment it runs in (checks/ may not touch files or os)."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources

from rocmdoctor.vllm.environment import bundle_env


def probe_path() -> str:
    """The probe file inside the installed package (a plain file: installs are never zipped)."""
    return str(resources.files("rocmdoctor") / "probes" / "gpu_probe.py")


def probe_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The bundle's environment (bundle_env), as `serve` and the unit give it."""
    return bundle_env(env)
