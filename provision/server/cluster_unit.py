"""The units of one node of a multi-node vLLM (cluster_layout): the head is `vllm.service` with the
cluster's arguments (it serves HTTP, and its readiness gate passes only once every worker joined);
a worker is `vllm-worker.service`, the same unit code and hardening, running `vllm serve --headless`
through `libexec/vllm-serve` (why: provision/server/vllm_serve.py). Both get the node's advertised address
and socket interface in their environment.
"""

from __future__ import annotations

from dataclasses import replace

from rocmdoctor.cluster.layout import ClusterLayout
from rocmdoctor.host_files import shipped_text
from rocmdoctor.provision.server import unit_syntax
from rocmdoctor.provision.server.args import ServerArgs
from rocmdoctor.provision.server.unit import (
    DEFAULT_LOAD_TIMEOUT_S,
    FileSpec,
    ServiceLayout,
    UnitError,
    file_specs,
    helper_specs,
    ready_gate_argv,
    render_unit,
)
from rocmdoctor.vllm.environment import BUNDLE_SETTINGS

WORKER_UNIT = "vllm-worker.service"
RAY_UNITS = ("ray-head.service", "ray-worker.service")  # by role: the head's, every other node's
# Ray's own CLI (ray/scripts/scripts.py), run by the bundle's Python: the same Ray on every node
RAY_CLI = ("-m", "ray.scripts.scripts")
SERVE_SCRIPT = "libexec/vllm-serve"


def node_environment(advertise: str, socket_ifname: str | None) -> dict[str, str]:
    """What vLLM, torch.distributed (Gloo) and RCCL read to pick this node's address and interface."""
    env = {"VLLM_HOST_IP": advertise}
    if socket_ifname:
        problem = unit_syntax.ifname_problem(socket_ifname)
        if problem:
            raise UnitError(f"--socket-ifname: {problem}")
        env.update({"GLOO_SOCKET_IFNAME": socket_ifname, "NCCL_SOCKET_IFNAME": socket_ifname})
    return env


def node_args(
    args: ServerArgs, cluster: ClusterLayout, rank: int, advertise: str, ifname: str | None
) -> ServerArgs:
    return replace(
        args,
        extra=[*args.extra, *cluster.vllm_args(rank)],
        environment={**args.environment, **node_environment(advertise, ifname), **cluster.environment},
        notes=[*args.notes, f"cluster: node {rank} of {cluster.nnodes} ({cluster.role(rank)})"],
    )


def process(
    args: ServerArgs,
    cluster: ClusterLayout,
    rank: int,
    advertise: str,
    ifname: str | None,
    layout: ServiceLayout,
    timeout_s: int = DEFAULT_LOAD_TIMEOUT_S,
) -> dict[str, object]:
    """What the node's unit runs, for a host without systemd (the playbook's detached start): its
    ExecStart argv, the environment its Environment= sets besides the service account's paths, and
    the head's readiness gate (ExecStartPost; None on a worker)."""
    node = node_args(args, cluster, rank, advertise, ifname)
    if cluster.backend == "ray" and rank:
        return {
            "exec_start": [layout.python, *RAY_CLI, *cluster.ray_start(rank, advertise)],
            "environment": {**BUNDLE_SETTINGS, **node.environment},
            "ready_gate": None,
        }
    server = [layout.server] if rank == 0 else [layout.python, f"{layout.prefix}/{SERVE_SCRIPT}"]
    return {
        "exec_start": [*server, *node.argv()],
        "environment": {**BUNDLE_SETTINGS, **node.environment},
        "ready_gate": ready_gate_argv(node, layout, timeout_s) if rank == 0 else None,
    }


def specs(
    args: ServerArgs,
    cluster: ClusterLayout,
    rank: int,
    advertise: str,
    ifname: str | None,
    layout: ServiceLayout,
    user: str,
    api_key: str | None,
    timeout_s: int = DEFAULT_LOAD_TIMEOUT_S,
) -> list[FileSpec]:
    """This node's files: the head's are a server's (unit, env file, readiness gate, health units)."""
    node = node_args(args, cluster, rank, advertise, ifname)
    if cluster.backend == "ray":
        # every node runs `ray start --block`; the head also runs the one vLLM, which places its ranks on Ray
        ray = ServerArgs(settings=[], extra=cluster.ray_start(rank, advertise), environment=node.environment)
        name = RAY_UNITS[0 if rank == 0 else 1]
        unit = render_unit(
            ray,
            layout,
            user,
            timeout_s,
            unit_name=name,
            server=[layout.python, *RAY_CLI],
            ready_gate=False,
            description=f"Ray {cluster.role(rank)} for {args.served_model_name}",
        )
        ray_spec = FileSpec(f"{layout.unit_dir}/{name}", unit, 0o644)
        if rank == 0:
            return [*file_specs(node, layout, user, api_key, timeout_s), ray_spec]
        return [ray_spec, *helper_specs(layout)]  # its unit's ExecStartPre is stop-leftovers
    if rank == 0:
        return file_specs(node, layout, user, api_key, timeout_s)
    script = f"{layout.prefix}/{SERVE_SCRIPT}"
    unit = render_unit(
        node, layout, user, timeout_s, unit_name=WORKER_UNIT, server=[layout.python, script], ready_gate=False
    )
    return [
        FileSpec(f"{layout.unit_dir}/{WORKER_UNIT}", unit, 0o644),
        FileSpec(script, shipped_text("rocmdoctor.provision.server", "vllm_serve.py"), 0o755),
        *helper_specs(layout),
    ]
