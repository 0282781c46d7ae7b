"""`rocmdoctor unit` and `rocmdoctor serve`: the vLLM server with arguments computed from this host."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rocmdoctor import params
from rocmdoctor.commands.common import (
    WITH_ROOT_FACTS,
    App,
    UserError,
    pass_app,
    refuse_root_facts_for_live_action,
    write_root,
)
from rocmdoctor.commands.server_options import (
    LAYOUT_CHOICES,
    SINGLE_SERVER_GROUP,
    ServerOptions,
    server_option,
    server_options,
)
from rocmdoctor.commands.server_setup import (
    api_key,
    resolve_args,
    server_environment,
    show_or_write,
    show_settings,
    startable,
)
from rocmdoctor.report import strict

if TYPE_CHECKING:
    from rocmdoctor.provision.server.args import ServerArgs
    from rocmdoctor.provision.server.serve import Server


@click.command(cls=params.VllmPassThrough)
@server_options("write", "check", "target", "user", "timeout")
@click.option(
    "--instances",
    "instances_layout",
    type=click.Choice(LAYOUT_CHOICES),
    default=None,
    help="Several servers as vllm@N under vllm.target, laid out from the topology "
    "(the same as `rocmdoctor instances`: docs/instances.md).",
)
@SINGLE_SERVER_GROUP
@pass_app
def unit(
    app: App,
    write: bool,
    check_only: bool,
    target: Path | None,
    user: str,
    timeout_s: int,
    instances_layout: str | None,
    server: ServerOptions,
) -> None:
    """Render the systemd unit for the vLLM server; with --write install it (idempotent).

    Extra vLLM arguments go after `--`: rocmdoctor unit --model M -- --enforce-eager
    """
    from rocmdoctor.host_writes import HostWriter

    opts = server.as_dict()
    if instances_layout is not None:
        from rocmdoctor.commands.instances_setup import write_layout

        layout = {
            "layout": instances_layout,
            "tensor_parallel_size": opts["tensor_parallel_size"] or 1,
            "count": None,
            "family": None,
            "gpus": opts.get("gpus") or (),
            "devices_from": None,
        }
        writer = HostWriter(write_root(app, target), check_mode=check_only) if write or check_only else None
        write_layout(app, {**opts, **layout}, writer, target, user, timeout_s)
        return
    from rocmdoctor.provision.server.unit import ServiceLayout, UnitError, file_specs

    args = resolve_args(app, opts)
    try:
        specs = file_specs(args, ServiceLayout(prefix=opts["prefix"]), user, api_key(opts), timeout_s)
    except UnitError as exc:
        raise UserError(str(exc)) from None
    writer = HostWriter(write_root(app, target), check_mode=check_only) if write or check_only else None
    show_or_write(specs, user, writer, opts["as_json"], server_args=args.to_json())


@click.command(cls=params.VllmPassThrough)
@server_option(
    "timeout",
    type=params.Duration(),
    help="Seconds to wait for the model to load and answer a completion (cold JIT takes minutes).",
)
@click.option(
    "--cache-dir",
    type=params.NonEmptyPath(file_okay=False, path_type=Path),
    default=None,
    help="VLLM_CACHE_ROOT: compile and JIT caches that make the next start fast [default: ~/.cache/vllm].",
)
@click.option(
    "--log-file",
    type=params.NonEmptyPath(dir_okay=False, path_type=Path),
    default=None,
    help="Server log [default: ~/.cache/rocmdoctor/serve-PORT.log].",
)
@WITH_ROOT_FACTS
@SINGLE_SERVER_GROUP
@pass_app
def serve(
    app: App,
    timeout_s: float,
    cache_dir: Path | None,
    log_file: Path | None,
    with_root_facts: bool,
    server: ServerOptions,
) -> None:
    """Run the vLLM server in the foreground until Ctrl-C; report ready only after a real completion.

    Extra vLLM arguments go after `--`: rocmdoctor serve --model M -- --enforce-eager

    Exit 0 after a clean stop; 1 when the server did not become ready, died, or left a process behind.
    """
    from rocmdoctor.provision.server.serve import Server, default_cache_base, new_marker
    from rocmdoctor.provision.server.unit import readiness_url

    opts = server.as_dict()
    refuse_root_facts_for_live_action(app, with_root_facts, "serve")
    args = resolve_args(app, opts)
    executable = startable(args, opts["prefix"])
    cache_base = default_cache_base(os.environ)
    env = server_environment(args, opts, cache_base, cache_dir, new_marker())
    running = Server(
        executable,
        args.argv(),
        readiness_url(args),
        args.served_model_name,
        env,
        log_file or cache_base / "rocmdoctor" / f"serve-{args.port}.log",
        # A serve killed by SIGKILL (or the OOM killer) runs no `finally`: the tether stops the server.
        tether=True,
    )
    events = Events(opts["as_json"])
    print(f"starting {executable} (log: {running.log_path})", file=sys.stderr)
    show_settings(args)
    foreground(running, args, events, timeout_s, executable)


def foreground(running: Server, args: ServerArgs, events: Events, timeout_s: float, executable: Path) -> None:
    """Start `running`, report it ready after a real completion, and stop it on every way out
    (exits: 0 after a clean stop, 1 when it was not ready, died or left a process behind)."""
    from rocmdoctor.provision.server.serve import ProgressLine, SignalsToStop, Stopped

    with SignalsToStop():
        try:
            running.start()
        except OSError as exc:
            raise UserError(
                f"cannot start {executable} (log {running.log_path}): {exc.strerror or exc}"
            ) from None
        except Stopped:
            events.stopped(running.stop(), reason="interrupted while starting")
            sys.exit(1)
        # From here on every way out stops the server's whole process group and says so: a readiness
        # test that fails oddly, an error of our own, a signal. Only SystemExit passes through, and
        # every path that raises it has stopped the server first.
        try:
            progress = ProgressLine(args.served_model_name)
            outcome = running.wait_ready(timeout_s, progress)
            progress.finish()
            if not outcome.ready:
                events.failed(outcome)
                events.stopped(running.stop(), reason="not ready")
                sys.exit(1)
            events.emit(
                "ready",
                f"ready in {outcome.seconds:.0f} s: {running.base_url}/v1 serves "
                f"{args.served_model_name!r} (Ctrl-C stops it)",
                url=f"{running.base_url}/v1",
                model=args.served_model_name,
                seconds=round(outcome.seconds, 1),
                health_seconds=round(outcome.health_seconds or 0, 1),
            )
            returncode = running.wait_exit()
            events.failed(running.failure(f"the server exited with status {returncode} after it was ready"))
            events.stopped(running.stop(), reason="exited")
            sys.exit(1)
        except Stopped as stop:
            left = running.stop()
            events.stopped(left, reason=f"{stop}")
            sys.exit(1 if left else 0)
        except SystemExit:
            raise
        except BaseException as exc:
            try:
                left = running.stop()
            except Stopped:  # the one signal honoured arrived during this stop: finish it
                left = running.stop()
            try:
                events.stopped(left, reason=f"rocmdoctor failed: {type(exc).__name__}: {exc}")
            except Exception:
                print(
                    f"stopped the server after an error of rocmdoctor ({exc}); left: {left}", file=sys.stderr
                )
            raise


class Events:
    """Human lines on stderr, or one JSON object per line on stdout."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def emit(self, event: str, message: str, **data: Any) -> None:
        if self.as_json:
            sys.stdout.write(json.dumps(strict({"event": event, **data}), allow_nan=False) + "\n")
            sys.stdout.flush()
        else:
            print(message, file=sys.stderr)

    def failed(self, outcome) -> None:
        lines = [f"NOT READY: {outcome.reason}"]
        if outcome.log_tail:
            lines += ["--- last lines of the server log ---", outcome.log_tail, "---"]
        if outcome.cause:
            lines += [f"likely cause: {outcome.cause.summary}", f"what to do: {outcome.cause.remedy}"]
        else:
            lines.append("likely cause: not a known signature; read the log above")
        self.emit("failed", "\n".join(lines), **outcome.to_json())

    def stopped(self, leftover_pids: list[int], reason: str) -> None:
        message = (
            f"stopped ({reason}); no server process left"
            if not leftover_pids
            else f"stopped ({reason}) but these server processes survived SIGKILL: {leftover_pids}"
        )
        self.emit("stopped", message, reason=reason, leftover_pids=leftover_pids)
