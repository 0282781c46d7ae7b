"""`rocmdoctor cluster`: the pre-flight of a multi-node vLLM, and the units of one of its nodes.

On each node: `cluster facts --json` (what this node has), `cluster listen` (the declared ports
accept for a while), `cluster probe --peer NAME=ADDR:PORT` (this node connects to the others).
Anywhere: `cluster check --input FILE` compares the documents and names each fault on its node.
The playbook (playbooks/cluster.yml) runs exactly these over SSH. `cluster unit` writes the head's
or a worker's units. docs/cluster.md.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rocmdoctor import params
from rocmdoctor.commands.common import App, UserError, emit_json, pass_app, write_root
from rocmdoctor.commands.server_options import SINGLE_SERVER_GROUP, ServerOptions, server_options
from rocmdoctor.model import EXIT_FAILURES, EXIT_OK, envelope

if TYPE_CHECKING:
    from rocmdoctor.cluster.layout import ClusterLayout
from rocmdoctor.textnum import parse_decimal

MAX_LISTEN_S = 600.0
# A refused connect while the peer's listener may still be starting is tried again until this passes.
PROBE_PATIENCE_S = 15.0


@click.group()
def cluster() -> None:
    """Pre-flight and units for one model across nodes (vLLM's own distributed engine)."""


def _gpus(app: App) -> list[dict[str, Any]]:
    from rocmdoctor.checks import facts
    from rocmdoctor.registry import Context, Options

    ctx = Context(app.host(), Options())
    # the model: the ISA and the PCI device id (an MI300X and an MI300A share gfx942), and the memory
    return [
        {
            "model": g.gfx if g.device_id is None else f"{g.gfx} 0x{g.device_id:04x}",
            "node": g.node,
            "pci_slot": g.pci_slot,
            "vram_total": g.vram_total,
        }
        for g in facts.gpus(ctx)
    ]


def _ifname(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An interface name (or NCCL's list of them): it reaches the units' Environment= (exit 2 otherwise)."""
    from rocmdoctor.provision.server.unit_syntax import ifname_problem

    problem = ifname_problem(value) if value is not None else None
    if problem:
        raise click.BadParameter(problem, ctx=ctx, param=param)
    return value


@cluster.command("facts")
@click.option("--name", default=None, help="This node's name in the report (default: its hostname).")
@click.option(
    "--advertise",
    type=params.HostName(),
    default=None,
    help="This node's address for the others "
    "(what VLLM_HOST_IP / --master-addr say; default: $VLLM_HOST_IP).",
)
@click.option(
    "--socket-ifname",
    default=None,
    callback=_ifname,
    help="The interface NCCL/GLOO_SOCKET_IFNAME name (default: those variables).",
)
@click.option(
    "--model",
    "model_dir",
    type=params.AbsolutePath(),
    default=None,
    help="The model directory to digest (the same path on every node).",
)
@click.option("--port", "ports", type=params.Port(), multiple=True, help="A port the backend uses (repeat).")
@params.prefix_option("Where the bundle is installed (its qualification record is read).")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the facts document (what `cluster check` reads)."
)
@pass_app
def facts_command(
    app: App,
    name: str | None,
    advertise: str | None,
    socket_ifname: str | None,
    model_dir: str | None,
    ports: tuple[int, ...],
    prefix: str,
    as_json: bool,
) -> None:
    """This node's facts for the cluster pre-flight."""
    from rocmdoctor.checks.host_rules import rules
    from rocmdoctor.cluster.facts import NodeSettings, collect

    settings = NodeSettings(name, advertise, socket_ifname, prefix, model_dir, tuple(sorted(set(ports))))
    doc = collect(app.host(), settings, _gpus(app), rules()["visibility"]["variables"])
    if as_json:
        emit_json(doc)
        return
    click.echo(f"node {doc['node']}: advertises {doc['advertise']}, addresses {', '.join(doc['addresses'])}")
    bundle = doc["bundle"]
    click.echo(f"bundle {bundle['tag']} {bundle['digest']} qualified={bundle['qualified']}")
    if doc["model"]:
        click.echo(f"model {doc['model']['path']}: {len(doc['model']['files'])} files")


@cluster.command("listen")
@click.option("--address", type=params.HostName(), required=True, help="The advertised address to listen on.")
@click.option("--port", "ports", type=params.Port(), multiple=True, required=True, help="Repeat per port.")
@click.option(
    "--seconds",
    type=params.Duration(),
    default=30.0,
    show_default=True,
    help="How long the ports accept (the others probe meanwhile).",
)
@click.option("--json", "as_json", is_flag=True)
def listen_command(address: str, ports: tuple[int, ...], seconds: float, as_json: bool) -> None:
    """Accept connections on the declared ports for a while (the matrix's other side)."""
    from rocmdoctor.host_sockets import ListenError, listen

    if seconds > MAX_LISTEN_S:
        raise UserError(f"--seconds {seconds:g}: at most {MAX_LISTEN_S:g}")
    try:
        reached = listen(address, sorted(set(ports)), seconds)
    except ListenError as exc:
        raise UserError(
            f"{exc.strerror}: stop what holds the port (a running vLLM: check before starting it), or check "
            "that the address is this node's"
        ) from None
    if as_json:
        emit_json(
            envelope(
                address=address,
                ports=sorted(set(ports)),
                reached=reached,
            )
        )
    else:
        click.echo(f"{address}: reached on {', '.join(map(str, reached)) or 'no port'}")


def _peer(text: str) -> tuple[str, str, int]:
    """NAME=ADDRESS:PORT (or ADDRESS:PORT, named by its address); [v6]:port for IPv6."""
    name, _, rest = text.rpartition("=")
    host, sep, port = rest.rpartition(":")
    host = host.strip("[]")
    problem = params.host_problem(host) if sep else "no :PORT"
    number = parse_decimal(port, 5)  # ASCII digits only: '²' and a 5,000-digit port are refused, not int()'d
    if problem or number is None or not 1 <= number <= 65535:
        raise UserError(
            f"--peer {text[:200]!r}: give NAME=ADDRESS:PORT, e.g. node1=10.0.0.2:29501 ({problem or 'port'})"
        )
    return name or host, host, number


@cluster.command("probe")
@click.option("--name", required=True, help="This node's name (the matrix's source).")
@click.option(
    "--peer", "peers", multiple=True, required=True, help="NAME=ADDRESS:PORT to connect to (repeat)."
)
@click.option(
    "--timeout",
    "timeout_s",
    type=params.Duration(),
    default=3.0,
    show_default=True,
    help="Seconds one connect may take (a firewall that drops packets uses all of it).",
)
@click.option(
    "--wait",
    "wait_s",
    type=params.Duration(max_s=600.0, inclusive=True),
    default=PROBE_PATIENCE_S,
    show_default=True,
    help="Seconds a refused port is tried again (the peer's `cluster listen` may still be starting).",
)
@click.option("--json", "as_json", is_flag=True)
def probe_command(name: str, peers: tuple[str, ...], timeout_s: float, wait_s: float, as_json: bool) -> None:
    """Connect to each peer's declared port: the matrix row of this node."""
    from rocmdoctor.host_sockets import connect

    rows = []
    for peer, address, port in map(_peer, peers):
        deadline = time.monotonic() + wait_s
        while True:
            result = connect(address, port, timeout_s)
            if result.ok or result.error != "refused" or time.monotonic() > deadline:
                break
            time.sleep(0.3)  # the peer's listener is not up yet
        rows.append(
            {
                "source": name,
                "target": peer,
                "address": address,
                "port": port,
                "ok": result.ok,
                "error": result.error,
            }
        )
    if as_json:
        emit_json(envelope(probes=rows))
    else:
        for row in rows:
            click.echo(
                f"{name} -> {row['target']} {row['address']}:{row['port']}: "
                f"{'ok' if row['ok'] else row['error']}"
            )
    sys.exit(EXIT_OK if all(r["ok"] for r in rows) else EXIT_FAILURES)


@cluster.command("check")
@click.option(
    "--input",
    "source",
    required=True,
    help='A file (or "-": stdin) holding {"nodes": [facts of each node, the head first], "probes": [...]}.',
)
@click.option("--json", "as_json", is_flag=True)
def check_command(source: str, as_json: bool) -> None:
    """Compare the nodes' facts and the connect matrix: exit 0 when no fault, 1 otherwise."""
    from rocmdoctor.cluster.compare import judge, report
    from rocmdoctor.cluster.documents import MAX_INPUT_BYTES, parse_input
    from rocmdoctor.documents import DocumentError
    from rocmdoctor.rendering.rows import row_lines
    from rocmdoctor.rootfs import read_regular

    try:
        # a regular file only: a FIFO or a device is refused at once, never read from
        raw = (
            sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
            if source == "-"
            else read_regular(source, MAX_INPUT_BYTES)
        )
        nodes, probes = parse_input(raw, source)
    except OSError as exc:
        raise UserError(f"--input {source}: {exc.strerror or exc}") from None
    except DocumentError as exc:
        raise UserError(
            f"{exc}; give the documents `cluster facts --json` and `cluster probe --json` print"
        ) from None
    findings = judge(nodes, probes)
    document = report(nodes, probes, findings)
    if as_json:
        emit_json(document)
    else:
        for line in row_lines(findings):
            click.echo(line)
        click.echo(
            f"cluster of {len(document['nodes'])} nodes (head {document['head']}): "
            + ("ok" if document["ok"] else "FAULTS")
        )
    sys.exit(EXIT_OK if document["ok"] else EXIT_FAILURES)


def ray_environment() -> dict[str, str]:
    """Ray must not re-mask each worker through ROCR_VISIBLE_DEVICES (vllm#12572): the rule's data."""
    from rocmdoctor.checks.host_rules import rules

    return {rules()["visibility"]["ray_noset"]: "1"}


def written_under(runs: dict[str, Any], target: str, written: str) -> dict[str, Any]:
    """The commands as this host finds them when the unit's own files were written under --target."""

    def here(argv: list[str] | None) -> list[str] | None:
        if argv is None:
            return None
        return [target.rstrip("/") + word if word.startswith(written) else word for word in argv]

    return {**runs, "exec_start": here(runs["exec_start"]), "ready_gate": here(runs["ready_gate"])}


def cluster_of(
    nnodes: int, master_addr: str, tp: int, cluster_layout: str, backend: str, master_port: int | None
) -> ClusterLayout:
    """The cluster's layout from `cluster unit`'s options (ports: vLLM's defaults unless given)."""
    from rocmdoctor.cluster.layout import DEFAULT_DP_RPC_PORT, DEFAULT_MASTER_PORT, ClusterLayout

    return ClusterLayout(
        nnodes,
        master_addr,
        tp,
        cluster_layout,
        backend,
        master_port=master_port or DEFAULT_MASTER_PORT,
        dp_rpc_port=master_port or DEFAULT_DP_RPC_PORT,
        environment=ray_environment() if backend == "ray" else {},
    )


@cluster.command("unit", cls=params.VllmPassThrough)
@server_options("write", "check", "target", "user", "timeout")
@click.option("--nnodes", type=params.Count(2, 1024), required=True, help="Nodes in the cluster.")
@click.option("--node-rank", type=params.Count(0, 1023), required=True, help="This node (0: the head).")
@click.option("--master-addr", type=params.HostName(), required=True, help="The head's advertised address.")
@click.option(
    "--master-port",
    type=params.Port(),
    default=None,
    help="The head's rendezvous port (default: vLLM's 29501, or 29550 for data parallel).",
)
@click.option(
    "--advertise", type=params.HostName(), required=True, help="This node's address (VLLM_HOST_IP)."
)
@click.option(
    "--socket-ifname",
    default=None,
    callback=_ifname,
    help="Interface for Gloo/NCCL (GLOO_/NCCL_SOCKET_IFNAME).",
)
@click.option(
    "--layout",
    "cluster_layout",
    type=click.Choice(["pipeline", "data"]),
    default="pipeline",
    show_default=True,
    help="pipeline: PP across nodes; data: one replica per node.",
)
@click.option(
    "--backend",
    type=click.Choice(["mp", "ray"]),
    default="mp",
    show_default=True,
    help="mp: vLLM's own processes on every node; ray: a Ray head and workers (ray-*.service), one vLLM on the head.",
)
@SINGLE_SERVER_GROUP
@pass_app
def unit_command(
    app: App,
    write: bool,
    check_only: bool,
    target: Path | None,
    user: str,
    timeout_s: int,
    nnodes: int,
    node_rank: int,
    master_addr: str,
    master_port: int | None,
    advertise: str,
    socket_ifname: str | None,
    cluster_layout: str,
    backend: str,
    server: ServerOptions,
) -> None:
    """The units of this node: the head's vllm.service, or a worker's vllm-worker.service (headless)."""
    from rocmdoctor.cluster.layout import ClusterLayoutError
    from rocmdoctor.commands.server_setup import api_key, resolve_args, show_or_write
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.provision.server.cluster_unit import process
    from rocmdoctor.provision.server.cluster_unit import specs as node_specs
    from rocmdoctor.provision.server.unit import ServiceLayout, UnitError

    opts = server.as_dict()
    try:
        layout = cluster_of(
            nnodes, master_addr, server.tensor_parallel_size or 1, cluster_layout, backend, master_port
        )
        args = resolve_args(app, opts)
        service = ServiceLayout(prefix=opts["prefix"])
        files = node_specs(
            args, layout, node_rank, advertise, socket_ifname, service, user, api_key(opts), timeout_s
        )
        # what the unit runs, for the playbook's start where systemd does not run
        runs = process(args, layout, node_rank, advertise, socket_ifname, service, timeout_s)
        if write and target is not None:
            runs = written_under(runs, str(target), f"{service.prefix}/libexec/")
    except (ClusterLayoutError, UnitError) as exc:
        raise UserError(str(exc)) from None
    writer = HostWriter(write_root(app, target), check_mode=check_only) if write or check_only else None
    show_or_write(
        files,
        user,
        writer,
        opts["as_json"],
        cluster=layout.to_json(),
        role=layout.role(node_rank),
        **runs,
    )
