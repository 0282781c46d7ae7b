"""The environment the bundle's interpreter runs in, the same for the deep probe, `serve` and the unit.

The bundle must see its own torch and vLLM, not whatever the caller's shell had around: variables that
make Python load other packages are dropped, user site-packages are off, and vLLM's usage reporting
is off. `serve` and the probe start from the caller's environment (bundle_env(os.environ)); the unit
starts from systemd's empty one and writes BUNDLE_SETTINGS into Environment=.
"""

from __future__ import annotations

from collections.abc import Mapping

# Inherited variables that make the bundle's Python load someone else's packages or code.
DROPPED_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV")
BUNDLE_SETTINGS = {
    "PYTHONNOUSERSITE": "1",
    "PYTHONUNBUFFERED": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def bundle_env(base: Mapping[str, str], **overrides: str) -> dict[str, str]:
    """`base` without DROPPED_VARIABLES, with BUNDLE_SETTINGS and then `overrides` set."""
    env = {name: value for name, value in base.items() if name not in DROPPED_VARIABLES}
    env.update(BUNDLE_SETTINGS)
    env.update(overrides)
    return env
