"""What `instances` shares with `unit --instances`, `smoke --all-instances` and `bench`: the layout over
this host's devices, the instances written, and their smoke and bench. Not a command: commands import
it, so no command imports another."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rocmdoctor.commands.common import App, UserError, echo_write_report, emit_json
from rocmdoctor.commands.server_options import choices
from rocmdoctor.model import envelope
from rocmdoctor.textnum import is_decimal

if TYPE_CHECKING:
    from rocmdoctor.host_writes import HostWriter


def devices_of(app: App, source: str | None, prefix: str) -> list:
    """The GPU nodes of this host, or of another root / snapshot (`--devices-from`)."""
    from rocmdoctor.commands.host_devices import host_devices
    from rocmdoctor.registry import Context, Options

    if source is None:
        host = app.host()
    else:
        other = App(root=Path("/"), verbose=0, no_color=True)
        try:
            other.set_root(source)
        except click.BadParameter as exc:
            raise UserError(f"--devices-from {exc.format_message()}") from None
        host = other.host()
    return host_devices(Context(host, Options(prefix=prefix)))


def ports_still_ours(writer: Any) -> set[int]:
    """The ports written instances claim that their own servers hold now: on this host, a process in
    the instance's unit (its control group in /proc/PID/cgroup, `vllm@N.service`) listens there. A
    stale env file's port, with the instance stopped and another program listening, is probed like any
    other port and skipped; written into another tree, nothing of it runs here, so it holds none."""
    from rocmdoctor.checks.processes import listening_inodes, read_proc
    from rocmdoctor.host import Host
    from rocmdoctor.provision.server import instances as server_instances
    from rocmdoctor.registry import Context, Options

    claimed = server_instances.instance_ports(writer)
    if not claimed or not writer.is_live:
        return set()
    ctx = Context(Host(Path("/")), Options())
    procs = [p for p in (read_proc(ctx, pid) for pid in ctx.host.pids()) if p is not None]
    held = set()
    for name, port in claimed.items():
        inodes = listening_inodes(ctx, port)
        listeners = [p.pid for p in procs if p.sockets & inodes]
        unit = f"vllm@{name}.service"
        if listeners and all(unit in _cgroup_parts(ctx.host, pid) for pid in listeners):
            held.add(port)
    return held


def _cgroup_parts(host: Any, pid: int) -> set[str]:
    """The path components of a process's control groups (`0::/system.slice/system-vllm.slice/vllm@0.service`)."""
    read = host.read_text(f"/proc/{pid}/cgroup", limit=16384)
    if not read.ok:
        return set()
    return {part for line in read.value.splitlines() for part in line.split(":", 2)[-1].split("/") if part}


def compute_plan(app: App, opts: dict[str, Any], owned_ports: set[int] | None = None, port_free=None):
    """The layout's instances for this host (ports probed on --host unless `port_free` is given)."""
    from rocmdoctor.provision.server.layout import LayoutError, plan
    from rocmdoctor.provision.server.serve import HostUnresolvable, port_in_use

    devices = devices_of(app, opts["devices_from"], opts["prefix"])
    host = opts["host"]
    probe = port_free or (lambda port: not port_in_use(host, port))
    try:
        return plan(
            devices,
            opts["layout"],
            tensor_parallel_size=opts["tensor_parallel_size"],
            count=opts["count"],
            first_port=opts["port"],
            port_free=probe,
            owned_ports=owned_ports,
            gpu_memory_utilization=opts["gpu_memory_utilization"],
            family=opts["family"],
            gpus=opts.get("gpus") or (),
        )
    except (LayoutError, HostUnresolvable) as exc:
        raise UserError(str(exc)) from None


def common_argv(opts: dict[str, Any], first, host: Any) -> tuple[list[str], str]:
    """The arguments every instance shares (resolved like the single server's), without the three
    that the template reads from each instance's file; and the served model name."""
    from rocmdoctor.provision.server.args import ArgumentError, GpuPool, resolve
    from rocmdoctor.provision.server.plan_settings import serving_version

    device = first.devices[0]
    pool = GpuPool(
        device.label, device.family or device.gfx, device.memory_total, device.memory_free, bool(device.apu)
    )
    try:
        asked = choices(
            opts,
            port=first.port,
            gpu_memory_utilization=first.gpu_memory_utilization,
            tensor_parallel_size=None,  # each instance's, from its file
            serving=serving_version(host, opts["prefix"]),  # the installed bundle's vLLM sizes the plan
        )
        args = resolve(asked, [pool])
    except ArgumentError as exc:
        raise UserError(str(exc)) from None
    per_instance = {"--port", "--gpu-memory-utilization", "--tensor-parallel-size"}
    argv: list[str] = []
    for setting in args.settings:
        if setting.flag not in per_instance:
            argv += [setting.flag, setting.value]
    return argv + list(args.extra), args.served_model_name


def show_plan(plan, stream=None) -> None:
    stream = stream or sys.stderr  # bound at call time: the CLI may run in-process
    for inst in plan.instances:
        devices = ", ".join(d.label for d in inst.devices)
        print(
            f"vllm@{inst.name}: port {inst.port}, ROCR_VISIBLE_DEVICES={inst.visible_devices}, "
            f"tensor-parallel {inst.tensor_parallel_size}, --gpu-memory-utilization "
            f"{inst.gpu_memory_utilization:.2f}  [{devices}]",
            file=stream,
        )
    for note in plan.notes:
        print(f"  note: {note}", file=stream)


def write_layout(
    app: App,
    opts: dict[str, Any],
    writer: HostWriter | None,
    target: Path | None,
    user: str,
    timeout_s: int,
) -> None:
    """Show the layout, or with a `writer` (--write, --check) install it through it; `rocmdoctor unit
    --instances` comes here too."""
    from rocmdoctor.host_writes import HostWriter, WriteRefused
    from rocmdoctor.provision.server import instances as server_instances
    from rocmdoctor.provision.server.unit import ServiceLayout, UnitError, read_api_key

    # What is written (the ports it keeps) is read where a write goes: --target, else this host.
    try:
        owned = ports_still_ours(writer or HostWriter(target or app.root))  # the ports --write would keep
    except WriteRefused as exc:
        raise UserError(str(exc)) from None
    plan = compute_plan(app, opts, owned)
    listing = [i.to_json() for i in plan.instances]
    if writer is None:
        if opts["as_json"]:
            emit_json(
                envelope(
                    layout=plan.layout, instances=listing, skipped_ports=plan.skipped_ports, notes=plan.notes
                )
            )
        else:
            show_plan(plan, sys.stdout)
        return
    if not opts["model"]:
        raise UserError("--write needs --model (the model every server loads)")
    try:
        key = read_api_key(opts["api_key_file"]) if opts["api_key_file"] else None
        argv, served = common_argv(opts, plan.instances[0], app.host())
        specs = server_instances.file_specs(
            plan, argv, served, opts["host"], ServiceLayout(prefix=opts["prefix"]), user, key, timeout_s
        )
        report = server_instances.write(writer, specs, user)
    except (UnitError, WriteRefused, OSError) as exc:
        raise UserError(f"could not write the instances: {exc}") from None
    if opts["as_json"]:
        emit_json(
            envelope(
                **report.to_json(),
                layout=plan.layout,
                instances=listing,
                skipped_ports=plan.skipped_ports,
                notes=plan.notes,
            )
        )
        return
    show_plan(plan, sys.stdout)
    echo_write_report(report, label=lambda word, change: f"{word} ({change.action})", restart=report.restart)


def written_targets(writer, host: str | None) -> list:
    """Each written instance as (name, URL, key), from its env file; on `host`, or (None) at the
    address the written template's readiness gate uses."""
    from rocmdoctor.provision.server import instances as server_instances
    from rocmdoctor.provision.verify.instances_bench import Target

    written = server_instances.current_instances(writer)
    if not written:
        raise UserError(
            f"no instances written under {server_instances.ENV_DIR}: run `rocmdoctor instances --write` first"
        )
    base = server_instances.written_base_url(writer) if host is None else None
    targets = []
    for name in sorted(written, key=int):
        env = written[name]
        port = env.get(server_instances.PORT_VAR, "")
        if not is_decimal(port) or not 0 < int(port) < 65536:
            raise UserError(
                f"{server_instances.env_path(name)}: no valid {server_instances.PORT_VAR}; rerun `rocmdoctor instances --write`"
            )
        url = f"{base}:{port}" if base else server_instances.server_url(host or "127.0.0.1", int(port))
        targets.append(Target(name, url, env.get("VLLM_API_KEY") or None))
    return targets


def bench_instances(
    writer, host: str | None, as_json: bool, concurrency: int, requests: int, max_tokens: int
) -> None:
    from rocmdoctor.provision.verify.bench import BenchOptions
    from rocmdoctor.provision.verify.instances_bench import InstanceAborted, run_instances_bench

    targets = written_targets(writer, host)
    options = BenchOptions(url="", requests=requests, max_tokens=max_tokens)
    try:
        report = run_instances_bench(targets, options, concurrency)
    except InstanceAborted as exc:
        raise UserError(
            f"bench could not run: {exc}; `rocmdoctor instances --smoke` shows which step fails"
        ) from None
    if as_json:
        emit_json(envelope(command="instances --bench", **report))
    else:
        for inst in report["instances"]:
            alone, together = inst["alone"], inst["together"]
            click.echo(
                f"vllm@{inst['name']} {inst['url']}: alone {alone['output_tokens_per_s']:.1f} tok/s, "
                f"together {together['output_tokens_per_s']:.1f} tok/s "
                f"({together['failures'] + alone['failures']} failed requests)"
            )
        scaling = report["scaling"]
        click.echo(
            f"aggregate {report['aggregate_output_tokens_per_s']:.1f} tok/s with all {len(targets)} at once; "
            f"sum of alone {report['sum_of_alone_output_tokens_per_s']:.1f} tok/s"
            + (f" (x{scaling:.2f})" if scaling is not None else "")
        )
    sys.exit(report["exit_code"])


def smoke_instances(writer, host: str | None, as_json: bool) -> None:
    """`rocmdoctor smoke` against every instance the written files describe; exit 1 if one fails."""
    from rocmdoctor.provision.verify.smoke import SmokeOptions, run_smoke

    results = []
    for target in written_targets(writer, host):
        name, url = target.name, target.url
        report = run_smoke(SmokeOptions(url, "auto", target.api_key))
        failed = [s for s in report["steps"] if s["status"] in ("fail", "error")]
        context = next((s for s in report["steps"] if s["id"] == "context"), None)
        results.append(
            {
                "name": name,
                "url": url,
                "exit_code": report["exit_code"],
                "summary": report["summary"],
                "failed_steps": [{"id": s["id"], "summary": s["summary"]} for s in failed],
                # the long-context probe's verdict and evidence (ladder, longest consistent length)
                "context": None
                if context is None
                else {"status": context["status"], "summary": context["summary"], **context["details"]},
            }
        )
    worst = max(r["exit_code"] for r in results)
    if as_json:
        emit_json(envelope(command="instances --smoke", exit_code=worst, instances=results))
    else:
        for r in results:
            counts = ", ".join(f"{r['summary'].get(k, 0)} {k}" for k in ("pass", "warn", "fail"))
            verdict = "ok" if r["exit_code"] == 0 else "FAILED"
            first = (
                f": {r['failed_steps'][0]['id']}: {r['failed_steps'][0]['summary']}"
                if r["failed_steps"]
                else ""
            )
            click.echo(f"vllm@{r['name']} {r['url']}: {verdict} ({counts}){first}")
    sys.exit(worst)
