"""The textfile's families, its rendering, the /metrics parser's bounds, and the shipped rules and
dashboard reading only names that rocmdoctor or vLLM write."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from harness.promql import dashboard_exprs, metric_names, rules
from rocmdoctor.provision.verify import prometheus
from rocmdoctor.provision.verify.health import engines
from rocmdoctor.rendering.textfile import render, render_failed
from rocmdoctor.vllm.health_metrics import (
    CHECK_STATUSES,
    FAMILIES,
    PROBE_VERDICTS,
    VLLM_SCRAPED,
    EngineHealth,
    GpuMemory,
    HealthRun,
    ServerHealth,
)

# node_exporter's own series about the textfile (collector/textfile.go).
NODE_EXPORTER = {"node_textfile_mtime_seconds", "node_textfile_scrape_error"}


def written_names() -> set[str]:
    out = set()
    for name, (kind, _) in FAMILIES.items():
        out.add(f"{name}_total" if kind == "counter" else name)
    return out


def known_names() -> set[str]:
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    return written_names() | set(VLLM_SCRAPED) | NODE_EXPORTER | recorded


def test_every_dashboard_query_reads_only_names_rocmdoctor_or_vllm_write():
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    read = set().union(*(metric_names(e) for e in exprs))
    assert read - known_names() == set()
    # the fleet view: checks, memory per GPU, throughput, queue and KV cache are all there
    assert {
        "rocmdoctor_check",
        "rocmdoctor_gpu_memory_free_bytes",
        "vllm:generation_tokens_total",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    } <= read


def test_every_rule_reads_only_names_rocmdoctor_or_vllm_write():
    for rule in rules():
        assert metric_names(rule["expr"]) - known_names() == set(), rule.get("alert") or rule.get("record")


def test_metric_name_extraction_drops_functions_labels_and_grouping():
    expr = 'count by (instance) (rate(vllm:x_total{a="b:c"}[1m])) > on (instance) group_left y unless z == 1'
    assert metric_names(expr) == {"vllm:x_total", "y", "z"}


def _run(**kw) -> HealthRun:
    base = dict(
        version="0.1.0",
        finished_at=1_800_000_000.0,
        duration_s=0.05,
        checks=[("kernel.cwsr", "fail"), ("os.distro", "pass")],
        actions={"serve": ["kernel.cwsr"], "install": []},
    )
    return HealthRun(**{**base, **kw})


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_textfile_has_help_and_type_on_every_family_and_no_timestamps():
    text = render(_run())
    for name, (kind, _) in FAMILIES.items():
        exposed = f"{name}_total" if kind == "counter" else name
        assert f"# HELP {exposed} " in text and f"# TYPE {exposed} {kind}" in text, name
    for family in text_string_to_metric_families(text):
        assert all(s.timestamp is None for s in family.samples)


def test_check_status_is_one_hot_and_the_blocking_verdict_names_the_check():
    families = _families(render(_run()))
    cwsr = {
        s.labels["status"]: s.value
        for s in families["rocmdoctor_check"].samples
        if s.labels["check"] == "kernel.cwsr"
    }
    assert cwsr == {status: float(status == "fail") for status in CHECK_STATUSES}
    blocked = {s.labels["action"]: s.value for s in families["rocmdoctor_action_blocked"].samples}
    assert blocked == {"install": 0.0, "serve": 1.0}
    (blocker,) = families["rocmdoctor_action_blocking_check"].samples
    assert blocker.labels == {"action": "serve", "check": "kernel.cwsr"}


def test_gpu_labels_match_the_device_metrics_exporter_and_servers_keep_engines_apart():
    gpu = GpuMemory(3, "0000:0a:00.1", 1, 1, "CPX", 51539607552, 1 << 30, 51539607552, 1 << 30)
    a = EngineHealth("0", "tiny", {"rocmdoctor_server_requests_waiting": 2.0}, {"awake": 1.0})
    b = EngineHealth("1", "tiny", {"rocmdoctor_server_requests_waiting": 5.0}, {"awake": 0.0})
    server = ServerHealth(
        "vllm@1", "http://127.0.0.1:8001", "tiny", True, "failing", engines=[a, b], memory_need={3: 1 << 34}
    )
    families = _families(render(_run(gpus=[gpu], servers=[server])))
    (info,) = families["rocmdoctor_gpu_info"].samples
    assert info.labels == {
        "kfd_node": "3",
        "pci_slot": "0000:0a:00.1",
        "gpu_id": "1",
        "gpu_partition_id": "1",
        "gpu_compute_partition_type": "cpx",
    }
    (free,) = families["rocmdoctor_gpu_memory_free_bytes"].samples
    assert (free.labels, free.value) == ({"gpu_id": "1"}, float(1 << 30))
    waiting = {s.labels["engine"]: s.value for s in families["rocmdoctor_server_requests_waiting"].samples}
    assert waiting == {"0": 2.0, "1": 5.0}  # never summed
    (probe,) = families["rocmdoctor_server_probe"].samples
    assert probe.labels == {"server": "vllm@1", "verdict": "failing"} and "failing" in PROBE_VERDICTS
    (need,) = families["rocmdoctor_server_memory_need_bytes"].samples
    assert (need.labels, need.value) == ({"server": "vllm@1", "gpu_id": "1"}, float(1 << 34))
    sleeping = [
        (s.labels["engine"], s.labels["sleep_state"])
        for s in families["rocmdoctor_server_engine_sleep_state"].samples
    ]
    assert sleeping == [("0", "awake")]  # engine 1 reports no state set
    (served,) = families["rocmdoctor_server_info"].samples
    assert served.labels == {"server": "vllm@1", "url": "http://127.0.0.1:8001", "model_name": "tiny"}


def test_a_failed_run_says_so_in_the_value():
    families = _families(render_failed("0.1.0", 1.0))
    assert families["rocmdoctor_up"].samples[0].value == 0.0


VLLM_DP = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 0.0
# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping.
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="awake"} 1.0
vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="weights_offloaded"} 0.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} 42.0
vllm:generation_tokens_created{engine="0",model_name="tiny"} 1.7e9
# HELP vllm:gpu_cache_usage_perc removed in vLLM 0.12, never read
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="tiny"} 0.5
"""


def test_engines_are_read_per_engine_under_current_names():
    found = engines(prometheus.parse(VLLM_DP))
    assert [(e.engine, e.gauges) for e in found] == [
        ("0", {"rocmdoctor_server_requests_waiting": 3.0}),
        ("1", {"rocmdoctor_server_requests_waiting": 0.0}),
    ]
    assert found[0].sleep_state == {"awake": 1.0, "weights_offloaded": 0.0}
    assert found[0].counters == {"rocmdoctor_server_generation_tokens": 42.0}


@pytest.mark.parametrize(
    "text, message",
    [
        ("x " + "1" * 5000 + "\n", "longer than 4096 bytes"),
        ('x{a="' + "v" * 2000 + '"} 1\n', "label a is longer than 1024"),
        ("x{" + ",".join(f'l{i}="v"' for i in range(130)) + "} 1\n", "more than 128 labels"),
        ("<html>this is not prometheus</html>\n{{{\n", "not the Prometheus text format"),
        ("x 1\n" * (prometheus.MAX_SAMPLES + 1), "more than 100000 samples"),
    ],
)
def test_the_parser_refuses_what_is_past_a_bound_or_not_the_format(text, message):
    with pytest.raises(prometheus.MetricsFormatError, match=message):
        prometheus.parse(text)


def test_plans_kv_usage_is_the_fullest_engine_not_the_sum_of_data_parallel_engines():
    from rocmdoctor.provision.verify.memory import snapshot

    text = "".join(
        f'vllm:{name}{{engine="{e}",model_name="tiny"}} {value}\n'
        for e, usage in (("0", 0.5), ("1", 0.75))
        for name, value in (
            ("kv_cache_usage_perc", usage),
            ("num_requests_running", 2.0),
            ("num_requests_waiting", 1.0),
            ("num_preemptions_total", 0.0),
        )
    )
    snap, _ = snapshot(text, "http://127.0.0.1:8000/metrics")
    assert (snap.usage, snap.running, snap.waiting) == (0.75, 4.0, 2.0)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=400))
def test_the_parser_answers_any_text_with_samples_or_its_own_error(text):
    try:
        found = prometheus.parse(text)
    except prometheus.MetricsFormatError:
        return
    assert all(isinstance(s.value, float) and isinstance(s.labels, dict) for s in found)


@pytest.mark.parametrize("verdict", PROBE_VERDICTS)
def test_each_probe_verdict_is_a_result_row_with_what_to_do(verdict):
    server = ServerHealth(
        "vllm@3", "http://127.0.0.1:8003", "tiny", verdict=verdict, detail="GET /health: 503"
    )
    row = server.row()
    assert row.subject == "vllm@3" and row.id == "server.probe"
    assert row.result.details == {"url": "http://127.0.0.1:8003", "model": "tiny", "verdict": verdict}
    if verdict == "ok":
        assert row.status.value == "pass" and not row.result.remedy
    else:
        # a failed row needs a remedy (model.Result refuses one without); it names this server's unit
        assert row.status.value == "fail" and verdict in row.result.summary
        assert "vllm@3.service" in row.result.remedy or "processes.orphans" in row.result.remedy
