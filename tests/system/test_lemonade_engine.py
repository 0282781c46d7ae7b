"""`rocmdoctor lemonade verify` through the Lemonade stand-in, which forwards inference to the real vLLM CPU
engine as lemond forwards to its vLLM child; vLLM's own /metrics and /version are read at backend_url."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.lemonade_server import Registered, State, lemonade_server
from rocmdoctor.cli import cli

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

ADMIN_KEY = "lemonade-admin-Zq7xV2kP9sW4"
MODEL = "user.tiny-vLLM"


def test_verify_loads_and_smokes_through_lemonade_on_the_real_engine(vllm_engine, tmp_path: Path):
    state_dir = tmp_path / "lemonade-state"
    state_dir.mkdir()
    state = State(
        state_dir,
        {MODEL: Registered("loopback-org/tiny")},
        api_key="lemonade-regular-key-1",
        admin_key=ADMIN_KEY,
        engine_url=vllm_engine.base_url,
        engine_key=vllm_engine.api_key,
        engine_model=vllm_engine.model,
        engine_pid=vllm_engine.pid,
    )
    state.write_saved(
        {MODEL: {"vllm_args": "--gpu-memory-utilization 0.78 --max-num-seqs 8", "ctx_size": 512}}
    )
    with lemonade_server(state) as server:
        result = CliRunner().invoke(
            cli,
            ["--root", str(tmp_path), "lemonade", "verify", "--json", "--url", server.url],
            env={"LEMONADE_ADMIN_API_KEY": ADMIN_KEY, "LEMONADE_API_KEY": ""},
        )
    report = json.loads(result.output)
    steps = {s["id"]: s for s in report["steps"]}
    assert result.exit_code == 0, report
    assert {s["status"] for s in report["steps"]} == {"pass"}, report
    assert report["model"] == MODEL  # asked for by its Lemonade name, answered by the engine
    # the counters of vLLM itself, read at backend_url: exactly what went through Lemonade
    assert steps["metrics"]["details"]["growth"] == {
        "vllm:request_success_total": 4,
        "vllm:generation_tokens_total": 64,
    }
    assert steps["version"]["details"]["version"].startswith("0.")
    assert report["lemonade"]["backend_url"] == vllm_engine.base_url + "/v1"
    launch = report["lemonade"]["launch_command"]
    assert (
        launch[launch.index("--gpu-memory-utilization") + 1] == "0.78"
        and "--kv-cache-memory-bytes" not in launch
    )
    findings = {f["id"]: f for f in report["lemonade"]["findings"]}
    assert findings["lemonade.launch"]["status"] == "pass"  # the engine got the saved options
    # the real vLLM exports vllm:kv_cache_usage_perc, not the gauge Lemonade's telemetry reads
    assert findings["lemonade.telemetry"]["status"] == "warn"
    assert "vllm:gpu_cache_usage_factor" in findings["lemonade.telemetry"]["summary"]
    # The load went through Lemonade; the inference requests carried the key to Lemonade only.
    paths = [r["path"] for r in state.requests]
    assert "/api/v1/load" in paths and "/api/v1/chat/completions" in paths
    assert all(r["auth"] == f"Bearer {ADMIN_KEY}" for r in state.requests)
    assert ADMIN_KEY not in result.output
