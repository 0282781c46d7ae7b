"""The bundles' vLLM versions asked directly: each version's own CLI modules and parser (tests/harness/
vllm_versions.py), not a model of them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.vllm_versions import VERSIONS, python_and_env

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "provision" / "server" / "vllm_serve.py"

pytestmark = pytest.mark.system

# What the cluster worker's unit passes after the launcher (provision/server/cluster_unit.py).
WORKER_ARGS = [
    "--model",
    "/srv/models/tiny",
    "--headless",
    "--data-parallel-size",
    "2",
    "--data-parallel-size-local",
    "1",
    "--data-parallel-start-rank",
    "1",
    "--data-parallel-address",
    "10.0.0.1",
    "--data-parallel-rpc-port",
    "13345",
]

PROBE = """
import importlib.util, json, sys, vllm
spec = importlib.util.spec_from_file_location("vllm_serve", sys.argv[1])
launcher = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launcher)
command, args = launcher.serve_command(sys.argv[2:])
print(json.dumps({
    "version": vllm.__version__,
    "env_setup": launcher.env_setup_module(),
    "command": type(command).__module__,
    "model": args.model_tag or args.model,  # `vllm serve` moves --model to model_tag; cmd() reads it
    "headless": args.headless,
    "start_rank": args.data_parallel_start_rank,
    "validate": callable(command.validate) and callable(command.cmd),
}))
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("version", VERSIONS)
def test_the_cluster_launcher_builds_vllm_serve_on_every_bundled_version(version):
    """libexec/vllm-serve imported vllm.entrypoints.launchers.cli_args, which only 0.32 has: multi-node
    bring-up failed on every bundle that exists. Its import path and parsing, run on each version."""
    python, env = python_and_env(version)
    done = subprocess.run(
        [str(python), "-c", PROBE, str(LAUNCHER), *WORKER_ARGS],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["version"] == version
    assert got["command"] == "vllm.entrypoints.cli.serve"
    assert got["env_setup"] in ("vllm.entrypoints.utils", "vllm.entrypoints.serve.utils.api_utils")
    assert (got["model"], got["headless"], got["start_rank"]) == ("/srv/models/tiny", True, 1)
    assert got["validate"]
