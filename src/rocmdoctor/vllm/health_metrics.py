"""What `check --textfile` exports, as data: the metric families rocmdoctor writes for node_exporter's
textfile collector, the vLLM metrics it reads them from, and the records a run fills in.

The one place these names live: the renderer (`render_textfile`), the server reader
(`provision/server_health`), the shipped alert rules and the Grafana dashboard are all tested
against the tables here.

Label names follow AMD's Device Metrics Exporter where they mean the same thing, so a PromQL join
with its series needs no relabelling (ROCm/device-metrics-exporter docs/configuration/metricslist.md,
"GPU_CLOCK measurements": `gpu_id="0"`, `gpu_partition_id="0"`, `gpu_compute_partition_type="spx"`):
`gpu_id` is the logical GPU's index as ROCm numbers it (the index ROCR_VISIBLE_DEVICES takes; in a
partitioned mode every partition is one), `gpu_partition_id` the partition's index inside its
physical GPU (0 when unpartitioned), `gpu_compute_partition_type` the mode in lower case.
`kfd_node` and `pci_slot` are rocmdoctor's own (the KFD topology node and the PCI address).

Every label of a GPU is written once, in `rocmdoctor_gpu_info`; its values are keyed by `gpu_id`
alone (a PromQL join adds the rest), and a server's by `server` (and `engine`), with its URL and
model in `rocmdoctor_server_info`: a 64-partition node with one instance per partition keeps its
file under 64 KiB (tests/bench/health_textfile.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rocmdoctor.model import Result, Row, Status

# Statuses of a check, each a series of the one-hot `rocmdoctor_check` (model.Status values).
CHECK_STATUSES = ("pass", "warn", "fail", "skip", "error")

# The light probe's verdicts (provision/verify/health.py decides which), one-hot per server.
PROBE_OK = "ok"
PROBE_VERDICTS = (
    PROBE_OK,
    "unreachable",  # nothing accepts a connection on the port
    "timeout",  # connected, no answer in time
    "unhealthy",  # /health is not 200 (an orphan or another program holds the port)
    "failing",  # /health is 200 but a one-token completion fails: the server cannot serve
)

# What to do about each verdict but ok (the server's row's remedy); {unit} is the server's systemd unit.
PROBE_REMEDIES = {
    "unreachable": "nothing listens: `systemctl status {unit}`, then `rocmdoctor explain --unit {unit}`",
    "timeout": "it accepts and does not answer: `rocmdoctor explain --unit {unit}`, then "
    "`systemctl restart {unit}`",
    "unhealthy": "another program or an orphaned engine may hold its port: "
    "`rocmdoctor check --only processes.orphans`",
    "failing": "it cannot serve although /health says 200: `rocmdoctor explain --unit {unit}`, then "
    "`systemctl restart {unit}`",
}

GPU_LABELS = ("gpu_id", "kfd_node", "pci_slot", "gpu_partition_id", "gpu_compute_partition_type")
ENGINE_LABELS = ("server", "engine")

# name -> (type, help). Every family the textfile can hold; HELP and TYPE are written for each.
FAMILIES: dict[str, tuple[str, str]] = {
    "rocmdoctor_up": ("gauge", "1 when the health run completed (0: it failed; see the journal)."),
    "rocmdoctor_build_info": ("gauge", "The rocmdoctor version that wrote this file, as a label."),
    "rocmdoctor_last_run_timestamp_seconds": ("gauge", "When this file was written (Unix time)."),
    "rocmdoctor_run_duration_seconds": ("gauge", "How long the health run took."),
    "rocmdoctor_check": ("gauge", "One series per check and status; 1 on the status the check has."),
    "rocmdoctor_action_blocked": ("gauge", "1 when a blocking check fails for this action."),
    "rocmdoctor_action_blocking_check": ("gauge", "1 for each check that blocks this action."),
    "rocmdoctor_gpu_info": (
        "gauge",
        "One series per GPU (per partition): its KFD node, PCI slot and partition; join on gpu_id.",
    ),
    "rocmdoctor_gpu_vram_total_bytes": ("gauge", "The GPU's VRAM (for an APU: its carve-out)."),
    "rocmdoctor_gpu_gtt_total_bytes": ("gauge", "The GPU's GTT: system memory it can map."),
    "rocmdoctor_gpu_memory_total_bytes": (
        "gauge",
        "The memory pool vLLM sizes from on this GPU (VRAM, or GTT on an APU).",
    ),
    "rocmdoctor_gpu_memory_free_bytes": (
        "gauge",
        "Free memory of that pool now, as vLLM's startup check will see it.",
    ),
    "rocmdoctor_ttm_pages_limit_bytes": (
        "gauge",
        "The TTM limit (ttm.pages_limit x page size): how much RAM all GPUs may map together.",
    ),
    "rocmdoctor_bundle_info": ("gauge", "The active vllm-rocm bundle, as labels."),
    "rocmdoctor_server_info": ("gauge", "One series per managed server: its URL and served model."),
    "rocmdoctor_server_up": ("gauge", "1 when the server's /metrics was read."),
    "rocmdoctor_server_probe": ("gauge", "The light probe's verdict as a label (one series, value 1)."),
    "rocmdoctor_server_memory_need_bytes": (
        "gauge",
        "What the server's next start needs on this GPU (--gpu-memory-utilization x the pool).",
    ),
    "rocmdoctor_server_requests_running": ("gauge", "Requests running on the engine (vLLM)."),
    "rocmdoctor_server_requests_waiting": ("gauge", "Requests waiting on the engine (vLLM)."),
    "rocmdoctor_server_kv_cache_usage_ratio": ("gauge", "KV cache usage of the engine, 0..1 (vLLM)."),
    "rocmdoctor_server_engine_sleep_state": (
        "gauge",
        "The engine's sleep state as a label (vLLM's gauge, the states it sets to non-zero).",
    ),
    "rocmdoctor_server_prompt_tokens": ("counter", "Prompt tokens the engine processed (vLLM)."),
    "rocmdoctor_server_generation_tokens": ("counter", "Tokens the engine generated (vLLM)."),
}

# vLLM metric (exposed name) -> the rocmdoctor family it is copied to, per engine. Current names of
# vLLM 0.32 (vllm/v1/metrics/loggers.py, labels model_name and engine); the removed
# vllm:gpu_cache_usage_perc is not read. Gauges of data-parallel engines are never summed.
VLLM_GAUGES = {
    "vllm:num_requests_running": "rocmdoctor_server_requests_running",
    "vllm:num_requests_waiting": "rocmdoctor_server_requests_waiting",
    "vllm:kv_cache_usage_perc": "rocmdoctor_server_kv_cache_usage_ratio",
}
VLLM_SLEEP_STATE = "vllm:engine_sleep_state"  # labels + sleep_state=awake|weights_offloaded|discard_all
VLLM_COUNTERS = {
    "vllm:prompt_tokens_total": "rocmdoctor_server_prompt_tokens",
    "vllm:generation_tokens_total": "rocmdoctor_server_generation_tokens",
}
# What the dashboard and rules read straight from vLLM's /metrics (Prometheus scrapes it too).
VLLM_SCRAPED = (
    *VLLM_GAUGES,
    VLLM_SLEEP_STATE,
    *VLLM_COUNTERS,
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
)


@dataclass(frozen=True)
class GpuMemory:
    kfd_node: int
    pci_slot: str | None
    gpu_id: int | None
    partition: int  # index inside the physical GPU; 0 when unpartitioned
    compute_partition: str | None  # "SPX", "CPX", ...
    vram_total: int | None
    gtt_total: int | None
    memory_total: int | None
    memory_free: int | None

    def labels(self) -> dict[str, str]:
        return {
            "gpu_id": "" if self.gpu_id is None else str(self.gpu_id),
            "kfd_node": str(self.kfd_node),
            "pci_slot": self.pci_slot or "",
            "gpu_partition_id": str(self.partition),
            "gpu_compute_partition_type": (self.compute_partition or "").lower(),
        }


@dataclass(frozen=True)
class BundleInfo:
    tag: str
    family: str
    digest: str
    qualified: str  # "true", "false" or "unknown"


@dataclass
class EngineHealth:
    engine: str
    model_name: str
    gauges: dict[str, float] = field(default_factory=dict)  # rocmdoctor family -> value
    sleep_state: dict[str, float] = field(default_factory=dict)  # sleep_state label -> value
    counters: dict[str, float] = field(default_factory=dict)  # rocmdoctor family -> value


@dataclass
class ServerHealth:
    server: str  # "vllm" for vllm.service, "vllm@N" for an instance
    url: str
    model: str = ""  # the served model name the unit was written with ("" when it does not say)
    up: bool = False  # /metrics was read
    verdict: str = "unreachable"
    detail: str = ""
    engines: list[EngineHealth] = field(default_factory=list)
    # kfd node -> bytes its next start needs there
    memory_need: dict[int, int] = field(default_factory=dict)

    def row(self) -> Row:
        """The probe's verdict as a result row about this server."""
        details = {"url": self.url, "model": self.model, "verdict": self.verdict}
        if self.verdict == PROBE_OK:
            result = Result(
                Status.PASS, "serves: /health and a one-token completion answered", details=details
            )
        else:
            remedy = PROBE_REMEDIES[self.verdict].format(unit=f"{self.server}.service")
            result = Result(Status.FAIL, f"{self.verdict}: {self.detail or 'no detail'}", remedy, details)
        return Row("server.probe", result, subject=self.server)


@dataclass
class HealthRun:
    """Everything one `check --textfile` run exports."""

    version: str
    finished_at: float
    duration_s: float
    checks: list[tuple[str, str]]  # (check id, status)
    actions: dict[str, list[str]]  # action -> the checks that block it ([] when not blocked)
    gpus: list[GpuMemory] = field(default_factory=list)
    ttm_limit_bytes: int | None = None
    bundle: BundleInfo | None = None
    servers: list[ServerHealth] = field(default_factory=list)
