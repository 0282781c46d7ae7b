"""The health of each server rocmdoctor manages: its /metrics per engine and a light probe.

The servers are the ones the unit commands wrote: `vllm.service` (its readiness gate names the URL
and the model) and each `vllm@N` instance (its env file names the port, the GPUs and the
--gpu-memory-utilization). The probe is what a user would try: GET /health, then a one-token
completion, because a /health that says 200 while every request fails is a known failure of vLLM
(vllm PR #21443). Every request is bounded by a timeout and a body cap; plain http.client keeps a
run of the timer cheap (no event loop, no session objects).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from rocmdoctor.documents import load_value
from rocmdoctor.host_writes import HostWriter, WriteRefused
from rocmdoctor.provision.server import instances as server_instances
from rocmdoctor.provision.server.layout import Device, rocr_indices
from rocmdoctor.provision.server.unit import ENV_FILE, UNIT_DIR, UNIT_NAME
from rocmdoctor.textnum import parse_decimal
from rocmdoctor.vllm.health_metrics import (
    PROBE_OK,
    VLLM_COUNTERS,
    VLLM_GAUGES,
    VLLM_SLEEP_STATE,
    EngineHealth,
    ServerHealth,
)

if TYPE_CHECKING:
    from rocmdoctor.provision.verify import prometheus

PROBE_TIMEOUT_S = 5.0
UNIT_LIMIT = 1 << 20
PROBE_PROMPT = "Hello"


@dataclass(frozen=True)
class Managed:
    """A server the unit commands wrote, as far as the written files say."""

    server: str
    url: str
    model: str | None
    api_key: str | None
    gpu_memory_utilization: float | None
    devices: tuple[int, ...] | None  # ROCR_VISIBLE_DEVICES indices; None: not pinned
    tensor_parallel_size: int = 1


def _directive(text: str, key: str) -> list[str]:
    """The words of the last `key=` line of a unit (systemd's own quoting, as systemd_quote writes it)."""
    words: list[str] = []
    for line in text.splitlines():
        if line.startswith(f"{key}="):
            try:
                words = shlex.split(line[len(key) + 1 :])
            except ValueError:
                words = []
    return words


def _option(argv: list[str], *names: str) -> str | None:
    for i, word in enumerate(argv):
        for name in names:
            if word == name and i + 1 < len(argv):
                return argv[i + 1]
            if word.startswith(f"{name}="):
                return word.split("=", 1)[1]
    return None


def _float(value: str | None) -> float | None:
    try:
        number = float(value) if value is not None else None
    except ValueError:
        return None
    return number if number is not None and 0 < number <= 1 else None


def _indices(value: str | None) -> tuple[int, ...] | None:
    if not value:
        return None
    parts = value.split(",")
    numbers = [parse_decimal(p.strip()) for p in parts]
    return tuple(n for n in numbers if n is not None) if None not in numbers else None


def _read(writer: HostWriter, path: str) -> str | None:
    try:
        raw = writer.read_current(path, UNIT_LIMIT)
    except WriteRefused:
        return None
    return raw.decode("utf-8", "replace") if raw is not None else None


def _single(writer: HostWriter, unit_dir: str) -> Managed | None:
    text = _read(writer, f"{unit_dir}/{UNIT_NAME}")
    if text is None:
        return None
    gate = _directive(text, "ExecStartPost")  # python wait-ready URL MODEL TIMEOUT
    if len(gate) < 4 or not gate[2].startswith(("http://", "https://")):
        return None
    argv = _directive(text, "ExecStart")
    env = dict(w.split("=", 1) for w in _directive(text, "Environment") if "=" in w)
    secrets = server_instances.parse_env(_read(writer, ENV_FILE) or "")
    tp = _option(argv, "--tensor-parallel-size", "-tp")
    return Managed(
        server=UNIT_NAME.removesuffix(".service"),
        url=gate[2],
        model=gate[3],
        api_key=secrets.get("VLLM_API_KEY") or None,
        gpu_memory_utilization=_float(_option(argv, "--gpu-memory-utilization")),
        devices=_indices(env.get(server_instances.DEVICES_VAR)),
        tensor_parallel_size=int(tp) if tp and tp.isdigit() else 1,
    )


def _instances(writer: HostWriter, unit_dir: str) -> list[Managed]:
    written = server_instances.current_instances(writer)
    base = server_instances.written_base_url(writer, unit_dir)
    if not written or base is None:
        return []
    template = _read(writer, f"{unit_dir}/{server_instances.TEMPLATE_NAME}") or ""
    gate = _directive(template, "ExecStartPost")
    model = gate[3] if len(gate) >= 4 else None
    out = []
    for name in sorted(written, key=int):
        env = written[name]
        port = env.get(server_instances.PORT_VAR, "")
        if not port.isdigit() or not 0 < int(port) < 65536:
            continue
        tp = env.get(server_instances.TP_VAR, "1")
        out.append(
            Managed(
                server=f"vllm@{name}",
                url=f"{base}:{port}",
                model=model,
                api_key=env.get("VLLM_API_KEY") or None,
                gpu_memory_utilization=_float(env.get(server_instances.UTIL_VAR)),
                devices=_indices(env.get(server_instances.DEVICES_VAR)),
                tensor_parallel_size=int(tp) if tp.isdigit() else 1,
            )
        )
    return out


def managed_servers(writer: HostWriter, unit_dir: str = UNIT_DIR) -> list[Managed]:
    """vllm.service (when written) and every written instance."""
    single = _single(writer, unit_dir)
    return ([single] if single else []) + _instances(writer, unit_dir)


def memory_need(server: Managed, devices: Sequence[Device]) -> dict[int, int]:
    """KFD node -> the bytes the server's next start asks for there (vLLM's startup rule: its
    --gpu-memory-utilization of the pool must be free)."""
    if server.gpu_memory_utilization is None:
        return {}
    gpus = [d for d in devices if d.memory_total]
    by_index = {index: node for node, index in rocr_indices(gpus).items()}
    chosen = (
        [by_index[i] for i in server.devices if i in by_index]
        if server.devices is not None
        else [d.kfd_node for d in gpus[: server.tensor_parallel_size]]
    )
    totals = {d.kfd_node: d.memory_total or 0 for d in gpus}
    return {node: int(server.gpu_memory_utilization * totals[node]) for node in chosen}


class _Answer(Exception):
    def __init__(self, verdict: str, detail: str) -> None:
        super().__init__(detail)
        self.verdict = verdict


def _request(
    url: str, method: str, path: str, cap: int, api_key: str | None = None, body: dict | None = None
) -> tuple[int, bytes]:
    """One exchange through the one HTTP client: a total deadline over connect, the status line, each
    header and the body (a server that drips any of them is a timeout), at most cap + 1 bytes read."""
    from rocmdoctor.provision import bounded_http

    parts = urlsplit(url)
    headers = {"Accept-Encoding": "identity"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        answer = bounded_http.request(
            method,
            f"{parts.scheme}://{parts.netloc}{path}",
            deadline=bounded_http.Deadline(PROBE_TIMEOUT_S),
            limit=cap,
            headers=headers,
            json_body=body,
            connect_s=PROBE_TIMEOUT_S,
            read_s=PROBE_TIMEOUT_S,
        )
    except bounded_http.HttpUnreachable:
        raise _Answer("unreachable", f"{url}: nothing accepts connections") from None
    except (bounded_http.HttpTimeout, bounded_http.HttpNoAnswer):
        raise _Answer("timeout", f"{method} {path}: no answer in {PROBE_TIMEOUT_S:.0f} s") from None
    except bounded_http.HttpError as exc:
        raise _Answer("unreachable", f"{method} {path}: {exc}") from None
    if len(answer.body) > cap:
        raise _Answer("unhealthy", f"{method} {path}: the answer is larger than {cap} bytes")
    return answer.status, answer.body


def engines(samples: list[prometheus.Sample]) -> list[EngineHealth]:
    """One record per (engine, model_name) label pair vLLM writes: a data-parallel server's engines
    stay apart (their gauges are never summed)."""
    found: dict[tuple[str, str], EngineHealth] = {}

    def engine_of(sample: prometheus.Sample) -> EngineHealth:
        key = (sample.labels.get("engine", ""), sample.labels.get("model_name", ""))
        return found.setdefault(key, EngineHealth(*key))

    for sample in samples:
        if sample.name in VLLM_GAUGES:
            engine_of(sample).gauges[VLLM_GAUGES[sample.name]] = sample.value
        elif sample.name in VLLM_COUNTERS:
            engine_of(sample).counters[VLLM_COUNTERS[sample.name]] = sample.value
        elif sample.name == VLLM_SLEEP_STATE and "sleep_state" in sample.labels:
            engine_of(sample).sleep_state[sample.labels["sleep_state"]] = sample.value
    return [found[key] for key in sorted(found)]


def _probe(server: Managed, health: ServerHealth) -> None:
    from rocmdoctor.provision.verify import openai_schema as schema
    from rocmdoctor.provision.verify import prometheus

    status, _ = _request(server.url, "GET", "/health", schema.HEALTH_BYTES)
    if status != 200:
        raise _Answer("unhealthy", f"GET /health answered HTTP {status}: another program, or a broken server")
    status, body = _request(server.url, "GET", "/metrics", schema.METRICS_BYTES)
    if status == 200:
        try:
            health.engines = engines(prometheus.parse(body.decode("utf-8", "replace")))
            health.up = bool(health.engines)
        except prometheus.MetricsFormatError as exc:
            health.detail = f"/metrics: {exc}"
    model = server.model
    if model is None:
        status, body = _request(server.url, "GET", "/v1/models", schema.MODELS_BYTES, server.api_key)
        try:
            names = (
                schema.models("/v1/models", load_value(body, "/v1/models", schema.MODELS_BYTES))
                if status == 200
                else []
            )
        except (ValueError, schema.ShapeError):
            names = []
        if not names:
            raise _Answer("failing", f"GET /v1/models answered HTTP {status} without a model")
        model = names[0]
    request = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0}
    status, body = _request(
        server.url, "POST", "/v1/completions", schema.completion_bytes(1), server.api_key, request
    )
    if status != 200:
        raise _Answer("failing", f"a one-token completion answered HTTP {status}: {body[:200]!r}")
    try:
        schema.completion("/v1/completions", load_value(body, "/v1/completions", len(body)), False, 1)
    except (ValueError, schema.ShapeError) as exc:
        raise _Answer("failing", f"a one-token completion came back malformed: {exc}") from None


def probe(server: Managed, devices: Sequence[Device] = ()) -> ServerHealth:
    """The server's health now; never raises for anything the server does."""
    health = ServerHealth(
        server.server, server.url, server.model or "", memory_need=memory_need(server, devices)
    )
    try:
        _probe(server, health)
        health.verdict = PROBE_OK
    except _Answer as answer:
        health.verdict, health.detail = answer.verdict, str(answer)
    return health
