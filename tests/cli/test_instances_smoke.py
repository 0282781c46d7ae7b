"""`rocmdoctor instances --smoke`: every written instance smoke-tested on its own port with its own
key, one line each, against two real servers speaking vLLM's protocol (one healthy, one whose
completions fail while /health is 200)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.fake_openai import fake_server
from harness.hosts import run_cli, two_instance_layout

KEY = "rack-smoke-key-0123456789"


def env_file(root: Path, name: str, url: str, key: str | None = KEY) -> None:
    port = url.rsplit(":", 1)[1]
    folder = root / "etc/rocmdoctor/vllm"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        "ROCR_VISIBLE_DEVICES=" + name,
        f"ROCMDOCTOR_PORT={port}",
        *([f"VLLM_API_KEY={key}"] if key else []),
    ]
    (folder / f"{name}.env").write_text("\n".join(lines) + "\n")


def test_each_instance_gets_one_line_and_a_failure_fails_the_run(tmp_path: Path):
    with (
        fake_server("--api-key", KEY) as good,
        fake_server("--api-key", KEY, "--mode", "fail-completions") as bad,
    ):
        env_file(tmp_path, "0", good.base_url)
        env_file(tmp_path, "1", bad.base_url)
        proc = run_cli("instances", "--smoke", root=tmp_path)
        lines = proc.stdout.splitlines()
        assert proc.returncode == 1, proc.stderr
        assert lines[0].startswith(f"vllm@0 {good.base_url}: ok (") and " 0 fail" in lines[0]
        assert lines[1].startswith(f"vllm@1 {bad.base_url}: FAILED (") and "completion" in lines[1]
        env_file(tmp_path, "1", bad.base_url, key=None)  # without its key: 401 on every /v1 request
        proc = run_cli("instances", "--smoke", "--json", root=tmp_path)
        doc = json.loads(proc.stdout)
        assert doc["schema_version"] == 1 and doc["exit_code"] == proc.returncode != 0
        assert [(i["name"], i["exit_code"]) for i in doc["instances"]][0] == ("0", 0)
        assert doc["instances"][1]["failed_steps"]
        # each instance carries its long-context probe's verdict: the fake returns no token ids
        context = doc["instances"][0]["context"]
        assert context["status"] == "skip" and "token ids" in context["summary"], context
        assert context["consistency"]["verdict"] == "cannot_judge"


def test_no_written_instances_is_a_clear_exit_2(tmp_path: Path):
    proc = run_cli("instances", "--smoke", root=tmp_path)
    assert proc.returncode == 2 and "run `rocmdoctor instances --write` first" in proc.stderr
    env_file(tmp_path, "0", "http://127.0.0.1:99999")
    proc = run_cli("instances", "--smoke", root=tmp_path)
    assert (
        proc.returncode == 2 and "no valid ROCMDOCTOR_PORT" in proc.stderr and "Traceback" not in proc.stderr
    )


def test_bench_reports_each_instance_and_the_aggregate(tmp_path: Path):
    # A per-token delay makes each server's throughput bounded by time, not by this machine's CPUs:
    # two independent servers side by side then give about twice one server's figure.
    with (
        fake_server("--api-key", KEY, "--token-delay", "0.01") as one,
        fake_server("--api-key", KEY, "--token-delay", "0.01") as two,
    ):
        env_file(tmp_path, "0", one.base_url)
        env_file(tmp_path, "1", two.base_url)
        proc = run_cli(
            "instances",
            "--bench",
            "--concurrency",
            "4",
            "--requests",
            "8",
            "--max-tokens",
            "16",
            "--json",
            root=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["schema_version"] == 1 and doc["failures"] == 0
        assert [i["name"] for i in doc["instances"]] == ["0", "1"]
        for inst in doc["instances"]:
            assert inst["alone"]["completed"] == inst["together"]["completed"] == 8
            assert inst["alone"]["output_tokens"] == 8 * 16
        total = sum(i["together"]["output_tokens"] for i in doc["instances"])
        assert doc["aggregate_output_tokens_per_s"] == pytest.approx(total / doc["wall_s"], rel=0.01)
        assert doc["sum_of_alone_output_tokens_per_s"] == pytest.approx(
            sum(i["alone"]["output_tokens_per_s"] for i in doc["instances"]), abs=0.01
        )
        # The scaling is the aggregate over the sum of the alone figures. Its value is timing: a slow spell
        # of the shared machine during one alone run gave 2.1 once, so only its definition and a floor.
        assert doc["scaling"] == pytest.approx(
            doc["aggregate_output_tokens_per_s"] / doc["sum_of_alone_output_tokens_per_s"], rel=0.01
        )
        assert doc["scaling"] > 0.5
        text = run_cli(
            "instances",
            "--bench",
            "--concurrency",
            "2",
            "--requests",
            "2",
            "--max-tokens",
            "4",
            root=tmp_path,
        )
        assert text.returncode == 0 and "aggregate" in text.stdout and text.stdout.count("vllm@") == 2
    # Nothing answers any more: a clear refusal naming the instance.
    proc = run_cli("instances", "--bench", root=tmp_path)
    assert proc.returncode == 2 and "vllm@0" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("instances", "--bench", "--concurrency", "8", "--requests", "4", root=tmp_path)
    assert proc.returncode == 2 and "smaller than --concurrency" in proc.stderr


def test_the_servers_are_reached_where_the_written_template_reaches_them(tmp_path: Path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (tmp_path / "etc/group").write_text("root:x:0:\n")
    written = run_cli(
        "instances",
        *two_instance_layout(),
        "--host",
        "127.0.0.2",
        "--model",
        "m",
        "--write",
        "--target",
        str(tmp_path),
        root=tmp_path,
    )
    assert written.returncode == 0, written.stderr
    with fake_server("--api-key", KEY) as server:  # listens on 127.0.0.1 only
        port = server.base_url.rsplit(":", 1)[1]
        env_file(tmp_path, "0", server.base_url)
        (tmp_path / "etc/rocmdoctor/vllm/1.env").unlink()
        proc = run_cli("instances", "--smoke", "--json", root=tmp_path)
        assert (
            proc.returncode != 0
            and json.loads(proc.stdout)["instances"][0]["url"] == f"http://127.0.0.2:{port}"
        )
        proc = run_cli("instances", "--smoke", "--json", "--host", "127.0.0.1", root=tmp_path)
        assert proc.returncode == 0, proc.stdout
        assert json.loads(proc.stdout)["instances"][0]["url"] == server.base_url


def test_smoke_and_bench_take_the_written_layout_with_all_instances(tmp_path: Path):
    with (
        fake_server("--api-key", KEY) as good,
        fake_server("--api-key", KEY, "--mode", "fail-completions") as bad,
    ):
        env_file(tmp_path, "0", good.base_url)
        env_file(tmp_path, "1", bad.base_url)
        via_smoke = run_cli("smoke", "--all-instances", "--json", root=tmp_path)
        via_instances = run_cli("instances", "--smoke", "--json", root=tmp_path)
        assert via_smoke.returncode == via_instances.returncode == 1, via_smoke.stderr
        ours, theirs = json.loads(via_smoke.stdout), json.loads(via_instances.stdout)
        assert [(i["name"], i["url"], i["exit_code"]) for i in ours["instances"]] == [
            (i["name"], i["url"], i["exit_code"]) for i in theirs["instances"]
        ]
        env_file(tmp_path, "1", good.base_url)
        proc = run_cli(
            "bench", "--all-instances", "--concurrency", "1,2", "--requests", "2", "--max-tokens", "4",
            "--json", root=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert [i["name"] for i in doc["instances"]] == ["0", "1"] and doc["failures"] == 0
        assert all(i["together"]["completed"] == 2 for i in doc["instances"])
        assert doc["aggregate_output_tokens_per_s"] > 0
    for argv in (
        ("smoke", "--all-instances", "--url", "http://127.0.0.1:8000"),
        ("bench", "--all-instances", "--model", "m"),
        ("bench", "--all-instances", "--plot", str(tmp_path / "p.png")),
    ):
        proc = run_cli(*argv, root=tmp_path)
        assert proc.returncode == 2 and "not with --all-instances" in proc.stderr, argv
        assert "Traceback" not in proc.stderr
