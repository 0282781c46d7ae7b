"""Where the GPU probe ships and the environment it runs in (checks/ may not touch files or os)."""

from __future__ import annotations

from importlib import resources
from typing import Mapping

# What `serve` gives the bundle's interpreter: nothing from ~/.local, nothing from PYTHONPATH, so
# the probe sees the bundle's own torch and vLLM and not whatever the caller's shell had around.
DROPPED_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE")


def probe_path() -> str:
    """The probe file inside the installed package (a plain file: installs are never zipped)."""
    return str(resources.files("rocmdoctor") / "probes" / "gpu_probe.py")


def probe_environment(env: Mapping[str, str]) -> dict[str, str]:
    clean = {name: value for name, value in env.items() if name not in DROPPED_VARIABLES}
    clean["PYTHONNOUSERSITE"] = "1"
    return clean
