"""Two real vLLM CPU engines side by side, started exactly as `rocmdoctor instances --write` lays them
out: the template's ExecStart= with each instance's env file (port, memory share, devices, API key),
then the real CLI's `instances --smoke` and `instances --bench` over the written layout.

systemd itself is covered by test_instances_systemd.py (stand-in servers) and test_unit_systemd.py (one
real engine); here the point is that the command line and environment the files carry really serve,
and that smoke and bench give one verdict and real figures per instance. One engine pair serves the
whole module (each start takes ~40 s on the 2-core CI box).
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from harness.engine import (
    Engine,
    Launch,
    engine_command,
    free_port,
    make_tiny_model,
    require_vllm_python,
    start_servers,
)
from harness.hosts import run_cli, two_instance_layout
from harness.unit_exec import env_file_vars, instance_argv

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

KEY = "rack-engine-key-0123456789"
PREFIX = "/opt/rocmdoctor"
ENV_DIR = "etc/rocmdoctor/vllm"


@dataclass
class Rack:
    root: Path
    layout: dict
    engines: list[Engine]


def empty_root(path: Path) -> Path:
    (path / "etc").mkdir(parents=True)
    (path / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (path / "etc/group").write_text("root:x:0:\n")
    return path


@pytest.fixture(scope="module")
def rack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rack]:
    require_vllm_python()
    base = tmp_path_factory.mktemp("rack-engine")
    model = make_tiny_model(base / "model")
    root = empty_root(base / "root")
    key_file = base / "api-key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    written = run_cli(
        "instances",
        *two_instance_layout(),
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "8",
        "--port",
        str(free_port()),
        "--api-key-file",
        str(key_file),
        "--write",
        "--target",
        str(root),
        "--json",
        "--",
        "--load-format",
        "dummy",
        "--enforce-eager",
        root=root,
    )
    assert written.returncode == 0, written.stderr
    layout = json.loads(written.stdout)
    template = (root / "etc/systemd/system/vllm@.service").read_text()
    launches = []
    for inst in layout["instances"]:
        env = env_file_vars((root / ENV_DIR / f"{inst['name']}.env").read_text())
        argv = instance_argv(template, inst["name"], env)
        assert argv[0] == f"{PREFIX}/current/bin/vllm-server", argv
        # The installed bundle's bin/vllm-server runs vLLM's OpenAI server; here the test venv's.
        launches.append(
            Launch(
                engine_command(*argv[1:]),
                inst["port"],
                base / f"vllm-{inst['name']}.log",
                env,
                api_key=env.get("VLLM_API_KEY"),
            )
        )
    with start_servers(launches, startup_timeout=480) as engines:
        yield Rack(root, layout, engines)


def status_of(url: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_each_engine_runs_with_its_own_files_settings(rack: Rack):
    instances = rack.layout["instances"]
    assert [i["name"] for i in instances] == ["0", "1"]
    assert len({i["port"] for i in instances}) == 2
    for inst, engine in zip(instances, rack.engines, strict=True):
        assert engine.port == inst["port"]
        # The key reached vLLM through the env file (VLLM_API_KEY), not the command line.
        assert status_of(f"{engine.base_url}/v1/models", None) == 401
        assert status_of(f"{engine.base_url}/v1/models", KEY) == 200
        process = psutil.Process(engine.pid)
        cmdline = process.cmdline()
        assert "--api-key" not in cmdline and KEY not in " ".join(cmdline)
        assert cmdline[cmdline.index("--port") + 1] == str(inst["port"])
        utilization = float(cmdline[cmdline.index("--gpu-memory-utilization") + 1])
        assert utilization == pytest.approx(inst["gpu_memory_utilization"], abs=0.005)
        assert cmdline[cmdline.index("--tensor-parallel-size") + 1] == str(inst["tensor_parallel_size"])
        assert process.environ()["ROCR_VISIBLE_DEVICES"] == inst["visible_devices"]


def test_smoke_passes_on_both_with_one_line_each(rack: Rack):
    text = run_cli("instances", "--smoke", root=rack.root)
    assert text.returncode == 0, text.stdout + text.stderr
    lines = text.stdout.splitlines()
    assert len(lines) == 2
    for n, (line, engine) in enumerate(zip(lines, rack.engines, strict=True)):
        assert line.startswith(f"vllm@{n} {engine.base_url}: ok (")
        assert " 0 fail)" in line
    done = run_cli("instances", "--smoke", "--json", root=rack.root)
    doc = json.loads(done.stdout)
    assert done.returncode == doc["exit_code"] == 0 and doc["schema_version"] == 1
    assert [(i["name"], i["url"]) for i in doc["instances"]] == [
        (str(n), e.base_url) for n, e in enumerate(rack.engines)
    ]
    for inst in doc["instances"]:
        assert inst["exit_code"] == 0 and inst["failed_steps"] == []
        assert inst["summary"]["pass"] > 0 and inst["summary"].get("fail", 0) == 0


def prefix_cache_hits(engine: Engine) -> float:
    with urllib.request.urlopen(f"{engine.base_url}/metrics", timeout=30) as response:
        text = response.read(1 << 22).decode()
    found = re.findall(r"^vllm:prefix_cache_hits_total(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    assert found, "vLLM exports vllm:prefix_cache_hits_total"
    return sum(float(v) for v in found)


def test_bench_gives_per_instance_and_aggregate_figures(rack: Rack):
    requests, max_tokens = 4, 8
    hits_before = [prefix_cache_hits(e) for e in rack.engines]
    done = run_cli(
        "instances",
        "--bench",
        "--concurrency",
        "2",
        "--requests",
        str(requests),
        "--max-tokens",
        str(max_tokens),
        "--json",
        root=rack.root,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema_version"] == 1 and doc["failures"] == 0 and doc["exit_code"] == 0
    assert [i["name"] for i in doc["instances"]] == ["0", "1"]
    for inst in doc["instances"]:
        for run in (inst["alone"], inst["together"]):
            assert run["completed"] == requests and run["failures"] == 0
            assert run["output_tokens"] == requests * max_tokens
            assert run["output_tokens_per_s"] > 0
    together = sum(i["together"]["output_tokens"] for i in doc["instances"])
    assert doc["wall_s"] > 0
    assert doc["aggregate_output_tokens_per_s"] == pytest.approx(together / doc["wall_s"], rel=0.01)
    alone = sum(i["alone"]["output_tokens_per_s"] for i in doc["instances"])
    assert doc["sum_of_alone_output_tokens_per_s"] == pytest.approx(alone, abs=0.01)
    print(  # the figures, for docs/performance.md (pytest -rP shows them)
        "startup_s",
        [round(e.startup_s, 1) for e in rack.engines],
        "alone",
        [i["alone"]["output_tokens_per_s"] for i in doc["instances"]],
        "together",
        [i["together"]["output_tokens_per_s"] for i in doc["instances"]],
        "aggregate",
        doc["aggregate_output_tokens_per_s"],
        "sum_of_alone",
        doc["sum_of_alone_output_tokens_per_s"],
        "scaling",
        doc["scaling"],
    )
    assert doc["scaling"] == pytest.approx(
        doc["aggregate_output_tokens_per_s"] / doc["sum_of_alone_output_tokens_per_s"], abs=0.002
    )

    # Warm-up, alone and together never send a prompt twice: no run skips its prefill ...
    assert [prefix_cache_hits(e) for e in rack.engines] == hits_before
    # ... where the same long prompt sent twice does (so the counter above could have grown).
    engine = rack.engines[0]
    body = json.dumps({"model": "tiny", "prompt": [5 + k % 50 for k in range(400)], "max_tokens": 1}).encode()
    for _ in range(2):
        request = urllib.request.Request(
            f"{engine.base_url}/v1/completions",
            body,
            {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200
    assert prefix_cache_hits(engine) > hits_before[0]

    text = run_cli(
        "instances",
        "--bench",
        "--concurrency",
        "1",
        "--requests",
        "2",
        "--max-tokens",
        "4",
        root=rack.root,
    )
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["vllm@0", "vllm@1", "aggregate"]
    assert "sum of alone" in lines[2] and "Traceback" not in text.stderr


def test_an_instance_that_does_not_answer_fails_by_name_beside_serving_ones(rack: Rack, tmp_path: Path):
    # A copy of the layout with a third instance whose server is not running.
    root = tmp_path / "root"
    shutil.copytree(rack.root, root, symlinks=True)
    dead_port = free_port()
    env1 = (root / ENV_DIR / "1.env").read_text()
    port1 = env_file_vars(env1)["ROCMDOCTOR_PORT"]
    (root / ENV_DIR / "2.env").write_text(
        env1.replace(f"ROCMDOCTOR_PORT={port1}", f"ROCMDOCTOR_PORT={dead_port}")
    )
    smoke = run_cli("instances", "--smoke", "--json", root=root)
    doc = json.loads(smoke.stdout)
    assert smoke.returncode == doc["exit_code"] != 0
    verdicts = {i["name"]: i["exit_code"] for i in doc["instances"]}
    assert verdicts["0"] == verdicts["1"] == 0 and verdicts["2"] != 0
    assert doc["instances"][2]["url"].endswith(f":{dead_port}")
    bench = run_cli("instances", "--bench", "--concurrency", "1", "--requests", "1", root=root)
    assert bench.returncode == 2 and "vllm@2" in bench.stderr and "Traceback" not in bench.stderr
