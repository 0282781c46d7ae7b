"""`rocmdoctor plan`: will this model fit, before the first load; `plan --url`: a running server's memory."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from rocmdoctor import params
from rocmdoctor.commands.common import App, UserError, emit_json, pass_app
from rocmdoctor.commands.model_input import load_model_files, parse_size
from rocmdoctor.commands.option_groups import option_group
from rocmdoctor.model import EXIT_FAILURES, EXIT_OK

if TYPE_CHECKING:
    from rocmdoctor.cluster.layout import Proposal
    from rocmdoctor.provision.server.plan_settings import ServingVersion
    from rocmdoctor.vllm.memory_plan import EngineSettings, Memory, ModelPlan
    from rocmdoctor.vllm.model_files import ModelFiles

# The vLLM versions whose KV-cache rules the plan knows (vllm/plan_versions.py), for --vllm-version.
VLLM_VERSIONS = ("0.19.1", "0.20.1", "0.22.1", "0.25.1", "0.32.0")
# vLLM 0.32 vllm/config/cache.py MambaDType, for --mamba-cache-dtype and --mamba-ssm-cache-dtype.
MAMBA_DTYPES = click.Choice(["auto", "float32", "bfloat16", "float16"])


@dataclass(frozen=True)
class EngineChoice:
    """vLLM's engine options that shape the plan (its `EngineSettings` but the TP and the version)."""

    kv_cache_dtype: str
    block_size: int
    max_num_batched_tokens: int
    pp: int
    async_scheduling: bool
    prefix_caching: bool
    mamba_cache_dtype: str
    mamba_ssm_cache_dtype: str

    def settings(self, tp: int, vllm_version: str) -> EngineSettings:
        from rocmdoctor.vllm.memory_plan import EngineSettings

        return EngineSettings(
            tensor_parallel_size=tp,
            kv_cache_dtype=self.kv_cache_dtype,
            block_size=self.block_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            pipeline_parallel_size=self.pp,
            async_scheduling=self.async_scheduling,
            enable_prefix_caching=self.prefix_caching,
            mamba_cache_dtype=self.mamba_cache_dtype,
            mamba_ssm_cache_dtype=self.mamba_ssm_cache_dtype,
            vllm_version=vllm_version,
        )


def host_memory(app: App, tp: int, utilization: float | None, seen: list[str] | None = None):
    """(Memory, None) from this host's GPUs by the free-memory rule, or (None, why not); the GPU family
    the plan sized from is appended to `seen` (it picks the reviewed bundle's vLLM)."""
    from rocmdoctor.commands.host_pools import pools_from_facts
    from rocmdoctor.provision.server.args import ArgumentError, tensor_parallel_group, utilization_for
    from rocmdoctor.registry import Context, Options
    from rocmdoctor.vllm.memory_plan import Memory

    try:
        pools = pools_from_facts(Context(app.host(), Options()))
    except UserError:
        raise
    except Exception as exc:
        return None, f"this host's GPUs could not be read ({type(exc).__name__}: {exc}); pass --memory"
    if not pools:
        return None, "no AMD GPU found on this host: pass --memory (per GPU) to plan for one"
    try:
        group = tensor_parallel_group(pools, tp)
        if utilization is None:
            utilization, _ = utilization_for(group)
    except ArgumentError as exc:
        return None, f"{exc}; or pass --memory"
    worst = min(group, key=lambda p: p.total or 0)
    if seen is not None:
        seen.append(worst.family)
    if not worst.total:
        return None, f"the memory of {worst.name} cannot be read: pass --memory"
    return Memory(worst.total, utilization, f"host: {worst.name}"), None


def host_family(app: App) -> str | None:
    """The bundle family (or gfx) of this host's first GPU, for the reviewed bundle's vLLM; None without one."""
    from rocmdoctor.commands.host_pools import pools_from_facts
    from rocmdoctor.registry import Context, Options

    try:
        pools = pools_from_facts(Context(app.host(), Options()))
    except Exception:  # the plan's figures do not need the host; the version's source says none was seen
        return None
    return pools[0].family if pools else None


def render(plan) -> None:
    gib = 1 << 30
    out = sys.stdout
    shape = plan.shape

    def line(label: str, value: Any) -> None:
        print(f"  {label:<22} {value}", file=out)

    print(f"{plan.model}: {shape.architecture}, {len(shape.layers)} layers, {shape.dtype}", file=out)
    if plan.weights_bytes is None:
        line("weights", f"unknown ({plan.weights_source})")
    else:
        line("weights", f"{plan.weights_bytes / gib:.2f} GiB ({plan.weights_bytes} B, {plan.weights_source})")
    line(
        "KV per token per GPU",
        f"{plan.kv_bytes_per_token} B at "
        f"{plan.settings.kv_cache_dtype if plan.settings.kv_cache_dtype != 'auto' else shape.dtype}, "
        f"TP {plan.settings.tensor_parallel_size}",
    )
    line("vLLM rules", f"{plan.settings.vllm_version} ({plan.vllm_version_source})")
    for note in shape.notes:
        line("note", note)
    for assumption in plan.assumptions:
        line("assumes", assumption)
    if plan.kv_cache_bytes is None:
        line("host figures", f"none: {plan.memory_null_reason}")
        return
    line(
        "KV cache",
        f"{plan.kv_cache_bytes / gib:.2f} GiB = {plan.kv_cache_tokens} tokens "
        f"({plan.max_concurrency:.2f}x {plan.max_model_len_requested} tokens)",
    )
    line("largest max-model-len", plan.max_model_len)
    line("max-num-seqs", f"{plan.max_num_seqs} (at {plan.typical_len} tokens each)")
    verdict = "FITS" if plan.fits else "DOES NOT FIT"
    print(f"{verdict} at --max-model-len {plan.max_model_len_requested}", file=out)
    for reason in plan.reasons:
        print(f"  - {reason}", file=out)
    for i, remedy in enumerate(plan.remedies, 1):
        print(
            f"  {i}. {remedy.action}: {remedy.flag} -> {remedy.figure}{'' if remedy.fits else ' (still short)'}",
            file=out,
        )


def render_diagnosis(diagnosis) -> None:
    print(
        f"{diagnosis.url}: {diagnosis.verdict} ({diagnosis.samples} samples over {diagnosis.window_s:.0f} s)"
    )
    for finding in diagnosis.findings:
        print(f"  - {finding}")
    for change in diagnosis.changes:
        print(f"  change: {change['flag']}  ({change['why']})")


@click.command()
@click.option(
    "--model", default=None, help="Local model directory or Hugging Face id (cache first, then the Hub)."
)
@click.option("--revision", default="main", show_default=True, help="Hub branch, tag or commit.")
@click.option("--offline", is_flag=True, help="Never ask the Hub: local directory or the HF cache only.")
@click.option(
    "--max-model-len",
    type=params.Count(1, 1 << 30),
    default=None,
    help="Context to plan for (default: the model's).",
)
@click.option(
    "--tensor-parallel-size",
    "tp",
    type=params.Count(1, 1024),
    default=1,
    show_default=True,
    help="GPUs in the group.",
)
@option_group(
    EngineChoice,
    "engine",
    click.option(
        "--kv-cache-dtype",
        default="auto",
        show_default=True,
        type=click.Choice(["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]),
    ),
    click.option(
        "--memory", default=None, metavar="SIZE", help="Memory per GPU (e.g. 96GiB) instead of this host's."
    ),
    click.option(
        "--gpu-memory-utilization",
        "utilization",
        type=params.Fraction(),
        default=None,
        help="Share of --memory vLLM takes (default: vLLM's 0.92; on this host: the free-memory rule).",
    ),
    click.option(
        "--kv-cache-memory",
        default=None,
        metavar="SIZE",
        help="KV cache bytes per GPU, as vLLM's --kv-cache-memory-bytes (weights then do not count).",
    ),
    click.option(
        "--block-size",
        type=params.Count(1, 1 << 16),
        default=16,
        show_default=True,
        help="vLLM's --block-size.",
    ),
    click.option(
        "--max-num-batched-tokens",
        type=params.Count(1, 1 << 30),
        default=2048,
        show_default=True,
        help="vLLM's --max-num-batched-tokens (sizes a sliding window's blocks and the activations).",
    ),
    click.option(
        "--typical-len",
        type=params.Count(1, 1 << 30),
        default=None,
        help="Tokens per sequence --max-num-seqs is sized for.",
    ),
    click.option(
        "--pipeline-parallel-size",
        "pp",
        type=params.Count(1, 1024),
        default=1,
        show_default=True,
        help="vLLM's --pipeline-parallel-size (stages; each GPU holds its stage's layers).",
    ),
    click.option(
        "--async-scheduling/--no-async-scheduling",
        default=True,
        show_default=True,
        help="vLLM's async scheduling: two batches in flight (the GPU default) or one (the CPU engine).",
    ),
    click.option(
        "--enable-prefix-caching/--no-enable-prefix-caching",
        "prefix_caching",
        default=True,
        show_default=True,
        help="vLLM's prefix caching: hybrid models then keep 2-3 state blocks per request, else 1.",
    ),
    click.option(
        "--mamba-cache-dtype",
        default="auto",
        show_default=True,
        type=MAMBA_DTYPES,
        help="vLLM's dtype of the Mamba/linear-attention state (auto: the model's).",
    ),
    click.option(
        "--mamba-ssm-cache-dtype",
        default="auto",
        show_default=True,
        type=MAMBA_DTYPES,
        help="vLLM's dtype of the SSM state alone (auto: as --mamba-cache-dtype).",
    ),
)
@click.option(
    "--nodes",
    "max_nodes",
    type=params.Count(1, 1024),
    default=1,
    show_default=True,
    help="Nodes of these GPUs available: propose the fewest that hold the model (--tensor-parallel-size "
    "within a node, pipeline parallel across), or one replica per node when one holds it (docs/cluster.md).",
)
@click.option(
    "--backend",
    type=click.Choice(["mp", "ray"]),
    default="mp",
    show_default=True,
    help="With --nodes: the distributed backend the proposal uses (as `cluster unit --backend`).",
)
@click.option(
    "--vllm-version",
    type=click.Choice(VLLM_VERSIONS),
    default=None,
    help="The vLLM that will serve, whose KV-cache rules the plan uses (default: the installed bundle's, "
    "else the reviewed bundle's for this host's GPU, else the newest; docs/plan.md).",
)
@params.prefix_option("Where the bundle is installed: its own vLLM version picks the plan's rules.")
@click.option("--url", default=None, help="Diagnose the running vLLM server at this URL from its /metrics.")
@click.option(
    "--window",
    "window_s",
    type=float,
    default=10.0,
    show_default=True,
    help="With --url: seconds to sample /metrics.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
@pass_app
def plan(
    app: App,
    model: str | None,
    revision: str,
    offline: bool,
    max_model_len: int | None,
    tp: int,
    memory: str | None,
    utilization: float | None,
    kv_cache_memory: str | None,
    typical_len: int | None,
    max_nodes: int,
    backend: str,
    vllm_version: str | None,
    prefix: str,
    url: str | None,
    window_s: float,
    as_json: bool,
    engine: EngineChoice,
) -> None:
    """Will MODEL fit? Weights, KV cache, the longest context and the concurrency, before the first load.

    Exit 0 when it fits (or nothing host-dependent could be judged), 1 when it does not, 2 on bad input.
    With --url, read a running server's /metrics and say what to change.
    """

    if url:
        diagnose_running(url, window_s, as_json)
    if not model:
        raise UserError("pass --model DIR|HF_ID to plan a model, or --url URL to diagnose a running server")
    from rocmdoctor.provision.server.plan_settings import serving_version

    files = load_model_files(model, revision, offline)
    seen: list[str] = []
    budget, null_reason = memory_budget(app, tp, memory, utilization, kv_cache_memory, seen)
    family = seen[0] if seen else None if vllm_version else host_family(app)
    version = serving_version(app.host(), str(prefix), vllm_version, family)
    settings = engine.settings(tp, version.version)
    result = plan_files(files, (budget, null_reason), settings, version, max_model_len, typical_len, model)

    def fits(tp_: int, pp_: int) -> bool | None:
        return across_nodes(files, budget, settings, tp_, pp_, max_model_len, typical_len, model)

    proposal, hint = node_layouts(fits, budget, result.fits, tp, max_nodes, backend)
    if as_json:
        doc = {**result.to_json(), "cluster": proposal.to_json() if proposal else None}
        emit_json({**doc, "across_nodes": hint})
    else:
        render(result)
        render_nodes(proposal, hint, result.fits, tp, max_nodes)
    sys.exit(EXIT_FAILURES if result.fits is False and proposal is None else EXIT_OK)


def plan_files(
    files: ModelFiles,
    memory: tuple[Memory | None, str | None],
    settings: EngineSettings,
    version: ServingVersion,
    max_model_len: int | None,
    typical_len: int | None,
    model: str,
) -> ModelPlan:
    """The plan of the model's files on `memory` (the budget, why it is unknown) for the serving vLLM."""
    from rocmdoctor.vllm.memory_plan import ConfigError, plan_from_files
    from rocmdoctor.vllm.plan_versions import shown

    budget, null_reason = memory
    try:
        result = plan_from_files(
            files,
            budget,
            settings=settings,
            max_model_len=max_model_len,
            typical_len=typical_len,
            memory_null_reason=null_reason,
            model=model,
        )
    except ConfigError as exc:
        raise UserError(
            f"{files.location}: {exc} (vLLM {shown(version.version)}: {version.source})"
        ) from None
    result.vllm_version_source = version.source
    return result


def diagnose_running(url: str, window_s: float, as_json: bool) -> None:
    """--url: a running server's /metrics, what to change; exits (1: it is preempting)."""
    from rocmdoctor.provision.verify.memory import MetricsError, diagnose_url

    try:
        diagnosis = diagnose_url(url, window_s)
    except MetricsError as exc:
        raise UserError(str(exc)) from None
    emit_json(diagnosis.to_json()) if as_json else render_diagnosis(diagnosis)
    sys.exit(EXIT_FAILURES if diagnosis.verdict == "preempting" else EXIT_OK)


def memory_budget(
    app: App,
    tp: int,
    memory: str | None,
    utilization: float | None,
    kv_cache_memory: str | None,
    seen: list[str],
) -> tuple[Memory | None, str | None]:
    """(the memory the plan has per GPU, why it is unknown): --kv-cache-memory, --memory, else this host's."""
    from rocmdoctor.vllm.memory_plan import DEFAULT_GPU_MEMORY_UTILIZATION, Memory

    if kv_cache_memory is not None:
        return Memory(0, 1.0, "--kv-cache-memory", parse_size(kv_cache_memory, "--kv-cache-memory")), None
    if memory is not None:
        share = utilization or DEFAULT_GPU_MEMORY_UTILIZATION
        return Memory(parse_size(memory, "--memory"), share, "--memory"), None
    return host_memory(app, tp, utilization, seen)


def node_layouts(
    fits: Callable[[int, int], bool | None],
    budget: Memory | None,
    fits_one: bool | None,
    tp: int,
    max_nodes: int,
    backend: str,
) -> tuple[Proposal | None, dict | None]:
    """(the layout across --nodes, the fewest nodes that would hold a plan that does not fit one)."""
    from rocmdoctor.cluster.layout import propose

    proposal = propose(fits, tp, max_nodes, backend) if max_nodes > 1 else None
    hint = nodes_hint(fits, budget, tp) if max_nodes == 1 and fits_one is False else None
    return proposal, hint


def render_nodes(
    proposal: Proposal | None, hint: dict | None, fits: bool | None, tp: int, max_nodes: int
) -> None:
    if proposal:
        click.echo(f"across nodes: {proposal.nodes} nodes; {proposal.why} (rocmdoctor cluster unit)")
    elif max_nodes > 1 and fits is False:  # not even --nodes of them
        click.echo(f"across nodes: does not fit {max_nodes} nodes of {tp} GPU(s) either")
    elif hint and hint["nodes"]:
        click.echo(
            f"across nodes: fits {hint['nodes']} nodes of {tp} GPU(s) (tensor parallel {tp} within each, "
            f"pipeline parallel {hint['nodes']} across them): pass --nodes {hint['nodes']} for the layout"
        )
    elif hint:
        click.echo(f"across nodes: does not fit {hint['searched']} nodes of {tp} GPU(s) either")


# Without --nodes a plan that does not fit one node still says how many nodes would hold it, up to this many.
NODES_SEARCHED = 8


def nodes_hint(fits: Callable[[int, int], bool | None], budget: Memory | None, tp: int) -> dict | None:
    """The fewest nodes of `tp` GPUs (pipeline parallel across them, up to NODES_SEARCHED) on which the
    plan fits (`fits(tp, pp)`: the plan's verdict so), as `--nodes` would propose; None when the
    weights' size or the memory is unknown."""
    from rocmdoctor.cluster.layout import propose

    if budget is None or fits(tp, 2) is None:
        return None
    proposal = propose(fits, tp, NODES_SEARCHED, "mp")
    nodes = proposal.nodes if proposal and proposal.layout != "data" else None
    return {
        "nodes": nodes,
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": nodes,
        "searched": NODES_SEARCHED,
    }


def across_nodes(files, budget, settings, tp: int, pp: int, max_model_len, typical_len, model) -> bool | None:
    """The plan's verdict with TP `tp` in each node and PP `pp` across nodes: each GPU holds its
    stage's share of the weights (1/pp of them, split TP ways)."""
    import dataclasses

    from rocmdoctor.vllm.memory_plan import plan_model, weights_from_headers

    weights = None if files.weights_note else weights_from_headers(files.headers)
    return plan_model(
        model,
        files.config,
        None if weights is None else math.ceil(weights / pp),
        budget,
        settings=dataclasses.replace(settings, tensor_parallel_size=tp, pipeline_parallel_size=pp),
        max_model_len=max_model_len,
        typical_len=typical_len,
    ).fits
