"""`rocmdoctor smoke` against the real vLLM engine and against servers that misbehave for real."""

from __future__ import annotations

import subprocess
import time

import pytest
from jsonschema import validate

from harness.fake_openai import fake_server
from harness.smoke_cli import rocmdoctor, rocmdoctor_json, steps_by_id
from rocmdoctor.report import load_schema

STEPS = [
    "health",
    "models",
    "completion",
    "chat",
    "chat-stream",
    "determinism",
    "metrics",
    "version",
    "context",
]


def test_smoke_passes_against_the_real_engine(vllm_engine, vllm_engine_key_file):
    code, report = rocmdoctor_json(
        "smoke", "--url", vllm_engine.base_url + "/v1", "--api-key-file", str(vllm_engine_key_file)
    )
    validate(report, load_schema("smoke-report.schema.json"))
    steps = steps_by_id(report)
    assert code == 0, report
    assert list(steps) == STEPS
    assert {s["status"] for s in report["steps"] if s["id"] != "context"} == {"pass"}, report
    # the shared engine's dummy weights give flat logits: every token a near-tie, nothing to judge by
    context = steps["context"]
    assert context["status"] == "skip" and "near-tie" in context["summary"], context
    assert context["details"]["consistency"]["checks"], context
    assert report["model"] == vllm_engine.model
    # 4 generation requests of 16 tokens each (ignore_eos): the server's counters moved by exactly that
    assert steps["metrics"]["details"]["growth"] == {
        "vllm:request_success_total": 4,
        "vllm:generation_tokens_total": 64,
    }
    assert steps["chat-stream"]["details"]["completion_tokens"] == 16
    assert steps["version"]["details"]["version"].startswith("0.")


def test_a_well_behaved_server_passes_every_step():
    with fake_server() as server:
        code, report = rocmdoctor_json("smoke", "--url", server.base_url)
    assert code == 0 and {s["status"] for s in report["steps"] if s["id"] != "context"} == {"pass"}, report
    # the fake returns no token ids: the context probe says it cannot judge, and why
    context = steps_by_id(report)["context"]
    assert context["status"] == "skip" and "token ids" in context["summary"], context


FAILURES = {
    "completions fail while /health is 200": (
        ("--mode", "fail-completions"),
        (),
        "completion",
        ("/health is 200 but requests fail", "HTTP 500"),
        "the engine reports healthy but cannot serve",
    ),
    "another served name": (
        ("--served-name", "qwen3-4b"),
        ("--model", "tiny"),
        "models",
        ("'tiny' is not served", "qwen3-4b"),
        "--model qwen3-4b",
    ),
    "stream cut before [DONE]": (
        ("--mode", "cut-stream"),
        (),
        "chat-stream",
        ("without `data: [DONE]`", "/health is still 200"),
        "proxy",
    ),
    "server dies mid-test": (("--die-after", "2"), (), "chat", ("went away during the test",), "restart"),
}


@pytest.mark.parametrize(
    ("fake_args", "smoke_args", "failing", "says", "remedy"), FAILURES.values(), ids=FAILURES
)
def test_each_failure_is_named_at_its_step_with_a_remedy(fake_args, smoke_args, failing, says, remedy):
    with fake_server(*fake_args) as server:
        code, report = rocmdoctor_json("smoke", "--url", server.base_url, *smoke_args)
        try:  # a server that exits on its own is given a moment to finish exiting
            died = server.process.wait(timeout=10) if "--die-after" in fake_args else server.process.poll()
        except subprocess.TimeoutExpired:
            died = None
    steps = steps_by_id(report)
    assert code == 1
    assert [steps[s]["status"] for s in STEPS[: STEPS.index(failing)]] == ["pass"] * STEPS.index(failing)
    assert steps[failing]["status"] == "fail"
    assert all(fragment in steps[failing]["summary"] for fragment in says), steps[failing]
    assert remedy in steps[failing]["remedy"]
    if "--die-after" in fake_args:
        assert died == 3  # the server process really exited; what follows is skipped, not retried
        assert {steps[s]["status"] for s in STEPS[STEPS.index(failing) + 1 :]} == {"skip"}


def test_a_busy_nondeterministic_server_gets_warnings_not_failures():
    with fake_server("--mode", "noisy") as server:
        code, report = rocmdoctor_json("smoke", "--url", server.base_url)
    steps = steps_by_id(report)
    assert code == 0
    assert (
        steps["determinism"]["status"] == "warn"
        and "two different answers" in steps["determinism"]["summary"]
    )
    assert steps["metrics"]["status"] == "warn" and "other clients" in steps["metrics"]["remedy"]
    assert steps["metrics"]["details"]["growth"] == {
        "vllm:request_success_total": 8,
        "vllm:generation_tokens_total": 68,
    }


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (None, "requires an API key"),
        ("wrong", "rejected the API key"),
    ],
)
def test_a_server_that_needs_an_api_key(tmp_path, key, expected):
    args = []
    if key:
        (tmp_path / "key").write_text(key + "\n")
        args = ["--api-key-file", str(tmp_path / "key")]
    with fake_server("--api-key", "s3cret") as server:
        code, report = rocmdoctor_json("smoke", "--url", server.base_url, *args)
        (tmp_path / "right").write_text("s3cret\n")
        right_code, _ = rocmdoctor_json(
            "smoke", "--url", server.base_url, "--api-key-file", str(tmp_path / "right")
        )
    models = steps_by_id(report)["models"]
    assert code == 1 and right_code == 0
    assert expected in models["summary"]
    assert "--api-key" in models["remedy"]


@pytest.mark.timeout(60)
def test_a_stalled_server_times_out_instead_of_hanging():
    with fake_server("--mode", "stall") as server:
        started = time.monotonic()
        code, report = rocmdoctor_json("smoke", "--url", server.base_url, "--timeout", "1")
        elapsed = time.monotonic() - started
    completion = steps_by_id(report)["completion"]
    assert code == 1
    assert completion["status"] == "fail" and "no answer within 1 s" in completion["summary"]
    assert "--timeout" in completion["remedy"]
    # the later steps are skipped, not each waited out
    assert elapsed < 15


def test_nothing_listening_is_exit_2_with_a_remedy(unused_port):
    code, report = rocmdoctor_json("smoke", "--url", f"http://127.0.0.1:{unused_port}")
    health = steps_by_id(report)["health"]
    assert code == 2
    assert health["status"] == "error" and "connection refused" in health["summary"]
    assert "rocmdoctor serve" in health["remedy"]


def test_smoke_text_output_names_the_failure_and_the_fix():
    with fake_server("--mode", "fail-completions") as server:
        result = rocmdoctor("smoke", "--url", server.base_url)
    assert result.returncode == 1
    assert "HTTP 500" in result.stdout and "→ the engine reports healthy but cannot serve" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--api-key-file", "/nonexistent/smoke-key"], "no such file"),
        (["--url", "ftp://example.org"], "not an http(s) URL"),
        (["--url", "http://127.0.0.1:99999"], "invalid port"),
        (["--timeout", "0"], "Invalid value for '--timeout'"),
        (["--context-probe", "maybe"], "Invalid value for '--context-probe'"),
        (["--context-boundary", "0"], "Invalid value for '--context-boundary'"),
        (["--dtype", "int4"], "Invalid value for '--dtype'"),
    ],
)
def test_bad_input_is_exit_2_without_traceback(args, message):
    result = rocmdoctor("smoke", *args)
    assert result.returncode == 2
    assert message in result.stderr


def test_an_empty_key_file_is_refused(tmp_path):
    (tmp_path / "key").write_text("\n\n")
    result = rocmdoctor("smoke", "--api-key-file", str(tmp_path / "key"))
    assert result.returncode == 2 and "is empty" in result.stderr
