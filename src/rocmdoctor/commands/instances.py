"""`rocmdoctor instances`: several vLLM servers on one host (per GPU, per partition, per
tensor-parallel group), laid out from the topology and run by systemd as vllm@<n> under vllm.target."""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from rocmdoctor import params
from rocmdoctor.commands.common import App, UserError, pass_app, write_root
from rocmdoctor.commands.instances_setup import bench_instances, smoke_instances, write_layout
from rocmdoctor.commands.server_options import (
    LAYOUT_CHOICES,
    ServerOptions,
    server_group,
    server_option,
)


@click.command(cls=params.VllmPassThrough)
@server_group(
    click.option(
        "--instances",
        "--layout",
        "layout",
        type=click.Choice(LAYOUT_CHOICES),
        default="per-gpu",
        show_default=True,
        help="One server, one per GPU, or one per compute partition.",
    ),
    server_option(
        "tensor_parallel_size",
        default=1,
        show_default=True,
        help="Devices per server (one family, one XGMI hive).",
    ),
    click.option(
        "--count",
        type=params.Count(1, 4096),
        default=None,
        help="Run only this many servers (default: as many as fit).",
    ),
    click.option("--family", default=None, help="On a host with GPUs of several families: the one to serve."),
    server_option(
        "gpu", help="Serve only these GPUs, by PCI slot (0000:03:00.0) or KFD node (node:2); repeatable."
    ),
    server_option("port", help="The first server's port; the next ones count up, skipping ports in use."),
    server_option(
        "host",
        help="Address every server listens on (with --smoke/--bench: where to reach them; default: "
        "where the written template's readiness check does).",
    ),
    server_option(
        "gpu_memory_utilization",
        help="Override the value computed for each server from its own devices' free memory.",
    ),
    click.option(
        "--devices-from",
        default=None,
        metavar="ROOT",
        help="Lay out for the GPUs of this root directory or snapshot (default: --root).",
    ),
    server_option(
        "model", default=None, help="Hugging Face id or local model directory (needed to render units)."
    ),
    "served_model_name",
    "max_model_len",
    server_option("max_num_seqs", help="Concurrent sequences per server."),
    server_option("api_key_file", help="File holding the API key clients must send (every server uses it)."),
    server_option("vllm_args", help="More vLLM arguments as one string."),
    "prefix",
    server_option("user", help="Service account (created with its groups if missing)."),
    server_option("timeout", help="Seconds systemd waits for each server to load and answer a completion."),
    server_option("write", help="Write vllm@.service, vllm.target and one env file per server."),
    "check",
    "target",
    click.option(
        "--smoke",
        is_flag=True,
        help="Smoke-test every written instance (its port and key from its file): one line each.",
    ),
    click.option(
        "--bench",
        is_flag=True,
        help="Bench every written instance alone, then all at once: per-instance and aggregate tokens/s.",
    ),
    click.option(
        "--concurrency",
        type=click.IntRange(min=1),
        default=8,
        show_default=True,
        help="With --bench: concurrent requests per instance.",
    ),
    click.option(
        "--requests",
        type=click.IntRange(min=1),
        default=32,
        show_default=True,
        help="With --bench: requests per instance and run (at least --concurrency).",
    ),
    click.option(
        "--max-tokens",
        type=click.IntRange(min=2),
        default=128,
        show_default=True,
        help="With --bench: output tokens per request.",
    ),
    server_option("json"),
)
@pass_app
def instances(
    app: App,
    write: bool,
    check_only: bool,
    target: Path | None,
    user: str,
    timeout_s: int,
    smoke: bool,
    bench: bool,
    concurrency: int,
    requests: int,
    max_tokens: int,
    layout: str,
    count: int | None,
    family: str | None,
    devices_from: str | None,
    server: ServerOptions,
) -> None:
    """Lay vLLM servers out over this host's GPUs; with --write install them under systemd.

    Without --write: the layout (devices, ports, memory per server). Start them all with
    `systemctl start vllm.target`, one with `systemctl restart vllm@N`.
    """
    from rocmdoctor.host_writes import HostWriter

    opts = {
        **server.as_dict(),
        "layout": layout,
        "count": count,
        "family": family,
        "devices_from": devices_from,
    }
    # --smoke/--bench reach the servers where the written template's readiness gate does, unless
    # --host says otherwise (a server written with --host 10.0.0.5 does not answer on 127.0.0.1).
    given = click.get_current_context().get_parameter_source("host") is not ParameterSource.DEFAULT
    reach = opts["host"] if given else None
    if bench:
        if write or check_only or smoke:
            raise UserError(
                "--bench measures what is written and running: not with --write, --check or --smoke"
            )
        if requests < concurrency:
            raise UserError(
                f"--requests {requests} is smaller than --concurrency {concurrency}: send at least that many"
            )
        bench_instances(HostWriter(app.root), reach, opts["as_json"], concurrency, requests, max_tokens)
        return
    if smoke:
        if write or check_only:
            raise UserError("--smoke tests what is written: run --write first, then --smoke")
        smoke_instances(HostWriter(app.root), reach, opts["as_json"])
        return
    # --check alone: what --write would change, written nowhere
    writer = HostWriter(write_root(app, target), check_mode=check_only) if write or check_only else None
    write_layout(app, opts, writer, target, user, timeout_s)
