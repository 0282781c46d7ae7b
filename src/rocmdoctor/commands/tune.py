"""`rocmdoctor tune`: the --max-num-seqs (and --max-num-batched-tokens) that maximise throughput under a
latency limit, measured by restarting the server, and written back as a drop-in of its unit."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rocmdoctor import params
from rocmdoctor.commands.common import App, UserError, emit_json, pass_app, write_root
from rocmdoctor.commands.option_groups import option_group
from rocmdoctor.commands.server_options import ServerOptions, server_group, server_option
from rocmdoctor.report import strict

if TYPE_CHECKING:
    from rocmdoctor.provision.server.args import ServerArgs
    from rocmdoctor.provision.server.serve import Server
    from rocmdoctor.provision.tune.search import Choice, Slo
    from rocmdoctor.provision.tune.session import Trial
    from rocmdoctor.provision.tune.workload import Workload

STATE_LIMIT = 16 << 20
WORKLOAD_LIMIT = 64 << 20


def _events(as_json: bool):
    """Progress on stderr (one JSON object a line with --json)."""

    def emit(phase: str, **data: Any) -> None:
        if as_json:
            sys.stderr.write(json.dumps(strict({"event": phase, **data}), allow_nan=False) + "\n")
        else:
            detail = data.get("setting")
            label = (
                f" max-num-seqs {detail['max_num_seqs']}"
                + (
                    f", max-num-batched-tokens {detail['max_num_batched_tokens']}"
                    if detail.get("max_num_batched_tokens")
                    else ""
                )
                if isinstance(detail, dict)
                else ""
            )
            problem = f": {data['problem']}" if "problem" in data else ""
            sys.stderr.write(f"tune: {phase}{label}{problem}\n")
        sys.stderr.flush()

    return emit


def read_bounded(path: Path, limit: int, what: str) -> bytes | None:
    """A file handed to tune (regular files only, at most `limit` bytes); None when it does not exist."""
    from rocmdoctor.rootfs import read_regular

    try:
        return read_regular(path, limit)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"{what} {path}: {exc.strerror or exc}") from None


def _host_identity(app: App) -> str:
    read = app.host().read_text("/etc/machine-id", 256)
    return read.value.strip() if read.ok and read.value.strip() else os.uname().nodename


def _plan(app: App, args: ServerArgs, server: ServerOptions, kv_cache_memory: str | None, typical_len: int):
    """The model's memory plan: the GPU's (from the server's arguments) or one for --kv-cache-memory."""
    from rocmdoctor.commands.model_input import load_model_files, parse_size
    from rocmdoctor.provision.server.plan_settings import engine_settings, serving_version
    from rocmdoctor.provision.tune import session
    from rocmdoctor.vllm.memory_plan import EngineSettings, Memory

    if kv_cache_memory is None and args.plan is None:
        why = "; ".join(n for n in args.notes if "plan" in n) or "no GPU memory to plan with"
        raise UserError(
            f"no memory plan for the model ({why}), so whether it fits is unknown; on a host without an "
            "AMD GPU pass --kv-cache-memory SIZE (the KV cache the server gets, e.g. VLLM_CPU_KVCACHE_SPACE "
            "for vLLM on the CPU)"
        )
    files = load_model_files(server.model, "main", True)
    if kv_cache_memory is not None:
        memory = Memory(0, 1.0, "--kv-cache-memory", parse_size(kv_cache_memory, "--kv-cache-memory"))
    else:
        memory = args.plan.memory
    version = serving_version(app.host(), server.prefix)  # the bundle the trials run
    settings = engine_settings(
        EngineSettings(tensor_parallel_size=server.tensor_parallel_size or 1, vllm_version=version.version),
        args.extra,
    )
    max_len = args.value("--max-model-len")
    try:
        return session.fitting_plan(
            files, memory, settings, int(max_len) if max_len else None, typical_len, server.model
        )
    except session.Unfit as exc:
        raise UserError(str(exc)) from None


def _gmu_within_rule(app: App, args: ServerArgs) -> None:
    """A --gpu-memory-utilization above the free-memory rule on a known GPU is refused: tune starts the
    server many times, and on a unified-memory APU one start over the rule can take the host down."""
    from rocmdoctor.commands.host_pools import pools_from_facts
    from rocmdoctor.registry import Context, Options
    from rocmdoctor.vllm.memory_rule import recommended

    value = args.value("--gpu-memory-utilization")
    if value is None:
        return
    for pool in pools_from_facts(Context(app.host(), Options())):
        if pool.total and pool.free is not None and float(value) > recommended(pool.total, pool.free):
            raise UserError(
                f"--gpu-memory-utilization {value} is above what {pool.name} passes now "
                f"({recommended(pool.total, pool.free):.2f}: vLLM's free-memory rule with 1 GiB margin); "
                "leave it out and tune uses the rule's value"
            )


@dataclass(frozen=True)
class SearchOptions:
    """What tune searches and how it measures each setting."""

    seqs_spec: str
    batched_list: str | None
    search_kind: str
    slo: str | None
    workload: Path | None
    prompt_tokens: int | None
    output_tokens: int | None
    requests: int
    min_seconds: float
    seed: int
    kv_cache_memory: str | None
    start_timeout_s: float
    timeout_s: float
    confirm_times: int
    margin: float


@dataclass(frozen=True)
class Destination:
    """Where the winner goes: nowhere, a unit's drop-in (--write/--check) or a Lemonade model."""

    write: bool
    check_only: bool
    target: Path | None
    instance: str | None
    lemonade_model: str | None
    lemonade_url: str | None
    lemonade_key_file: Path | None


@dataclass(frozen=True)
class RunFiles:
    state_file: Path | None
    plan_only: bool
    plot: Path | None
    log_dir: Path | None


search_options = option_group(
    SearchOptions,
    "search",
    click.option(
        "--seqs",
        "seqs_spec",
        default="1:auto",
        show_default=True,
        help="--max-num-seqs values to search: LOW:HIGH (HIGH auto: what the KV cache holds) or a list 1,2,4,8.",
    ),
    click.option(
        "--batched-tokens",
        "batched_list",
        type=params.CountList(1, 1 << 22, 16),
        default=None,
        help="--max-num-batched-tokens values to search too (comma-separated); default: vLLM's, not searched.",
    ),
    click.option(
        "--search",
        "search_kind",
        type=click.Choice(["adaptive", "exhaustive"]),
        default="adaptive",
        show_default=True,
        help="exhaustive: measure every point of the grid (vLLM's `bench sweep`), to compare with.",
    ),
    click.option(
        "--slo",
        type=params.NonEmptyText("METRIC:pPCT<=LIMIT (ttft:p95<=2s)"),
        default=None,
        help="Latency limit: METRIC:pPCT<=LIMIT, e.g. ttft:p95<=2s, itl:p99<=50ms.",
    ),
    click.option(
        "--workload",
        type=params.NonEmptyPath(dir_okay=False, path_type=Path),
        default=None,
        help='JSONL, one {"prompt": ..., "output_tokens": N} a line (default: synthetic prompts).',
    ),
    click.option(
        "--prompt-tokens", type=params.Count(1, 1 << 20), default=None, help="Synthetic prompt length."
    ),
    click.option(
        "--output-tokens", type=params.Count(1, 1 << 16), default=None, help="Synthetic output length."
    ),
    click.option(
        "--requests",
        type=params.Count(1, 10_000),
        default=16,
        show_default=True,
        help="Requests measured per setting (at least 4 x max-num-seqs).",
    ),  # fmt: skip
    click.option(
        "--min-seconds",
        type=params.Duration(max_s=3600, min_s=0.0, inclusive=True),
        default=10.0,
        show_default=True,
        help="Measure each setting at least this long (more batches of --requests): steadier on a busy host.",
    ),
    click.option(
        "--seed", type=params.Count(0, 1 << 30), default=0, show_default=True, help="Workload order."
    ),
    click.option(
        "--kv-cache-memory",
        default=None,
        help="Plan with this KV cache size (e.g. 1GiB) where there is no GPU to plan from.",
    ),
    click.option(
        "--start-timeout",
        "start_timeout_s",
        type=params.Duration(),
        default=900,
        show_default=True,
        help="Seconds each server start may take to become ready (a cold FP8 load on gfx1151 takes ~12 min).",
    ),
    click.option(
        "--timeout",
        "timeout_s",
        type=params.Duration(),
        default=120,
        show_default=True,
        help="Seconds one request may take.",
    ),  # fmt: skip
    click.option(
        "--confirm",
        "confirm_times",
        type=params.Count(0, 10),
        default=2,
        show_default=True,
        help="Under --slo: measure the winner this many more times; each must meet the limit (0: trust one).",
    ),
    click.option(
        "--margin",
        type=click.FloatRange(0.0, 0.5),
        default=0.1,
        show_default=True,
        help="Under --slo: the share of the limit a winner must keep to spare when first measured.",
    ),
)
destination_options = option_group(
    Destination,
    "dest",
    click.option("--write", is_flag=True, help="Write the winner as a drop-in of the server's unit."),
    server_option(
        "check", help="Show the drop-in --write would write (diff), write nothing (state file included)."
    ),
    server_option("target"),
    click.option(
        "--instance", default=None, help="Write into vllm@N's drop-in (instances) instead of vllm.service."
    ),
    click.option(
        "--lemonade-model",
        default=None,
        metavar="ID",
        help="Write into this Lemonade model's saved options (its vllm_args) instead of a unit.",
    ),
    click.option(
        "--lemonade-url",
        default=None,
        envvar="ROCMDOCTOR_LEMONADE_URL",
        help="Lemonade Server (default: the port in its config.json, else 13305 on loopback).",
    ),
    click.option(
        "--lemonade-key-file",
        type=params.NonEmptyPath(path_type=Path, dir_okay=False),
        callback=params.key_file(),
        default=None,
        help="File holding LEMONADE_ADMIN_API_KEY (default: that variable, then LEMONADE_API_KEY).",
    ),
)
file_options = option_group(
    RunFiles,
    "files",
    click.option(
        "--state-file",
        type=params.NonEmptyPath(dir_okay=False, path_type=Path),
        default=None,
        help="Known points [default: ~/.cache/rocmdoctor/tune-state.json].",
    ),  # fmt: skip
    click.option(
        "--plan-only", is_flag=True, help="Show the plan (server arguments, what is searched) and stop."
    ),
    click.option(
        "--plot",
        type=params.NonEmptyPath(path_type=Path, dir_okay=False),
        default=None,
        help="Write throughput and latency against max-num-seqs to FILE.png or FILE.svg.",
    ),
    click.option(
        "--log-dir",
        type=params.NonEmptyPath(file_okay=False, path_type=Path),
        default=None,
        help="Server logs [default: ~/.cache/rocmdoctor/tune].",
    ),  # fmt: skip
)


@click.command(cls=params.VllmPassThrough)
@server_group(
    server_option("model", required=True),
    "served_model_name",
    "host",
    "port",
    "gpu_memory_utilization",
    "max_model_len",
    "tensor_parallel_size",
    "gpu",
    "api_key_file",
    "vllm_args",
    "prefix",
    "json",
)
@search_options
@destination_options
@file_options
@pass_app
def tune(app: App, server: ServerOptions, search: SearchOptions, dest: Destination, files: RunFiles) -> None:
    """Find the --max-num-seqs (and --max-num-batched-tokens) with the most throughput under --slo.

    The model must fit (the plan says so first). Each setting is one server start (the command line
    `unit`/`serve` compute), warmed, then measured; known points come from the state file. Without
    --slo the knee is chosen. Extra vLLM arguments go after `--`.

    Exit 0: a winner (written with --write); 1: no setting met --slo (the best seen is reported);
    2: bad input, or the model does not fit.
    """
    from rocmdoctor.provision.server.serve import SignalsToStop, Stopped

    servers: list[Server] = []  # every server started, for the message when a signal stops the run
    # A SIGTERM, SIGINT or SIGHUP in any phase is an exception: the runner's `finally` stops the server
    # that runs (a SIGKILL leaves that to the server's tether), and a stop before or during the
    # write-back leaves the files as they were (atomic writes).
    with SignalsToStop():
        try:
            _tune(app, servers, server, search, dest, files)
        except Stopped as stop:
            left = [proc.pid for server in servers for proc in server.leftovers()]
            click.echo(
                f"rocmdoctor: tune stopped ({stop}); "
                + (f"server processes left: {left}" if left else "no server process left"),
                err=True,
            )
            sys.exit(1)


def _refuse_bad_requests(
    app: App, search: SearchOptions, dest: Destination, files: RunFiles, prefix: str
) -> Slo | None:
    """The refusals that need no plan (exit 2, before anything starts); the parsed --slo."""
    from rocmdoctor.provision.tune import search as ts

    try:
        objective = ts.parse_slo(search.slo) if search.slo is not None else None
    except ts.SloError as exc:
        raise UserError(str(exc)) from None
    writes = dest.write or dest.check_only
    if dest.write and dest.check_only:
        raise UserError("--write and --check: give one (--check shows what --write would write)")
    if (dest.instance or dest.lemonade_model) is not None and not (writes or files.plan_only):
        raise UserError("--instance and --lemonade-model name where --write writes: give --write or --check")
    if dest.instance is not None and dest.lemonade_model is not None:
        raise UserError("--instance and --lemonade-model: give one (where the server is configured)")
    if writes and dest.lemonade_model is None:
        _unit_to_write_beside(app, dest.target, dest.instance, prefix)  # refused now, not after the measuring
    return objective


def _workload(search: SearchOptions, max_len: int | None) -> Workload:
    """--workload's requests, else synthetic ones of --prompt-tokens/--output-tokens."""
    from rocmdoctor.provision.tune import workload as tw

    if search.workload is None:
        out_tokens = search.output_tokens or 128
        in_tokens = search.prompt_tokens or max(1, min(1024, (max_len or 2048) // 2) - out_tokens)
        return tw.synthetic(in_tokens, out_tokens, search.seed)
    data = read_bounded(search.workload, WORKLOAD_LIMIT, "--workload")
    if data is None:
        raise UserError(f"--workload {search.workload}: no such file")
    try:
        return tw.parse_jsonl(data, str(search.workload), search.seed)
    except tw.WorkloadError as exc:
        raise UserError(str(exc)) from None


def _trial(
    app: App, server: ServerOptions, search: SearchOptions, objective: Slo | None
) -> tuple[ServerArgs, Trial]:
    """(the server's arguments as `unit`/`serve` compute them, their refusals included; the Trial)."""
    from rocmdoctor.commands.server_setup import resolve_args
    from rocmdoctor.provision.tune import session
    from rocmdoctor.provision.tune.writeback import without_tuned

    args = resolve_args(app, server.as_dict())
    _gmu_within_rule(app, args)
    max_len = int(args.value("--max-model-len") or 0) or None
    chosen = _workload(search, max_len)
    plan = _plan(app, args, server, search.kv_cache_memory, chosen.typical_len())
    try:
        seqs = session.searchable_seqs(search.seqs_spec, plan.kv_cache_tokens, chosen)
    except session.SeqsError as exc:
        raise UserError(str(exc)) from None
    return args, session.Trial(
        base_argv=without_tuned(args.argv()),  # tune sets these per trial
        environment=args.environment,
        gpu_memory_utilization=args.value("--gpu-memory-utilization"),
        max_model_len=max_len,
        kv_cache_tokens=plan.kv_cache_tokens,
        workload=chosen,
        seqs=seqs,
        batched=[int(v) for v in search.batched_list.split(",")] if search.batched_list else [None],
        slo=objective,
        search=search.search_kind,
        requests=search.requests,
        min_seconds=search.min_seconds,
        confirm=search.confirm_times,
        margin=search.margin,
    )


def _tune(
    app: App,
    servers: list[Server],
    server: ServerOptions,
    search: SearchOptions,
    dest: Destination,
    files: RunFiles,
) -> None:
    from rocmdoctor.commands.smoke_options import _plot_path as plot_path_rule
    from rocmdoctor.facts.installed_bundle import read_installed
    from rocmdoctor.host import Host
    from rocmdoctor.model import envelope
    from rocmdoctor.provision.tune import session

    server = dataclasses.replace(server, max_num_seqs=None)
    objective = _refuse_bad_requests(app, search, dest, files, server.prefix)
    plot_path = plot_path_rule(files.plot)
    args, trial = _trial(app, server, search, objective)
    model = server.model
    config = (
        read_bounded(Path(model) / "config.json", 4 << 20, "model config") if Path(model).is_dir() else None
    )
    tune_plan = session.plan_document(
        trial,
        _host_identity(app),
        session.bundle_identity(read_installed(Host(Path("/")), server.prefix)),  # the bundle the trials run
        model,
        session.model_revision(model, config),
    )
    events = _events(server.as_json)
    events("plan", **{k: tune_plan[k] for k in ("seqs", "batched_tokens", "gpu_memory_utilization", "slo")})
    if files.plan_only:
        if server.as_json:
            emit_json(envelope(command="tune", plan=tune_plan))
        else:
            click.echo(json.dumps(tune_plan, indent=2))
        return
    report, choice = _measure(app, servers, server, search, dest, files, args, trial, tune_plan, events)
    change = None
    if (dest.write or dest.check_only) and choice.winner is not None:
        events("writing", setting=choice.winner.setting.to_json())
        if dest.lemonade_model is not None:
            change = _write_lemonade(app, dest, dest.lemonade_model, choice)
        else:
            change = _write_back(app, dest, choice, server.prefix)
    _finish(report, change, choice, server.as_json, app, plot_path)


def _measure(
    app: App,
    servers: list[Server],
    server: ServerOptions,
    search: SearchOptions,
    dest: Destination,
    files: RunFiles,
    args: ServerArgs,
    trial: Trial,
    tune_plan: dict[str, Any],
    events: Callable[..., None],
) -> tuple[dict[str, Any], Choice]:
    """The search on trial servers (known points from the state file), the state file updated (never
    under --check); (the report, the choice)."""
    from rocmdoctor.commands.server_setup import api_key, server_environment, startable
    from rocmdoctor.provision.server.serve import default_cache_base
    from rocmdoctor.provision.server.unit import readiness_url
    from rocmdoctor.provision.tune import session
    from rocmdoctor.provision.tune.run import Runner, RunOptions
    from rocmdoctor.provision.tune.state import State

    # A port in use is most often the production server: its GPU memory is needed by the trials too.
    executable = startable(args, server.prefix)
    cache_base = default_cache_base(os.environ)
    state_path = files.state_file or cache_base / "rocmdoctor" / "tune-state.json"
    state = State.parse(read_bounded(state_path, STATE_LIMIT, "--state-file"), str(state_path))
    if state.problem:
        events("state", problem=state.problem)
    context = tune_plan["context"]
    opts = server.as_dict()
    with _log_dir(files, dest, cache_base) as logs:
        runner = Runner(
            RunOptions(
                executable,
                trial.base_argv,
                # --check makes no JIT cache (nor its fingerprint): the trials use vLLM's defaults
                server_environment(args, opts, cache_base, jit=not dest.check_only),
                readiness_url(args),
                args.served_model_name,
                api_key(opts),
                logs,
                trial.workload,
                search.start_timeout_s,
                search.timeout_s,
                search.requests,
                search.min_seconds,
            ),
            events,
            servers=servers,
        )
        started = time.monotonic()
        points, choice = session.run(trial, {p.setting: p for p in state.known(context)}, runner.measure)
    if not dest.check_only:
        state.add(context, [p for p in points if p.source == "measured"])
        _write_state(state_path, state.to_bytes())
    seconds = time.monotonic() - started
    return session.report(tune_plan, points, choice, trial.slo, seconds, runner.starts), choice


@contextlib.contextmanager
def _log_dir(files: RunFiles, dest: Destination, cache_base: Path) -> Iterator[Path]:
    """Where the trial servers log: --log-dir, else the cache's tune directory; under --check (which
    leaves nothing behind) a private directory (an unguessable name) that exists only once a server
    starts, removed when tune ends."""
    if files.log_dir is not None or not dest.check_only:
        yield files.log_dir or cache_base / "rocmdoctor" / "tune"
        return
    from rocmdoctor.host_writes import HostWriter

    private = Path(tempfile.gettempdir()) / f"rocmdoctor-tune-check-{os.getpid()}-{secrets.token_hex(8)}"
    try:
        yield private
    finally:
        trees = HostWriter("/").trees
        if trees.lexists(private):
            trees.remove_tree(private, ignore_errors=True)


def _unit_to_write_beside(app: App, target: Path | None, instance: str | None, prefix: str) -> None:
    """--write/--check into a unit: the unit must be there, and fit the installed bundle's vLLM, before
    anything is measured (exit 2)."""
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.provision.bundle.ask_vllm import for_prefix
    from rocmdoctor.provision.tune.writeback import WritebackError, installed_exec_start, validated

    try:
        validated(installed_exec_start(HostWriter(write_root(app, target)), instance), for_prefix(prefix))
    except WritebackError as exc:
        raise UserError(f"nothing measured: {exc}") from None


def _write_state(path: Path, data: bytes) -> None:
    from rocmdoctor.host_writes import HostWriter

    try:
        HostWriter("/").write_file(str(path.absolute()), data, 0o600)
    except OSError as exc:
        click.echo(f"rocmdoctor: the state file {path} could not be written: {exc}", err=True)


def _write_back(app: App, dest: Destination, choice: Choice, prefix: str) -> dict[str, Any]:
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.provision.bundle.ask_vllm import for_prefix
    from rocmdoctor.provision.tune.writeback import WritebackError, write_back

    winner = choice.winner
    if winner is None:  # the caller writes only a winner
        raise ValueError("no winner to write")
    why = f"{winner.output_tokens_per_s:.1f} output tokens/s; {choice.reason}."
    try:
        return write_back(
            HostWriter(write_root(app, dest.target), check_mode=dest.check_only),
            dest.instance,
            winner.setting,
            why,
            for_prefix(prefix),  # the bundle the unit runs judges its command line
        ).to_json()
    except (WritebackError, OSError) as exc:
        raise UserError(f"could not write the winner back: {exc}") from None


def _write_lemonade(app: App, dest: Destination, model: str, choice: Choice) -> dict[str, Any]:
    """The winner as the model's saved vllm_args, through Lemonade's options API (its own dry run
    under --check); Lemonade passes them to vllm-server at the model's next load."""
    from rocmdoctor.commands.lemonade_targets import admin_key, lemonade_url
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.provision.server.lemonade import ModelTarget, apply_options
    from rocmdoctor.provision.server.lemonade_api import Lemonade, LemonadeError

    winner = choice.winner
    if winner is None:  # the caller writes only a winner
        raise ValueError("no winner to write")
    words = winner.setting.flags()
    flags = dict(zip(words[::2], words[1::2], strict=True))
    why = f"rocmdoctor tune: {winner.output_tokens_per_s:.1f} output tokens/s; {choice.reason}"
    target = ModelTarget(model, None, flags, reasons=dict.fromkeys(flags, why))
    try:
        lemonade = Lemonade(lemonade_url(app, dest.lemonade_url), admin_key(dest.lemonade_key_file))
        change = apply_options(HostWriter(check_mode=dest.check_only), lemonade, target)
    except LemonadeError as exc:
        raise UserError(f"could not write the winner into Lemonade's options for {model}: {exc}") from None
    return change.envelope(check=dest.check_only)


def _finish(
    report: dict,
    change: dict[str, Any] | None,
    choice: Choice,
    as_json: bool,
    app: App,
    plot_path: Path | None,
) -> None:
    from rocmdoctor.model import envelope

    if plot_path is not None:
        from rocmdoctor.commands.tune_render import write_plot

        write_plot(report, plot_path)
    if change is not None:
        document = {**change, **{k: v for k, v in report.items() if k != "schema_version"}}
    else:
        msg = "nothing written (pass --write to write the winner)" if choice.winner else report["reason"]
        document = envelope(changed=False, check=False, msg=msg, diff="", **{
            k: v for k, v in report.items() if k != "schema_version"})  # fmt: skip
    if as_json:
        emit_json(document)
    else:
        from rocmdoctor.commands.tune_render import render_tune
        from rocmdoctor.rendering.console import make_console

        render_tune(report, document, make_console(no_color=app.no_color))
    sys.exit(report["exit_code"])
