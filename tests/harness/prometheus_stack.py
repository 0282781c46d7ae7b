"""Debian's node_exporter and Prometheus on loopback for a test: short intervals, a temporary
storage directory, and both processes stopped on every exit path."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import polling
from harness.engine import free_port

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
PROMETHEUS = "/usr/bin/prometheus"


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


@contextlib.contextmanager
def running(
    argv: list[str], ready_url: str, log: Path, timeout_s: float = 30.0
) -> Iterator[subprocess.Popen]:
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                _get(ready_url, 2.0)
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{argv[0]} did not come up: {log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@dataclass
class Prometheus:
    url: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = _get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        return json.loads(body)["data"]["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
        return json.loads(_get(f"{self.url}/api/v1/query_range?{params}"))["data"]["result"]

    def alerts(self) -> list[dict[str, Any]]:
        return json.loads(_get(f"{self.url}/api/v1/alerts"))["data"]["alerts"]

    def firing(self, name: str) -> list[dict[str, str]]:
        return [
            a["labels"] for a in self.alerts() if a["labels"]["alertname"] == name and a["state"] == "firing"
        ]


def wait_for(
    what: str, predicate: Callable[[], Any], step: Callable[[], None] = lambda: None, timeout_s: float = 60
) -> Any:
    """Call `step` (e.g. write the textfile again) and poll `predicate` until it is truthy."""

    def stepped() -> Any:
        step()
        return predicate()

    return polling.wait_for(stepped, timeout_s, what)


@contextlib.contextmanager
def stack(work: Path, textfile_dir: Path, rules: Path, vllm_port: int) -> Iterator[Prometheus]:
    """node_exporter (textfile collector only) and Prometheus scraping it and vLLM every second."""
    node_port, prom_port = free_port(), free_port()
    node_argv = [
        NODE_EXPORTER,
        f"--web.listen-address=127.0.0.1:{node_port}",
        "--collector.disable-defaults",
        "--collector.textfile",
        f"--collector.textfile.directory={textfile_dir}",
    ]
    config = work / "prometheus.yml"
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [
                    {"job_name": "node", "static_configs": [{"targets": [f"127.0.0.1:{node_port}"]}]},
                    {"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{vllm_port}"]}]},
                ],
            }
        )
    )
    prom_argv = [
        PROMETHEUS,
        f"--config.file={config}",
        f"--storage.tsdb.path={work / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
        "--storage.tsdb.retention.time=1h",
    ]
    with (
        running(node_argv, f"http://127.0.0.1:{node_port}/metrics", work / "node_exporter.log"),
        running(prom_argv, f"http://127.0.0.1:{prom_port}/-/ready", work / "prometheus.log"),
    ):
        yield Prometheus(f"http://127.0.0.1:{prom_port}")
