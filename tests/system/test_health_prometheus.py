"""Health end to end with real parts: `check --textfile` on host fixtures, Debian's node_exporter
reading the file, Debian's Prometheus scraping it and the real vLLM CPU engine's /metrics and
evaluating the shipped rules (time scaled: a `for:` of N min is N s, stale after 10 s), the alerts
firing and resolving on real conditions: a check failing on a fixture, the server stopped, an orphan
holding its port, the file no longer written. One Prometheus for all of it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.engine import free_port, make_tiny_model, require_vllm_python, start_engine
from harness.health_plot import plot
from harness.hosts import fixture_root
from harness.prometheus_stack import stack, wait_for
from harness.promql import RULES, scaled_rules
from rocmdoctor.cli import cli
from rocmdoctor.vllm.health_metrics import VLLM_SCRAPED

pytestmark = pytest.mark.system
KEY = "rocmdoctor-health-key"


def _root(tmp: Path, fixture: str, model: Path, port: int, key_file: Path) -> Path:
    root = tmp / fixture
    shutil.copytree(fixture_root(fixture), root, symlinks=True)
    done = CliRunner().invoke(
        cli,
        [
            "--root",
            str(root),
            "unit",
            "--write",
            "--target",
            str(root),
            "--model",
            str(model),
            "--served-model-name",
            "tiny",
            "--port",
            str(port),
            "--api-key-file",
            str(key_file),
            "--gpu-memory-utilization",
            "0.5",
            "--user",
            "vllm",
        ],
    )
    assert done.exit_code == 0, done.output
    return root


@pytest.fixture(scope="module")
def health(tmp_path_factory):
    require_vllm_python()
    tmp = tmp_path_factory.mktemp("health")
    model = make_tiny_model(tmp / "tiny")
    key_file = tmp / "key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    port = free_port()
    roots = {f: _root(tmp, f, model, port, key_file) for f in ("strix-halo-clean", "strix-halo-nocwsr-dkms")}
    textfiles = tmp / "textfile"
    textfiles.mkdir()
    rules = tmp / "rules.yml"
    rules.write_text(scaled_rules(RULES.read_text()))
    with contextlib.ExitStack() as stack_:
        engine_stack = stack_.enter_context(contextlib.ExitStack())
        engine = engine_stack.enter_context(
            # float32: on this machine's AMX CPU the bf16 attention kernel's worker dies with SIGILL on the
            # first request (/health stays 200 while every completion fails: the probe's "failing").
            start_engine(
                model,
                port=port,
                api_key=KEY,
                served_name="tiny",
                log_path=tmp / "vllm.log",
                extra_args=["--dtype", "float32"],
            )
        )
        prom = stack_.enter_context(stack(tmp, textfiles, rules, port))
        yield {
            "roots": roots,
            "file": textfiles / "rocmdoctor.prom",
            "prom": prom,
            "engine": engine,
            "stop_engine": engine_stack.close,
            "port": port,
            "tmp": tmp,
        }


def write(env, fixture: str = "strix-halo-clean") -> None:
    done = CliRunner().invoke(
        cli, ["--root", str(env["roots"][fixture]), "check", "--textfile", str(env["file"])]
    )
    assert done.exit_code == 0, done.output


def _completions(engine, n: int) -> None:
    import json
    import urllib.request

    for _ in range(n):
        request = urllib.request.Request(
            f"{engine.base_url}/v1/completions",
            data=json.dumps({"model": "tiny", "prompt": "Hello there", "max_tokens": 32}).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200
        time.sleep(0.5)


def test_alerts_fire_and_resolve_on_real_conditions(health):
    prom, started = health["prom"], time.time()
    # 1. all well: the engine passes the probe, rocmdoctor read its /metrics per engine, and
    # Prometheus scrapes vLLM too; some load for the throughput panel
    wait_for(
        "the probe's ok verdict in Prometheus",
        lambda: prom.query('rocmdoctor_server_probe{server="vllm",verdict="ok"} == 1'),
        lambda: write(health),
    )
    _completions(health["engine"], 8)
    write(health)
    assert prom.query('rocmdoctor_server_kv_cache_usage_ratio{server="vllm",engine="0"}')
    for name in VLLM_SCRAPED:  # every vLLM name the rules and dashboard read exists in the real engine
        assert prom.query(f'count({{__name__="{name}"}})'), name
    assert prom.query("node_textfile_scrape_error == 0")
    lint = subprocess.run(
        ["promtool", "check", "metrics"], input=health["file"].read_bytes(), capture_output=True
    )
    assert (lint.returncode, lint.stdout + lint.stderr) == (0, b"")
    assert not prom.firing("RocmdoctorBlockingCheckFailing")

    # 2. a blocking check fails (the CWSR-less kernel fixture), then the host is good again
    firing = wait_for(
        "RocmdoctorBlockingCheckFailing",
        lambda: prom.firing("RocmdoctorBlockingCheckFailing"),
        lambda: write(health, "strix-halo-nocwsr-dkms"),
    )
    assert {"action": "serve", "check": "kernel.cwsr"}.items() <= next(
        a for a in firing if a["check"] == "kernel.cwsr" and a["action"] == "serve"
    ).items()
    wait_for(
        "the check alert to resolve",
        lambda: not prom.firing("RocmdoctorBlockingCheckFailing"),
        lambda: write(health),
    )

    # 3. the server stops: the probe says unreachable, Prometheus's own scrape of vLLM is down
    health["stop_engine"]()
    wait_for(
        "RocmdoctorServerNotAnswering",
        lambda: prom.firing("RocmdoctorServerNotAnswering"),
        lambda: write(health),
    )
    assert prom.query('up{job="vllm"} == 0')

    # 4. an orphan takes the port: it answers, but not as vLLM
    orphan = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(health["port"]), "--bind", "127.0.0.1"],
        cwd=health["tmp"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        firing = wait_for(
            "RocmdoctorServerProbeFailing",
            lambda: prom.firing("RocmdoctorServerProbeFailing"),
            lambda: write(health),
        )
        assert any(a["verdict"] == "unhealthy" for a in firing)
        wait_for(
            "NotAnswering to resolve",
            lambda: not prom.firing("RocmdoctorServerNotAnswering"),
            lambda: write(health),
        )
    finally:
        orphan.terminate()
        orphan.wait(10)
    wait_for(
        "ProbeFailing to resolve",
        lambda: not prom.firing("RocmdoctorServerProbeFailing"),
        lambda: write(health),
    )

    # 5. the timer stops writing: the file goes stale
    wait_for("RocmdoctorHealthStale", lambda: prom.firing("RocmdoctorHealthStale"), timeout_s=40)

    # the dashboard's own queries over the run, drawn (docs/health.md's picture when asked for)
    out = Path(os.environ.get("ROCMDOCTOR_HEALTH_PNG") or health["tmp"] / "health.png")
    drawn = plot(prom, started, time.time(), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for title in (
        "Server probe",
        "Throughput (tokens/s, per engine)",
        "Queue (per engine)",
        "KV cache usage (per engine)",
    ):
        assert drawn[title] > 0, title
