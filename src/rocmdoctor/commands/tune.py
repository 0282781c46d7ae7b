"""`rocmdoctor tune`: the --max-num-seqs (and --max-num-batched-tokens) that maximise throughput under a
latency limit, measured by restarting the server, and written back as a drop-in of its unit."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from rocmdoctor import params
from rocmdoctor.commands.common import App, UserError, emit_json, pass_app, write_root
from rocmdoctor.commands.server_options import server_option, server_options
from rocmdoctor.report import strict

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


def _plan(app: App, args: Any, opts: dict[str, Any], kv_cache_memory: str | None, typical_len: int):
    """The model's memory plan: the GPU's (from the server's arguments) or one for --kv-cache-memory."""
    from rocmdoctor.commands.plan import load_model_files, parse_size
    from rocmdoctor.provision.server.plan_settings import engine_settings
    from rocmdoctor.provision.tune import session
    from rocmdoctor.vllm.memory_plan import EngineSettings, Memory

    if kv_cache_memory is None and args.plan is None:
        why = "; ".join(n for n in args.notes if "plan" in n) or "no GPU memory to plan with"
        raise UserError(
            f"no memory plan for the model ({why}), so whether it fits is unknown; on a host without an "
            "AMD GPU pass --kv-cache-memory SIZE (the KV cache the server gets, e.g. VLLM_CPU_KVCACHE_SPACE "
            "for vLLM on the CPU)"
        )
    files = load_model_files(opts["model"], "main", True)
    if kv_cache_memory is not None:
        memory = Memory(0, 1.0, "--kv-cache-memory", parse_size(kv_cache_memory, "--kv-cache-memory"))
    else:
        memory = args.plan.memory
    settings = engine_settings(
        EngineSettings(tensor_parallel_size=opts["tensor_parallel_size"] or 1), args.extra
    )
    max_len = args.value("--max-model-len")
    try:
        return session.fitting_plan(
            files, memory, settings, int(max_len) if max_len else None, typical_len, opts["model"]
        )
    except session.Unfit as exc:
        raise UserError(str(exc)) from None


def _gmu_within_rule(app: App, args: Any) -> None:
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


@click.command(cls=params.VllmPassThrough)
@server_options(
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
@click.option(
    "--seqs",
    "seqs_spec",
    default="1:auto",
    show_default=True,
    help="--max-num-seqs values to search: LOW:HIGH (HIGH auto: what the KV cache holds) or a list 1,2,4,8.",
)
@click.option(
    "--batched-tokens",
    "batched_list",
    type=params.CountList(1, 1 << 22, 16),
    default=None,
    help="--max-num-batched-tokens values to search too (comma-separated); default: vLLM's, not searched.",
)
@click.option(
    "--search",
    "search_kind",
    type=click.Choice(["adaptive", "exhaustive"]),
    default="adaptive",
    show_default=True,
    help="exhaustive: measure every point of the grid (vLLM's `bench sweep`), to compare with.",
)
@click.option(
    "--slo",
    type=params.NonEmptyText("ttft:p95<=2s"),
    default=None,
    help="Latency limit: METRIC:pPCT<=LIMIT, e.g. ttft:p95<=2s, itl:p99<=50ms.",
)
@click.option(
    "--workload",
    type=params.NonEmptyPath(dir_okay=False, path_type=Path),
    default=None,
    help='JSONL, one {"prompt": ..., "output_tokens": N} a line (default: synthetic prompts).',
)
@click.option("--prompt-tokens", type=params.Count(1, 1 << 20), default=None, help="Synthetic prompt length.")
@click.option("--output-tokens", type=params.Count(1, 1 << 16), default=None, help="Synthetic output length.")
@click.option("--requests", type=params.Count(1, 10_000), default=16, show_default=True,
              help="Requests measured per setting (at least 4 x max-num-seqs).")  # fmt: skip
@click.option(
    "--min-seconds",
    type=params.Duration(max_s=3600, min_s=0.0, inclusive=True),
    default=10.0,
    show_default=True,
    help="Measure each setting at least this long (more batches of --requests): steadier on a busy host.",
)
@click.option("--seed", type=params.Count(0, 1 << 30), default=0, show_default=True, help="Workload order.")
@click.option(
    "--kv-cache-memory",
    default=None,
    help="Plan with this KV cache size (e.g. 1GiB) where there is no GPU to plan from.",
)
@click.option(
    "--start-timeout",
    "start_timeout_s",
    type=params.Duration(),
    default=900,
    show_default=True,
    help="Seconds each server start may take to become ready (a cold FP8 load on gfx1151 takes ~12 min).",
)
@click.option("--timeout", "timeout_s", type=params.Duration(), default=120, show_default=True,
              help="Seconds one request may take.")  # fmt: skip
@click.option("--write", is_flag=True, help="Write the winner as a drop-in of the server's unit.")
@server_option(
    "check", help="Show the drop-in --write would write (diff), write nothing (state file included)."
)
@server_option("target")
@click.option(
    "--instance", default=None, help="Write into vllm@N's drop-in (instances) instead of vllm.service."
)
@click.option(
    "--lemonade-model",
    default=None,
    metavar="ID",
    help="Write into this Lemonade model's saved options (its vllm_args) instead of a unit.",
)
@click.option(
    "--lemonade-url",
    default=None,
    envvar="ROCMDOCTOR_LEMONADE_URL",
    help="Lemonade Server (default: the port in its config.json, else 13305 on loopback).",
)
@click.option(
    "--lemonade-key-file",
    type=params.NonEmptyPath(path_type=Path, dir_okay=False),
    callback=params.key_file(),
    default=None,
    help="File holding LEMONADE_ADMIN_API_KEY (default: that variable, then LEMONADE_API_KEY).",
)
@click.option("--state-file", type=params.NonEmptyPath(dir_okay=False, path_type=Path), default=None,
              help="Known points [default: ~/.cache/rocmdoctor/tune-state.json].")  # fmt: skip
@click.option(
    "--plan-only", is_flag=True, help="Show the plan (server arguments, what is searched) and stop."
)
@click.option(
    "--plot",
    type=params.NonEmptyPath(path_type=Path, dir_okay=False),
    default=None,
    help="Write throughput and latency against max-num-seqs to FILE.png or FILE.svg.",
)
@click.option("--log-dir", type=params.NonEmptyPath(file_okay=False, path_type=Path), default=None,
              help="Server logs [default: ~/.cache/rocmdoctor/tune].")  # fmt: skip
@pass_app
def tune(app: App, **options: Any) -> None:
    """Find the --max-num-seqs (and --max-num-batched-tokens) with the most throughput under --slo.

    The model must fit (the plan says so first). Each setting is one server start (the command line
    `unit`/`serve` compute), warmed, then measured; known points come from the state file. Without
    --slo the knee is chosen. Extra vLLM arguments go after `--`.

    Exit 0: a winner (written with --write); 1: no setting met --slo (the best seen is reported);
    2: bad input, or the model does not fit.
    """
    from rocmdoctor.provision.server.serve import SignalsToStop, Stopped

    servers: list[Any] = []  # every server started, for the message when a signal stops the run
    # A SIGTERM, SIGINT or SIGHUP in any phase is an exception: the runner's `finally` stops the server
    # that runs (a SIGKILL leaves that to the server's tether), and a stop before or during the
    # write-back leaves the files as they were (atomic writes).
    with SignalsToStop():
        try:
            _tune(app, servers, **options)
        except Stopped as stop:
            left = [proc.pid for server in servers for proc in server.leftovers()]
            click.echo(
                f"rocmdoctor: tune stopped ({stop}); "
                + (f"server processes left: {left}" if left else "no server process left"),
                err=True,
            )
            sys.exit(1)


def _tune(
    app: App,
    servers: list[Any],
    seqs_spec: str,
    batched_list: str | None,
    search_kind: str,
    slo: str | None,
    workload: Path | None,
    prompt_tokens: int | None,
    output_tokens: int | None,
    requests: int,
    min_seconds: float,
    seed: int,
    kv_cache_memory: str | None,
    start_timeout_s: float,
    timeout_s: float,
    write: bool,
    check_only: bool,
    target: Path | None,
    instance: str | None,
    lemonade_model: str | None,
    lemonade_url: str | None,
    lemonade_key_file: Path | None,
    state_file: Path | None,
    plan_only: bool,
    plot: Path | None,
    log_dir: Path | None,
    **opts: Any,
) -> None:
    from rocmdoctor.model import envelope
    from rocmdoctor.provision.tune import search as ts
    from rocmdoctor.provision.tune import session
    from rocmdoctor.provision.tune import workload as tw

    opts["max_num_seqs"] = None
    as_json = opts["as_json"]
    events = _events(as_json)
    try:
        objective = ts.parse_slo(slo) if slo else None
    except ts.SloError as exc:
        raise UserError(str(exc)) from None
    if write and check_only:
        raise UserError("--write and --check: give one (--check shows what --write would write)")
    if (instance or lemonade_model) is not None and not (write or check_only or plan_only):
        raise UserError("--instance and --lemonade-model name where --write writes: give --write or --check")
    if instance is not None and lemonade_model is not None:
        raise UserError("--instance and --lemonade-model: give one (where the server is configured)")
    if (write or check_only) and lemonade_model is None:
        write_root(app, target)  # --root only reads: refused now, not after the measuring
    from rocmdoctor.commands.smoke import _plot_path as plot_path_rule

    plot_path = plot_path_rule(plot)
    if workload is not None:
        data = read_bounded(workload, WORKLOAD_LIMIT, "--workload")
        if data is None:
            raise UserError(f"--workload {workload}: no such file")
        try:
            chosen = tw.parse_jsonl(data, str(workload), seed)
        except tw.WorkloadError as exc:
            raise UserError(str(exc)) from None
    else:
        chosen = None

    # Phase: plan. The server's arguments as `unit`/`serve` compute them (their refusals included).
    from rocmdoctor.commands.serve import api_key, resolve_args, server_environment, startable

    args = resolve_args(app, opts)
    _gmu_within_rule(app, args)
    max_len = int(args.value("--max-model-len") or 0) or None
    if chosen is None:
        out_tokens = output_tokens or 128
        in_tokens = prompt_tokens or max(1, min(1024, (max_len or 2048) // 2) - out_tokens)
        chosen = tw.synthetic(in_tokens, out_tokens, seed)
    plan = _plan(app, args, opts, kv_cache_memory, chosen.typical_len())
    try:
        seqs = session.searchable_seqs(seqs_spec, plan.kv_cache_tokens, chosen)
    except session.SeqsError as exc:
        raise UserError(str(exc)) from None
    from rocmdoctor.provision.server.unit import readiness_url
    from rocmdoctor.provision.tune.state import State
    from rocmdoctor.provision.tune.writeback import without_tuned

    trial = session.Trial(
        base_argv=without_tuned(args.argv()),  # tune sets these per trial
        environment=args.environment,
        gpu_memory_utilization=args.value("--gpu-memory-utilization"),
        max_model_len=max_len,
        kv_cache_tokens=plan.kv_cache_tokens,
        workload=chosen,
        seqs=seqs,
        batched=[int(v) for v in batched_list.split(",")] if batched_list else [None],
        slo=objective,
        search=search_kind,
        requests=requests,
        min_seconds=min_seconds,
    )
    model = opts["model"]
    config = (
        read_bounded(Path(model) / "config.json", 4 << 20, "model config") if Path(model).is_dir() else None
    )
    tune_plan = session.plan_document(
        trial,
        _host_identity(app),
        session.bundle_identity(Path(opts["prefix"])),
        model,
        session.model_revision(model, config),
    )
    events("plan", **{k: tune_plan[k] for k in ("seqs", "batched_tokens", "gpu_memory_utilization", "slo")})
    if plan_only:
        if as_json:
            emit_json(envelope(command="tune", plan=tune_plan))
        else:
            click.echo(json.dumps(tune_plan, indent=2))
        return
    from rocmdoctor.provision.server.serve import default_cache_base

    # A port in use is most often the production server: its GPU memory is needed by the trials too.
    executable = startable(args, opts["prefix"])
    cache_base = default_cache_base(os.environ)
    state_path = state_file or cache_base / "rocmdoctor" / "tune-state.json"
    state = State.parse(read_bounded(state_path, STATE_LIMIT, "--state-file"), str(state_path))
    if state.problem:
        events("state", problem=state.problem)
    context = tune_plan["context"]
    from rocmdoctor.provision.tune.run import Runner, RunOptions

    runner = Runner(
        RunOptions(
            executable,
            trial.base_argv,
            server_environment(args, opts, cache_base),
            readiness_url(args),
            args.served_model_name,
            api_key(opts),
            log_dir or cache_base / "rocmdoctor" / "tune",
            chosen,
            start_timeout_s,
            timeout_s,
            requests,
            min_seconds,
        ),
        events,
        servers=servers,
    )
    started = time.monotonic()
    points, choice = session.run(trial, {p.setting: p for p in state.known(context)}, runner.measure)
    if not check_only:
        state.add(context, [p for p in points if p.source == "measured"])
        _write_state(state_path, state.to_bytes())
    report = session.report(tune_plan, points, choice, objective, time.monotonic() - started, runner.starts)
    change = None
    if (write or check_only) and choice.winner is not None:
        events("writing", setting=choice.winner.setting.to_json())
        if lemonade_model is not None:
            change = _write_lemonade(app, lemonade_model, lemonade_url, lemonade_key_file, check_only, choice)
        else:
            change = _write_back(app, target, check_only, instance, choice)
    _finish(report, change, choice, as_json, app, plot_path)


def _write_state(path: Path, data: bytes) -> None:
    from rocmdoctor.host_writes import HostWriter

    try:
        HostWriter("/").write_file(str(path.absolute()), data, 0o600)
    except OSError as exc:
        click.echo(f"rocmdoctor: the state file {path} could not be written: {exc}", err=True)


def _write_back(app: App, target: Path | None, check_only: bool, instance: str | None, choice: Any):
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.provision.tune.writeback import WritebackError, write_back

    winner = choice.winner
    why = f"{winner.output_tokens_per_s:.1f} output tokens/s; {choice.reason}."
    try:
        return write_back(
            HostWriter(write_root(app, target), check_mode=check_only), instance, winner.setting, why
        ).to_json()
    except (WritebackError, OSError) as exc:
        raise UserError(f"could not write the winner back: {exc}") from None


def _write_lemonade(
    app: App, model: str, url: str | None, key_file: Path | None, check_only: bool, choice: Any
) -> dict[str, Any]:
    """The winner as the model's saved vllm_args, through Lemonade's options API (its own dry run
    under --check); Lemonade passes them to vllm-server at the model's next load."""
    from rocmdoctor.commands.lemonade import _key, _url
    from rocmdoctor.provision.server.lemonade import ModelTarget, apply_options
    from rocmdoctor.provision.server.lemonade_api import Lemonade, LemonadeError

    winner = choice.winner
    words = winner.setting.flags()
    flags = dict(zip(words[::2], words[1::2], strict=True))
    why = f"rocmdoctor tune: {winner.output_tokens_per_s:.1f} output tokens/s; {choice.reason}"
    target = ModelTarget(model, None, flags, reasons=dict.fromkeys(flags, why))
    try:
        change = apply_options(Lemonade(_url(app, url), _key(key_file)), target, check_only)
    except LemonadeError as exc:
        raise UserError(f"could not write the winner into Lemonade's options for {model}: {exc}") from None
    return change.envelope(check=check_only)


def _finish(report: dict, change: Any, choice: Any, as_json: bool, app: App, plot_path: Path | None) -> None:
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
