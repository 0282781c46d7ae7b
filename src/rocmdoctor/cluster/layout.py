"""One model across nodes on vLLM's own distributed engine: the layout (tensor parallel within a node,
pipeline parallel across nodes; or data-parallel replicas across nodes), each node's vLLM arguments,
and the ports the ranks meet on. Pure.

Sources (ecosystem-2026-11.md section 2.1; vLLM 0.32 `engine/arg_utils.py`, `config/parallel.py`,
`entrypoints/cli/serve.py`):
- multiprocessing across nodes: the same command on every node with `--nnodes N --node-rank R
  --master-addr HEAD --master-port P`, workers with `--headless`; "common practice": TP = GPUs per
  node, PP = nodes (docs/serving/parallelism_scaling.md);
- data parallel: `--data-parallel-size`, `-size-local`, `-address`, `-rpc-port` on the head, workers
  `--headless --data-parallel-start-rank` (docs/serving/data_parallel_deployment.md);
- Ray: `--distributed-executor-backend ray` over a cluster started with `ray start`; its worker ports
  are random unless pinned (https://docs.ray.io/en/latest/cluster/cli.html), so the units pin them.
- `--headless` is honoured only by `vllm serve` (cli/serve.py `run_headless`): the bundle's
  `bin/vllm-server` runs `vllm.entrypoints.openai.api_server`, which parses the flag and ignores it,
  and the follower then dies with "AssertionError: collective_rpc should not be called on follower
  node" (seen on vLLM 0.32, docs/cluster.md). Workers therefore run `libexec/vllm-serve`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

BACKENDS = ("mp", "ray")
LAYOUTS = ("pipeline", "data")
# vLLM ParallelConfig defaults: the torch.distributed TCPStore on the head, the DP handshake.
DEFAULT_MASTER_PORT = 29501
DEFAULT_DP_RPC_PORT = 29550
# Ray: the GCS port, and the ports `ray start` otherwise picks at random, pinned so a firewall can
# name them (NVIDIA-NeMo/Evaluator PR #709: pinning fixed flaky clusters).
RAY_GCS_PORT = 6379
RAY_NODE_MANAGER_PORT = 6380
RAY_OBJECT_MANAGER_PORT = 6381
RAY_MIN_WORKER_PORT = 10002
RAY_MAX_WORKER_PORT = 10011


class ClusterLayoutError(ValueError):
    """A layout vLLM would refuse; the message says what to change."""


@dataclass(frozen=True)
class ClusterLayout:
    nnodes: int
    master_addr: str
    tensor_parallel_size: int = 1
    layout: str = "pipeline"  # pipeline: PP = nnodes; data: one replica per node
    backend: str = "mp"
    master_port: int = DEFAULT_MASTER_PORT
    dp_rpc_port: int = DEFAULT_DP_RPC_PORT
    # variables every node's processes get (the command puts Ray's visibility rule here)
    environment: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.nnodes < 2:
            raise ClusterLayoutError(f"--nnodes {self.nnodes}: a cluster has 2 nodes or more")
        if self.layout not in LAYOUTS:
            raise ClusterLayoutError(f"layout {self.layout!r}: one of {', '.join(LAYOUTS)}")
        if self.backend not in BACKENDS:
            raise ClusterLayoutError(f"backend {self.backend!r}: one of {', '.join(BACKENDS)}")
        if self.layout == "data" and self.backend != "mp":
            # arg_utils: "`--nnodes` requires `--data-parallel-backend mp`"
            raise ClusterLayoutError("data parallel across nodes runs on the mp backend (vLLM refuses Ray)")
        if self.tensor_parallel_size < 1:
            raise ClusterLayoutError("--tensor-parallel-size must be 1 or more")

    @property
    def pipeline_parallel_size(self) -> int:
        return self.nnodes if self.layout == "pipeline" else 1

    def role(self, rank: int) -> str:
        return "head" if rank == 0 else "worker"

    def vllm_args(self, rank: int) -> list[str]:
        """The vLLM arguments node `rank` adds to the model's own (0 is the head, which serves HTTP)."""
        if not 0 <= rank < self.nnodes:
            raise ClusterLayoutError(f"--node-rank {rank}: between 0 and {self.nnodes - 1}")
        # --tensor-parallel-size is the server's own option (sized against this node's GPUs)
        if self.backend == "ray":
            # one vLLM on the head; the other nodes run only `ray start` (their units)
            return ["--pipeline-parallel-size", str(self.nnodes), "--distributed-executor-backend", "ray"]
        if self.layout == "pipeline":
            args = [
                "--pipeline-parallel-size",
                str(self.nnodes),
                "--distributed-executor-backend",
                "mp",
                "--nnodes",
                str(self.nnodes),
                "--node-rank",
                str(rank),
                "--master-addr",
                self.master_addr,
                "--master-port",
                str(self.master_port),
            ]
        else:
            args = [
                "--data-parallel-size",
                str(self.nnodes),
                "--data-parallel-size-local",
                "1",
                "--data-parallel-address",
                self.master_addr,
                "--data-parallel-rpc-port",
                str(self.dp_rpc_port),
            ]
            if rank:
                args += ["--data-parallel-start-rank", str(rank)]
        return args + (["--headless"] if rank else [])

    def ports(self) -> list[int]:
        """The TCP ports the head must accept from the other nodes (the pre-flight's matrix).

        Gloo and NCCL also open connections between ranks on ephemeral ports: a firewall between the
        nodes must allow the cluster network as a whole; these are the ones that can be named."""
        if self.backend == "ray":
            return [RAY_GCS_PORT, RAY_NODE_MANAGER_PORT, RAY_OBJECT_MANAGER_PORT]
        return [self.master_port] if self.layout == "pipeline" else [self.dp_rpc_port]

    def ray_start(self, rank: int, node_address: str) -> list[str]:
        """`ray start` arguments for node `rank` (its unit runs it with --block), every port pinned."""
        pinned = [
            "--node-ip-address",
            node_address,
            "--node-manager-port",
            str(RAY_NODE_MANAGER_PORT),
            "--object-manager-port",
            str(RAY_OBJECT_MANAGER_PORT),
            "--min-worker-port",
            str(RAY_MIN_WORKER_PORT),
            "--max-worker-port",
            str(RAY_MAX_WORKER_PORT),
            "--block",
        ]
        if rank == 0:
            return ["start", "--head", "--port", str(RAY_GCS_PORT), "--include-dashboard", "false", *pinned]
        return ["start", "--address", f"{self.master_addr}:{RAY_GCS_PORT}", *pinned]

    def to_json(self) -> dict[str, object]:
        return {
            "nnodes": self.nnodes,
            "layout": self.layout,
            "backend": self.backend,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "data_parallel_size": self.nnodes if self.layout == "data" else 1,
            "master_addr": self.master_addr,
            "ports": self.ports(),
            "nodes": [
                {"rank": r, "role": self.role(r), "vllm_args": self.vllm_args(r)} for r in range(self.nnodes)
            ],
        }


@dataclass(frozen=True)
class Proposal:
    nodes: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    backend: str
    why: str
    layout: str = "pipeline"  # pipeline: one model over the nodes; data: one replica per node

    def to_json(self) -> dict[str, object]:
        return {
            "nodes": self.nodes,
            "layout": self.layout,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "data_parallel_size": self.nodes if self.layout == "data" else 1,
            "backend": self.backend,
            "why": self.why,
        }


def propose(
    fits: Callable[[int, int], bool | None], gpus_per_node: int, max_nodes: int, backend: str = "mp"
) -> Proposal | None:
    """How `max_nodes` nodes of `gpus_per_node` GPUs serve the model: when one node holds it, one
    data-parallel replica per node (mp only: vLLM runs DP across nodes on it); else the fewest nodes
    on which it fits, TP = the GPUs of a node, PP = the nodes.

    `fits(tp, pp)` is the memory plan's verdict for that layout (None: cannot be judged). None is
    returned when it cannot be judged, when there is one node, or when not even `max_nodes` hold it."""
    if backend not in BACKENDS:
        raise ClusterLayoutError(f"backend {backend!r}: one of {', '.join(BACKENDS)}")
    alone = fits(gpus_per_node, 1)
    if alone is None or max_nodes < 2:
        return None
    if alone:
        if backend != "mp":
            return None
        return Proposal(
            max_nodes,
            gpus_per_node,
            1,
            backend,
            f"fits one node of {gpus_per_node} GPU(s): {max_nodes} replicas, one per node (data parallel "
            "behind the head's endpoint; independent servers behind a balancer serve as well)",
            layout="data",
        )
    for nodes in range(2, max_nodes + 1):
        if fits(gpus_per_node, nodes):
            return Proposal(
                nodes,
                gpus_per_node,
                nodes,
                backend,
                f"does not fit one node of {gpus_per_node} GPU(s); fits {nodes} nodes with tensor parallel "
                f"{gpus_per_node} within each node and pipeline parallel {nodes} across them",
            )
    return None
