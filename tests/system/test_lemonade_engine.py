"""`rocmdoctor lemonade verify` through the Lemonade stand-in, which forwards inference to the real vLLM CPU
engine as lemond forwards to its vLLM child; vLLM's own /metrics and /version are read at backend_url."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.lemonade_server import Registered, State, lemonade_server, make_report_host, qwen3_8b_cache
from harness.smoke_cli import rocmdoctor_json
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
    assert {s["status"] for s in report["steps"] if s["id"] != "context"} == {"pass"}, report
    # the context probe ran through Lemonade's endpoint, and says why it cannot judge there
    assert steps["context"]["status"] == "skip" and "cannot judge" in steps["context"]["summary"], report
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


def test_max_num_seqs_comes_from_a_knee_measured_on_the_real_engine(
    vllm_engine, vllm_engine_key_file, tmp_path
):
    # The docs' way: bench the loaded vLLM child at its backend_url, then apply with the report.
    code, report = rocmdoctor_json(
        "bench",
        "--url",
        vllm_engine.base_url,
        "--api-key-file",
        str(vllm_engine_key_file),
        "--concurrency",
        "2,8",
        "--requests",
        "16",
        "--prompt-tokens",
        "16",
        "--max-tokens",
        "32",
    )
    assert code == 0, report
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(report))
    knee = report["knee"]["recommended_max_num_seqs"]
    host, cache = make_report_host(tmp_path / "host"), qwen3_8b_cache(tmp_path / "hub")
    state_dir = tmp_path / "lemonade-state"
    state_dir.mkdir()
    state = State(state_dir, {"user.Qwen3-8B-vLLM": Registered("Qwen/Qwen3-8B")})
    with lemonade_server(state) as server:
        result = CliRunner().invoke(
            cli,
            [
                "--root",
                str(host),
                "lemonade",
                "apply",
                "--json",
                "--no-verify",
                "--url",
                server.url,
                "--bench-report",
                str(bench),
            ],
            env={"HF_HUB_CACHE": str(cache), "LEMONADE_ADMIN_API_KEY": "", "LEMONADE_API_KEY": ""},
        )
    assert result.exit_code == 0, result.output
    args = state.saved()["user.Qwen3-8B-vLLM"]["vllm_args"].split()
    seqs = int(args[args.index("--max-num-seqs") + 1])
    reasons = json.loads(result.output)["models"][0]["reasons"]
    if knee is not None:  # a knee was measured: it is the setting
        assert seqs == knee and "measured knee" in reasons["--max-num-seqs"]
    else:  # throughput still rose at 8: the plan's figure, and the bench's advice as a note
        assert seqs == 10 and any("no knee" in n for n in json.loads(result.output)["models"][0]["notes"])


def test_apply_saves_then_loads_and_smokes_through_lemonade_on_the_real_engine(vllm_engine, tmp_path):
    """apply ends as verify does: the load through Lemonade and the smoke through its OpenAI endpoint,
    answered by the real engine behind the stand-in; the saved options are what the load used."""
    host, cache = make_report_host(tmp_path / "host"), qwen3_8b_cache(tmp_path / "hub")
    state_dir = tmp_path / "lemonade-state"
    state_dir.mkdir()
    state = State(
        state_dir,
        {MODEL: Registered("Qwen/Qwen3-8B")},
        engine_url=vllm_engine.base_url,
        engine_key=vllm_engine.api_key,
        engine_model=vllm_engine.model,
        engine_pid=vllm_engine.pid,
    )
    with lemonade_server(state) as server:
        result = CliRunner().invoke(
            cli,
            ["--root", str(host), "lemonade", "apply", "--json", "--url", server.url],
            env={"HF_HUB_CACHE": str(cache), "LEMONADE_ADMIN_API_KEY": "", "LEMONADE_API_KEY": ""},
        )
    doc = json.loads(result.output)
    assert result.exit_code == 0, doc
    [verified] = doc["verify"]
    # the context step judges only where Lemonade gives token ids and max_model_len (a skip saying why)
    statuses = {s["id"]: s["status"] for s in verified["steps"]}
    assert verified["model"] == MODEL and statuses.pop("context") in ("pass", "skip"), verified
    assert set(statuses.values()) == {"pass"}, verified
    launch = state.loaded[MODEL]["launch_command"]
    saved = state.saved()[MODEL]["vllm_args"].split()
    flag = "--gpu-memory-utilization"
    assert launch[launch.index(flag) + 1] == saved[saved.index(flag) + 1]
