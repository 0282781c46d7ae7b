"""What the server commands share (`unit`, `serve`, `cluster unit`, `tune`): the server's arguments
resolved for this host, its key, its environment and program, and the unit files shown or written.
Not a command: commands import it, so no command imports another."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rocmdoctor.commands.bundle_qualify import jit_environment
from rocmdoctor.commands.common import App, UserError, echo_write_report, emit_json
from rocmdoctor.commands.server_options import choices

if TYPE_CHECKING:
    from rocmdoctor.host_writes import HostWriter


def resolve_args(app: App, opts: dict[str, Any]):
    from rocmdoctor.commands.host_pools import pools_from_facts
    from rocmdoctor.provision.server.args import ArgumentError, resolve
    from rocmdoctor.provision.server.plan_settings import serving_version
    from rocmdoctor.registry import Context, Options

    ctx = Context(app.host(), Options(prefix=opts["prefix"]))
    group, notes = pinned_group(ctx, opts.get("gpus") or (), opts["tensor_parallel_size"] or 1)
    try:
        # Sized from the GPUs the pin shows vLLM, in its order (device 0 first), never from KFD order.
        args = resolve(
            choices(opts, serving=serving_version(ctx.host, opts["prefix"])),
            pools_from_facts(ctx, [d.kfd_node for d in group] if group else None),
        )
    except ArgumentError as exc:
        raise UserError(str(exc)) from None
    args.notes.extend(notes)
    if group:
        from rocmdoctor.commands.host_devices import host_devices
        from rocmdoctor.provision.server.layout import visible_devices

        devices = host_devices(ctx)
        args.environment["ROCR_VISIBLE_DEVICES"] = visible_devices(devices, group)
        args.notes.append(
            "pinned (ROCR_VISIBLE_DEVICES, ROCm's KFD-order numbering): "
            + ", ".join(f"vLLM device {i} = {d.label}" for i, d in enumerate(group))
        )
        ipc_mode(args, group)
    return args


def ipc_mode(args: Any, group: list[Any]) -> None:
    """Tensor parallelism over RDNA GPUs: legacy IPC mode off (it breaks IPC there: env.multi_gpu's rule)."""
    from rocmdoctor.checks.host_rules import rules

    data = rules()["ipc_legacy"]
    if len(group) >= 2 and all(d.gfx.startswith(tuple(data["gfx_prefixes"])) for d in group):
        args.environment[data["variable"]] = "0"
        args.notes.append(f"{data['variable']}=0: {data['source']}")
    extra = " ".join(args.extra).replace("=", " ")
    if "--distributed-executor-backend ray" in extra:
        # Ray would re-mask each worker through ROCR_VISIBLE_DEVICES over the pin (vllm#12572).
        noset = rules()["visibility"]["ray_noset"]
        args.environment[noset] = "1"
        args.notes.append(f"{noset}=1: {rules()['visibility']['source']}")


def pinned_group(ctx: Any, gpus: tuple[str, ...], tensor_parallel_size: int) -> tuple[list[Any], list[str]]:
    """On a host with several GPU nodes (or with --gpu), the devices the server is shown and sized from:
    the ones `--gpu` names, else gpu_choice's rule (an unsupported iGPU hidden, a supported dGPU before an
    iGPU beside it). A choice left open (GPUs of several families) or a bad --gpu is refused with the
    options named; HIP_VISIBLE_DEVICES is never set (vLLM refuses it disagreeing with CUDA_VISIBLE_DEVICES)."""
    from rocmdoctor.commands.host_devices import host_devices
    from rocmdoctor.provision.server.layout import AmbiguousGpus, LayoutError, single_server_group

    devices = host_devices(ctx)
    if len(devices) < 2 and not gpus:
        return [], []
    try:
        return single_server_group(devices, tensor_parallel_size, None, gpus), []
    except AmbiguousGpus as exc:
        raise UserError(str(exc)) from None
    except LayoutError as exc:
        if gpus:
            raise UserError(str(exc)) from None
        return [], [f"GPUs not pinned: {exc}"]


def api_key(opts: dict[str, Any]) -> str | None:
    """The key the server is started with: the one reader (provision.unit.read_api_key's minimum length)."""
    from rocmdoctor.provision.server.unit import UnitError, read_api_key

    if opts["api_key_file"] is None:
        return None
    try:
        return read_api_key(opts["api_key_file"])
    except UnitError as exc:
        raise UserError(str(exc)) from None


def show_settings(args, stream=None) -> None:
    stream = stream or sys.stderr  # bound at call time: the CLI may run in-process
    for setting in args.settings:
        print(f"  {setting.flag} {setting.value}  ({setting.reason})", file=stream)
    if args.extra:
        print(f"  extra: {' '.join(args.extra)}", file=stream)
    for note in args.notes:
        print(f"  note: {note}", file=stream)


def show_or_write(
    specs: list[Any], user: str, writer: HostWriter | None, as_json: bool, **fields: Any
) -> None:
    """Print the first unit (`--json`: with `fields`), or with a `writer` (--write, or --check's dry
    run) make its tree match `specs` and report what changed: `unit` and `cluster unit`."""
    from rocmdoctor.provision.server.unit import UnitError
    from rocmdoctor.provision.server.unit import write as write_files

    if writer is None:
        if as_json:
            emit_json({"unit": specs[0].content, "path": specs[0].path, **fields})
        else:
            click.echo(specs[0].content, nl=False)
        return
    try:
        report = write_files(writer, specs, user)
    except (UnitError, OSError) as exc:
        raise UserError(f"could not write the unit: {exc}") from None
    if as_json:
        emit_json({**report.to_json(), **fields})
        return
    echo_write_report(report)


def server_environment(
    args: Any,
    opts: dict[str, Any],
    cache_base: Path,
    cache_dir: Path | None = None,
    marker: str = "",
    jit: bool = True,
) -> dict[str, str]:
    """The server's environment: the bundle's, its caches (JIT caches of the qualified bundle, made
    with their fingerprint; `jit=False`: none made, vLLM's defaults), the key, the run's marker and what
    the arguments pin (ROCR_VISIBLE_DEVICES)."""
    from rocmdoctor.provision.server.serve import server_env

    env = server_env(
        os.environ,
        cache_dir or Path(os.environ.get("VLLM_CACHE_ROOT") or cache_base / "vllm"),
        api_key(opts),
        marker,
    )
    if jit:
        env.update(jit_environment(Path(opts["prefix"]), cache_base / "rocmdoctor"))
    if cache_dir:
        env["VLLM_CACHE_ROOT"] = str(cache_dir)
    env.update(args.environment)
    return env


def startable(args: Any, prefix: str) -> Path:
    """The bundle's server program, refused (exit 2) when it is missing or the port is taken."""
    from rocmdoctor.provision.server.serve import HostUnresolvable, port_in_use
    from rocmdoctor.provision.server.unit import ServiceLayout

    executable = Path(ServiceLayout(prefix=prefix).server)
    if not os.access(executable, os.X_OK):
        raise UserError(
            f"{executable} is missing or not executable: install a bundle first "
            f"(rocmdoctor install --prefix {prefix})"
        )
    try:
        taken = port_in_use(args.host, args.port)
    except HostUnresolvable as exc:
        raise UserError(str(exc)) from None
    if taken:
        raise UserError(
            f"port {args.port} on {args.host} is already in use (an earlier server still running?); "
            "stop it or pass --port"
        )
    return executable
