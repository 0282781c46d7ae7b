"""A health run (`health_metrics.HealthRun`) as Prometheus text for node_exporter's textfile collector.

Pure: data in, text out, written by prometheus_client's exposition code. No sample carries a
timestamp (the collector skips a whole file that has one, node_exporter collector/textfile.go), and
every family has HELP and TYPE (a missing HELP becomes "Metric read from <path>").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rocmdoctor.vllm.health_metrics import (
    CHECK_STATUSES,
    ENGINE_LABELS,
    FAMILIES,
    GPU_LABELS,
    PROBE_VERDICTS,
    HealthRun,
)


def _label(value: Any) -> str:
    """A label value the file can hold: a lone surrogate (a file name of bytes that are not UTF-8, read
    through surrogateescape) becomes its \\udcXX escape instead of failing the whole file's encoding;
    prometheus_client escapes backslash, quote and newline."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


class _Families:
    """Samples gathered per family, then emitted as prometheus_client metric families."""

    def __init__(self) -> None:
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = {name: [] for name in FAMILIES}

    def add(self, name: str, value: float, **labels: Any) -> None:
        self.samples[name].append(({k: _label(v) for k, v in labels.items()}, float(value)))

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for name, (kind, help_text) in FAMILIES.items():
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, help_text)
            for labels, value in self.samples[name]:
                family.add_sample(f"{name}_total" if kind == "counter" else name, labels, value)
            yield family


def _gpus(out: _Families, run: HealthRun) -> None:
    # The labels once per GPU in the info series; the values keyed by gpu_id alone (a join adds the
    # rest), which keeps a 64-partition node's file small.
    for gpu in run.gpus:
        labels = gpu.labels()
        assert tuple(labels) == GPU_LABELS
        out.add("rocmdoctor_gpu_info", 1, **labels)
        for name, value in (
            ("rocmdoctor_gpu_vram_total_bytes", gpu.vram_total),
            ("rocmdoctor_gpu_gtt_total_bytes", gpu.gtt_total),
            ("rocmdoctor_gpu_memory_total_bytes", gpu.memory_total),
            ("rocmdoctor_gpu_memory_free_bytes", gpu.memory_free),
        ):
            if value is not None:
                out.add(name, value, gpu_id=labels["gpu_id"])
    if run.ttm_limit_bytes is not None:
        out.add("rocmdoctor_ttm_pages_limit_bytes", run.ttm_limit_bytes)


def _servers(out: _Families, run: HealthRun) -> None:
    gpu_ids = {gpu.kfd_node: gpu.labels()["gpu_id"] for gpu in run.gpus}
    for server in run.servers:
        assert server.verdict in PROBE_VERDICTS, server.verdict
        models = sorted({e.model_name for e in server.engines if e.model_name})
        out.add(
            "rocmdoctor_server_info", 1, server=server.server, url=server.url, model_name=",".join(models)
        )
        out.add("rocmdoctor_server_up", int(server.up), server=server.server)
        out.add("rocmdoctor_server_probe", 1, server=server.server, verdict=server.verdict)
        for node, need in sorted(server.memory_need.items()):
            out.add(
                "rocmdoctor_server_memory_need_bytes",
                need,
                server=server.server,
                gpu_id=gpu_ids.get(node, ""),
            )
        for engine in server.engines:
            labels = dict(zip(ENGINE_LABELS, (server.server, engine.engine), strict=True))
            for name, value in {**engine.gauges, **engine.counters}.items():
                out.add(name, value, **labels)
            for state, value in sorted(engine.sleep_state.items()):
                if value:  # vLLM sets the engine's state to 1 and the others to 0
                    out.add("rocmdoctor_server_engine_sleep_state", value, **labels, sleep_state=state)


def families(run: HealthRun) -> _Families:
    out = _Families()
    out.add("rocmdoctor_up", 1)
    out.add("rocmdoctor_build_info", 1, version=run.version)
    out.add("rocmdoctor_last_run_timestamp_seconds", round(run.finished_at, 3))
    out.add("rocmdoctor_run_duration_seconds", round(run.duration_s, 6))
    for check, status in run.checks:
        for each in CHECK_STATUSES:
            out.add("rocmdoctor_check", int(each == status), check=check, status=each)
    for action, blocking in sorted(run.actions.items()):
        out.add("rocmdoctor_action_blocked", int(bool(blocking)), action=action)
        for check in blocking:
            out.add("rocmdoctor_action_blocking_check", 1, action=action, check=check)
    _gpus(out, run)
    if run.bundle is not None:
        b = run.bundle
        out.add(
            "rocmdoctor_bundle_info", 1, tag=b.tag, family=b.family, digest=b.digest, qualified=b.qualified
        )
    _servers(out, run)
    return out


def _text(collected: _Families) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collected)
    return generate_latest(registry).decode()


def render(run: HealthRun) -> str:
    return _text(families(run))


def render_failed(version: str, finished_at: float) -> str:
    """The file a run that could not diagnose writes: `rocmdoctor_up 0` fires the alert on the value,
    not only once the file has gone stale."""
    out = _Families()
    out.add("rocmdoctor_up", 0)
    out.add("rocmdoctor_build_info", 1, version=version)
    out.add("rocmdoctor_last_run_timestamp_seconds", round(finished_at, 3))
    return _text(out)
