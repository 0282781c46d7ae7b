"""`check --textfile` on host fixtures with the servers the unit commands wrote: the file is valid
Prometheus text, the probe tells an answering server from one whose completions fail (the fake
speaks vLLM's protocol and fails the way vLLM does: /health 200, completions 500), from nothing on
the port; the instances' memory need lands on their GPUs; bad paths are refused before anything runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from harness.engine import free_port
from harness.fake_openai import fake_server
from harness.hosts import fixture_root
from rocmdoctor.cli import cli

KEY = "health-test-key"


def invoke(*argv: str):
    return CliRunner().invoke(cli, list(argv))


def samples(path: Path) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(path.read_text())}


def host_with_unit(tmp_path: Path, port: int, fixture: str = "strix-halo-clean") -> Path:
    root = tmp_path / "root"
    shutil.copytree(fixture_root(fixture), root, symlinks=True)
    key = tmp_path / "key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    (tmp_path / "model").mkdir()
    done = invoke(
        "--root", str(root), "unit", "--write", "--target", str(root), "--model", str(tmp_path / "model"), "--served-model-name", "tiny",
        "--port", str(port), "--api-key-file", str(key), "--gpu-memory-utilization", "0.5", "--user", "vllm",
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    return root


@pytest.mark.parametrize(
    "mode, verdict, up",
    [("ok", "ok", True), ("fail-completions", "failing", True), (None, "unreachable", False)],
)
def test_the_probe_verdict_of_the_written_server(tmp_path, mode, verdict, up):
    out = tmp_path / "textfile" / "rocmdoctor.prom"
    out.parent.mkdir()
    if mode is None:
        root = host_with_unit(tmp_path, free_port())
        done = invoke("--root", str(root), "check", "--textfile", str(out))
    else:
        with fake_server("--mode", mode, "--api-key", KEY) as server:
            root = host_with_unit(tmp_path, int(server.base_url.rsplit(":", 1)[1]))
            done = invoke("--root", str(root), "check", "--textfile", str(out))
    assert done.exit_code == 0, done.output
    assert "1 servers" in done.output
    # a server not serving is named as a result row, with what to do about it
    row = f"FAIL  vllm: server.probe: {verdict}: "
    assert (row in done.output) is (verdict != "ok"), done.output
    if verdict != "ok":
        assert "-> " in done.output and "vllm.service" in done.output.split(row, 1)[1]
    found = samples(out)
    (probe,) = found["rocmdoctor_server_probe"]
    assert probe.labels == {"server": "vllm", "verdict": verdict}
    assert found["rocmdoctor_server_up"][0].value == float(up)
    tokens = found["rocmdoctor_server_prompt_tokens"]
    assert bool(tokens) == up and all(s.labels == {"server": "vllm", "engine": "0"} for s in tokens)
    (need,) = found["rocmdoctor_server_memory_need_bytes"]
    (total,) = found["rocmdoctor_gpu_memory_total_bytes"]
    assert need.labels["gpu_id"] == total.labels["gpu_id"] == "0" and need.value == int(0.5 * total.value)
    assert [p.name for p in out.parent.iterdir()] == ["rocmdoctor.prom"]  # no temp file left behind


def test_every_instance_is_probed_and_needs_its_own_partition(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(fixture_root("mi308x-cpx"), root, symlinks=True)
    (tmp_path / "model").mkdir()
    port = free_port()
    done = invoke(
        "--root", str(root), "instances", "--write", "--target", str(root), "--instances", "per-partition", "--model",
        str(tmp_path / "model"), "--user", "vllm", "--port", str(port),
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    out = tmp_path / "rocmdoctor.prom"
    done = invoke("--root", str(root), "check", "--textfile", str(out))
    assert done.exit_code == 0, done.output
    found = samples(out)
    probes = {s.labels["server"]: s.labels["verdict"] for s in found["rocmdoctor_server_probe"]}
    assert len(probes) == 32 and set(probes.values()) <= {"unreachable", "ok"}
    need = {s.labels["server"]: s.labels["gpu_id"] for s in found["rocmdoctor_server_memory_need_bytes"]}
    assert sorted(need.values(), key=int) == [str(i) for i in range(32)]  # one partition each
    info = {s.labels["server"]: s.labels["url"] for s in found["rocmdoctor_server_info"]}
    # Each instance's own port, from --port up (`instances` passes over a port another process holds,
    # so on a shared machine they need not be contiguous).
    ports = [int(info[f"vllm@{i}"].rsplit(":", 1)[1]) for i in range(32)]
    assert ports == sorted(set(ports)) and ports[0] >= port
    assert out.stat().st_size < 64 << 10


@pytest.mark.parametrize(
    "name, message",
    [("rocmdoctor.txt", "only files named *.prom"), ("missing/rocmdoctor.prom", "is not a directory")],
)
def test_a_textfile_path_node_exporter_cannot_read_is_refused(tmp_path, name, message):
    done = invoke(
        "--root", str(fixture_root("strix-halo-clean")), "check", "--textfile", str(tmp_path / name)
    )
    assert done.exit_code == 2
    assert message in done.output
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_breaks_still_writes_a_file_that_says_so(tmp_path, monkeypatch):
    from rocmdoctor.commands import health_textfile

    def broken(ctx):
        raise RuntimeError("simulated bug in the server reader")

    monkeypatch.setattr(health_textfile, "servers", broken)
    out = tmp_path / "rocmdoctor.prom"
    done = invoke("--root", str(fixture_root("strix-halo-clean")), "check", "--textfile", str(out))
    assert done.exit_code == 2
    assert "simulated bug" in done.output and "rocmdoctor_up 0" in done.output
    assert samples(out)["rocmdoctor_up"][0].value == 0.0
