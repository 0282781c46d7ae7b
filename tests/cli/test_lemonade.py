"""`rocmdoctor lemonade` against the Lemonade stand-in (tests/harness/lemonade_server.py) over loopback, on a
host like the report's: Strix Halo, a 96 GiB VRAM carve-out, 76.45 GiB of it free at startup."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from harness.hosts import fixture_root
from harness.lemonade_server import (
    PROTECTED,
    Registered,
    State,
    lemonade_server,
    make_report_host,
    qwen3_8b_cache,
)
from rocmdoctor.cli import cli
from rocmdoctor.provision.verify.bench import find_knee
from rocmdoctor.report import load_schema

ADMIN_KEY = "lemonade-admin-Zq7xV2kP9sW4"
MODEL = "user.Qwen3-8B-vLLM"
CHECKPOINT = "Qwen/Qwen3-8B"


@pytest.fixture
def report_host(tmp_path: Path) -> Path:
    return make_report_host(tmp_path / "host")


@pytest.fixture
def hf_cache(tmp_path: Path) -> Path:
    return qwen3_8b_cache(tmp_path / "hub")


@pytest.fixture
def bench_report(tmp_path: Path) -> Path:
    """A bench report whose knee is found by bench's own code, from levels shaped like the report's
    (throughput flat past 8 concurrent sequences, falling at 32)."""
    levels = [
        {"concurrency": c, "failures": 0, "output_tokens_per_s": t}
        for c, t in ((1, 40.0), (2, 76.0), (4, 140.0), (8, 230.0), (16, 236.0), (32, 150.0))
    ]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"schema_version": 1, "knee": find_knee(levels)}))
    return path


def standin(tmp_path: Path, **kw) -> State:
    state_dir = tmp_path / "lemonade-state"
    state_dir.mkdir(exist_ok=True)
    defaults = {
        "models": {MODEL: Registered(CHECKPOINT), "Qwen3-0.6B-GGUF": Registered("unsloth/x", "llamacpp")}
    }
    return State(state_dir, **(defaults | kw))


def run(root: Path, url: str, *args: str, hf: Path | None = None, key: str | None = ADMIN_KEY):
    env = {"LEMONADE_ADMIN_API_KEY": key or "", "LEMONADE_API_KEY": "", "ROCMDOCTOR_LEMONADE_URL": ""}
    if hf is not None:
        env["HF_HUB_CACHE"] = str(hf)
    return CliRunner().invoke(cli, ["--root", str(root), "lemonade", *args, "--url", url], env=env)


def all_output(*results) -> str:
    return "".join(r.output + (r.stderr if r.stderr_bytes is not None else "") for r in results)


def test_apply_sets_the_reports_options_or_better_in_one_command(
    tmp_path, report_host, hf_cache, bench_report
):
    state = standin(tmp_path, api_key="regular-key-abcdef", admin_key=ADMIN_KEY)
    state.config["global_timeout"] = 300  # shorter than a cold load with margin
    state.write_saved(
        {MODEL: {"vllm_args": "--enable-auto-tool-choice --gpu-memory-utilization 0.92", "pinned": True}}
    )
    with lemonade_server(state) as server:
        check = run(
            report_host, server.url, "apply", "--check", "--bench-report", str(bench_report), hf=hf_cache
        )
        assert check.exit_code == 0, check.output
        saved_after_check, timeout_after_check = state.saved(), state.config["global_timeout"]
        applied = run(
            report_host,
            server.url,
            "apply",
            "--json",
            "--no-verify",
            "--bench-report",
            str(bench_report),
            hf=hf_cache,
        )
        again = run(
            report_host,
            server.url,
            "apply",
            "--json",
            "--no-verify",
            "--bench-report",
            str(bench_report),
            hf=hf_cache,
        )
        checked_again = run(report_host, server.url, "check", "--json", hf=hf_cache)

    # --check: Lemonade's dry run, the diff against the saved options, nothing written.
    assert saved_after_check[MODEL] == {
        "vllm_args": "--enable-auto-tool-choice --gpu-memory-utilization 0.92",
        "pinned": True,
    }
    assert "would change user.Qwen3-8B-vLLM" in check.output and '+  "ctx_size": 40960' in check.output
    assert timeout_after_check == 300 and "+global_timeout: 480" in check.output
    dry = [r["body"] for r in state.requests if r["method"] == "POST"][0]
    assert dry["dry_run"] is True

    doc = json.loads(applied.output)
    jsonschema.Draft202012Validator(load_schema("change.schema.json")).validate(doc)
    assert applied.exit_code == 0 and doc["changed"] is True and doc["schema_version"]
    saved = state.saved()[MODEL]
    # The report settled on 0.78 under the free-memory rule; --max-num-seqs from the measured knee (8);
    # ctx_size from the plan: Qwen3-8B's own 40960 tokens fit (the report used 8192).
    assert saved["vllm_args"] == "--enable-auto-tool-choice --gpu-memory-utilization 0.78 --max-num-seqs 8"
    assert saved["ctx_size"] == 40960 and saved["ctx_size"] >= 8192
    assert saved["pinned"] is True  # merged: an unrelated saved key stays
    assert state.config["global_timeout"] == 480 and doc["global_timeout"]["changed"] is True
    model_doc = doc["models"][0]
    assert "76.45 GiB free of 96.00 GiB" in model_doc["reasons"]["--gpu-memory-utilization"]
    assert "knee" in model_doc["reasons"]["--max-num-seqs"]

    # A rerun changes nothing and sends nothing.
    assert json.loads(again.output)["changed"] is False
    options_posts = [r for r in state.requests if r["method"] == "POST" and r["path"].endswith("/options")]
    assert len(options_posts) == 2  # the dry run and the one save
    assert [r["body"] for r in state.requests if r["path"] == "/internal/set"] == [{"global_timeout": 480}]

    # No protected flag was ever sent.
    for body in server.posted_bodies():
        words = json.dumps(body).replace('"', " ").split()
        assert not PROTECTED.intersection(w.split("=")[0] for w in words)

    # After the apply, the diagnosis of the model passes.
    findings = {f["id"]: f for f in json.loads(checked_again.output)["findings"]}
    assert findings[f"{MODEL}.memory"]["status"] == "pass", findings
    assert findings[f"{MODEL}.ctx_size"]["status"] == "pass", findings

    # The admin key never appears in any output.
    assert ADMIN_KEY not in all_output(check, applied, again, checked_again)


def test_check_finds_the_reports_failure_and_lemonades_traps(tmp_path, report_host, hf_cache):
    state = standin(tmp_path, admin_key=ADMIN_KEY)
    state.config["global_timeout"] = 0
    state.write_saved({MODEL: {"vllm_args": "--gpu-memory-utilization 0.92", "ctx_size": 8192}})
    with lemonade_server(state) as server:
        result = run(report_host, server.url, "check", "--json", hf=hf_cache)
    assert result.exit_code == 1, result.output
    findings = {f["id"]: f for f in json.loads(result.output)["findings"]}
    memory = findings[f"{MODEL}.memory"]
    assert memory["status"] == "fail" and "88.32 GiB" in memory["summary"] and "0.78" in memory["remedy"]
    assert (
        findings["lemonade.timeout"]["status"] == "fail"
        and "global_timeout=" in findings["lemonade.timeout"]["remedy"]
    )
    assert findings[f"{MODEL}.ctx_size"]["status"] == "pass"
    assert findings["lemonade.backend"]["status"] == "pass"
    assert ADMIN_KEY not in result.output


def test_a_protected_flag_saved_by_hand_is_dropped_not_resent(tmp_path, report_host, hf_cache):
    state = standin(tmp_path)
    # recipe_options.json edited by hand, as in the report, with a flag Lemonade refuses.
    state.write_saved({MODEL: {"vllm_args": "--max-model-len 8192 --enforce-eager"}})
    with lemonade_server(state) as server:
        result = run(report_host, server.url, "apply", "--json", "--no-verify", hf=hf_cache, key=None)
    assert result.exit_code == 0, result.output
    saved = state.saved()[MODEL]["vllm_args"]
    assert "--max-model-len" not in saved and saved.startswith("--enforce-eager ")
    assert any("dropped --max-model-len 8192" in n for n in json.loads(result.output)["models"][0]["notes"])


@pytest.mark.parametrize(
    "fault, words",
    [
        ("400", "rejected the request (400)"),
        ("401", "the key is missing or wrong"),
        ("500", "answered 500"),
        ("slow", "no complete answer within 1 s"),
        ("trickle", "no complete answer within 1 s"),
        ("trickle-headers", "no complete answer within 1 s"),
        ("wrong-shape", "not a JSON object"),
    ],
)
@pytest.mark.parametrize("sub", ["check", "apply", "verify", "install-backend"])
def test_a_misbehaving_lemonade_is_a_clear_finding(tmp_path, report_host, hf_cache, fault, words, sub):
    state = standin(tmp_path, fault=fault, admin_key=ADMIN_KEY)
    with lemonade_server(state) as server:
        started = time.monotonic()
        result = run(report_host, server.url, sub, "--timeout", "1", hf=hf_cache)
        elapsed = time.monotonic() - started
    assert result.exit_code == 2, result.output
    # "ends": one total deadline per exchange, however the server drips (DRIP_S is a minute)
    assert elapsed < 30, elapsed
    assert words in result.output and "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    assert ADMIN_KEY not in result.output


def test_nothing_answering_says_how_to_start_lemonade(report_host):
    result = run(report_host, "http://127.0.0.1:9", "check")
    assert result.exit_code == 2 and "systemctl start lemond" in result.output


def test_wrong_admin_key_is_refused_by_internal_endpoints_and_never_echoed(tmp_path, report_host, hf_cache):
    state = standin(tmp_path, admin_key="the-real-admin-key-123")
    with lemonade_server(state) as server:
        result = run(report_host, server.url, "check", hf=hf_cache)
    assert result.exit_code == 2 and "key is missing or wrong" in result.output
    assert ADMIN_KEY not in result.output and "the-real-admin-key-123" not in result.output


def test_install_backend_is_idempotent(tmp_path, report_host):
    state = standin(tmp_path, backend_state="installable")
    with lemonade_server(state) as server:
        check = run(report_host, server.url, "install-backend", "--check", key=None)
        first = run(report_host, server.url, "install-backend", "--json", key=None)
        second = run(report_host, server.url, "install-backend", "--json", key=None)
    assert "would install" in check.output and check.exit_code == 0
    assert json.loads(first.output)["changed"] is True and json.loads(second.output)["changed"] is False
    for doc in (json.loads(first.output), json.loads(second.output)):
        jsonschema.Draft202012Validator(load_schema("change.schema.json")).validate(doc)
    installs = [r["body"] for r in state.requests if r["path"] == "/api/v1/install"]
    assert installs == [{"recipe": "vllm", "backend": "rocm", "stream": False}]


def test_bad_bench_report_is_exit_2(tmp_path, report_host):
    bad = tmp_path / "bench.json"
    bad.write_text('{"knee": {"recommended_max_num_seqs": "ten"}}')
    result = run(report_host, "http://127.0.0.1:9", "apply", "--bench-report", str(bad))
    assert result.exit_code == 2 and "not a positive whole number" in result.output


def test_check_without_readable_free_memory_warns_and_names_the_backend(tmp_path, hf_cache):
    state = standin(tmp_path)
    state.loaded[MODEL] = {
        "model_name": MODEL,
        "recipe": "vllm",
        "pid": 4242,
        "launch_command": ["/var/lib/lemonade/.cache/lemonade/bin/vllm/rocm/vllm-server"],
    }
    with lemonade_server(state) as server:
        result = run(
            fixture_root("strix-halo-carveout"), server.url, "check", "--json", hf=hf_cache, key=None
        )
    findings = {f["id"]: f for f in json.loads(result.output)["findings"]}
    assert (
        findings[f"{MODEL}.plan"]["status"] == "warn"
        and "cannot be read" in findings[f"{MODEL}.plan"]["summary"]
    )
    assert findings["lemonade.backend"]["details"]["executable"].endswith("/vllm/rocm/vllm-server")
    assert result.exit_code == 0, result.output


def test_the_port_comes_from_lemonades_config_json_under_the_root(tmp_path, report_host):
    state = standin(tmp_path, backend_state="installable")
    with lemonade_server(state) as server:
        port = int(server.url.rsplit(":", 1)[1])
        config = report_host / "var/lib/lemonade/config.json"
        config.parent.mkdir(parents=True)
        config.write_text(json.dumps({"port": port, "unknown_key": {"kept": True}}))
        before = config.read_bytes()
        result = CliRunner().invoke(
            cli,
            ["--root", str(report_host), "lemonade", "install-backend", "--check"],
            env={"LEMONADE_ADMIN_API_KEY": "", "LEMONADE_API_KEY": "", "ROCMDOCTOR_LEMONADE_URL": ""},
        )
    assert result.exit_code == 0 and "would install vllm:rocm" in result.output, result.output
    assert config.read_bytes() == before  # read, never written


def test_a_failure_under_json_is_a_json_document_and_exit_2(tmp_path, report_host):
    state = standin(tmp_path, fault="500", admin_key=ADMIN_KEY)
    with lemonade_server(state) as server:
        result = run(report_host, server.url, "apply", "--json")
    doc = json.loads(result.output)
    assert result.exit_code == 2 and doc["ok"] is False and doc["error"]["kind"] == "server"
    assert "journalctl -u lemond" in doc["error"]["message"] and doc["schema_version"]


@pytest.mark.parametrize("listed", ["Qwen3-8B-vLLM", "builtin.Qwen3-8B-vLLM"])
@pytest.mark.parametrize("named", ["Qwen3-8B-vLLM", "builtin.Qwen3-8B-vLLM"])
def test_both_spellings_of_a_built_in_model_are_accepted(tmp_path, report_host, hf_cache, listed, named):
    """/v1/models lists an unshadowed built-in bare and a shadowed one as builtin.NAME; the user may name
    it either way (recipe_options.json keys are `builtin.NAME`), and the listed id is what is sent."""
    state = standin(tmp_path, models={listed: Registered(CHECKPOINT)})
    with lemonade_server(state) as server:
        result = run(report_host, server.url, "apply", "--check", "--json", "--model", named, hf=hf_cache)
    assert result.exit_code == 0, result.output
    assert [m["model"] for m in json.loads(result.output)["models"]] == [listed]


def test_apply_check_refuses_no_abbreviation_of_a_protected_flag_and_keeps_json_values(
    tmp_path, report_host, hf_cache
):
    spec = '--speculative-config {"method":"ngram","num_speculative_tokens":3}'
    state = standin(tmp_path)
    state.write_saved({MODEL: {"vllm_args": f"{spec} --por 9000 --max-model 4096"}})
    with lemonade_server(state) as server:
        result = run(report_host, server.url, "apply", "--json", "--no-verify", hf=hf_cache, key=None)
    doc = json.loads(result.output)
    sent = doc["models"][0]["sent"]["vllm_args"]
    assert sent.startswith(spec + " ") and "--por" not in sent and "--max-model " not in sent, sent
    assert json.loads(state.saved()[MODEL]["vllm_args"].split(" ", 1)[1].split(" --", 1)[0]) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
    }


def test_apply_loads_and_smokes_through_lemonade_after_saving(tmp_path, report_host, hf_cache):
    """As verify does: POST /api/v1/load, then smoke through Lemonade's OpenAI endpoint. The stand-in has
    no engine behind it here, so the smoke fails and apply says so (exit 1) after saving."""
    state = standin(tmp_path)
    with lemonade_server(state) as server:
        result = run(report_host, server.url, "apply", "--json", "--timeout", "5", hf=hf_cache, key=None)
    doc = json.loads(result.output)
    assert result.exit_code == 1, result.output
    assert doc["changed"] is True and "--gpu-memory-utilization" in state.saved()[MODEL]["vllm_args"]
    paths = [r["path"] for r in state.requests]
    saved_at = max(i for i, p in enumerate(paths) if p.endswith("/options"))
    assert "/api/v1/load" in paths[saved_at:], paths
    [verified] = doc["verify"]
    assert verified["model"] == MODEL and verified["exit_code"] == 1 and verified["steps"]
