"""The multi-node layout: each node's vLLM arguments (checked against vLLM 0.32's own rules), the ports
the pre-flight probes, and the plan's proposal of how many nodes a model needs."""

from __future__ import annotations

import pytest

from rocmdoctor.cluster.layout import ClusterLayout, ClusterLayoutError, propose


def test_pipeline_across_nodes_head_and_headless_workers():
    layout = ClusterLayout(3, "10.0.0.1", tensor_parallel_size=8)
    head, worker = layout.vllm_args(0), layout.vllm_args(2)
    assert head == [
        "--pipeline-parallel-size", "3", "--distributed-executor-backend", "mp", "--nnodes", "3",
        "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29501",
    ]  # fmt: skip
    assert worker[-1] == "--headless" and worker[worker.index("--node-rank") + 1] == "2"
    assert layout.ports() == [29501]
    doc = layout.to_json()
    assert doc["pipeline_parallel_size"] == 3 and doc["tensor_parallel_size"] == 8
    assert [n["role"] for n in doc["nodes"]] == ["head", "worker", "worker"]


def test_data_parallel_replicas_across_nodes():
    layout = ClusterLayout(2, "10.0.0.1", layout="data", dp_rpc_port=13345)
    assert layout.vllm_args(0) == [
        "--data-parallel-size", "2", "--data-parallel-size-local", "1",
        "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13345",
    ]  # fmt: skip
    assert layout.vllm_args(1)[-3:] == ["--data-parallel-start-rank", "1", "--headless"]
    assert layout.ports() == [13345] and layout.pipeline_parallel_size == 1


def test_ray_pins_its_ports():
    layout = ClusterLayout(2, "10.0.0.1", backend="ray")
    assert "--distributed-executor-backend" in layout.vllm_args(0) and "ray" in layout.vllm_args(0)
    assert "--headless" not in layout.vllm_args(1)
    worker = layout.ray_start(1, "10.0.0.2")
    assert worker[:3] == ["start", "--address", "10.0.0.1:6379"] and "--min-worker-port" in worker
    assert layout.ray_start(0, "10.0.0.1")[:2] == ["start", "--head"]
    assert layout.ports() == [6379, 6380, 6381]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"nnodes": 1}, "2 nodes or more"),
        ({"layout": "tensor"}, "one of pipeline, data"),
        ({"backend": "slurm"}, "one of mp, ray"),
        ({"layout": "data", "backend": "ray"}, "mp backend"),
    ],
)
def test_layouts_vllm_refuses_are_refused(kwargs, words):
    with pytest.raises(ClusterLayoutError, match=words):
        ClusterLayout(**{"nnodes": 2, "master_addr": "10.0.0.1", **kwargs})
    with pytest.raises(ClusterLayoutError, match="between 0 and 1"):
        ClusterLayout(2, "10.0.0.1").vllm_args(2)


def test_propose_the_fewest_nodes_that_fit():
    # fits when the 8 GPUs of each node hold a share: 3 nodes for a model needing 2.5 nodes
    need = 2.5

    def fits(tp: int, pp: int) -> bool:
        return pp >= need

    proposal = propose(fits, gpus_per_node=8, max_nodes=4)
    assert proposal is not None and proposal.nodes == 3 and proposal.pipeline_parallel_size == 3
    assert proposal.tensor_parallel_size == 8 and proposal.to_json()["layout"] == "pipeline"
    # one node holds it: one data-parallel replica per node (mp; Ray runs no DP across nodes)
    replicas = propose(lambda tp, pp: True, 8, 4)
    assert replicas is not None and replicas.layout == "data" and replicas.nodes == 4
    assert replicas.to_json()["data_parallel_size"] == 4 and replicas.pipeline_parallel_size == 1
    assert propose(lambda tp, pp: True, 8, 4, backend="ray") is None
    assert propose(lambda tp, pp: True, 8, 1) is None  # one node only
    assert propose(lambda tp, pp: False, 8, 4) is None  # not even 4
    assert propose(lambda tp, pp: None, 8, 4) is None  # cannot be judged
    assert propose(fits, 8, 4, backend="ray").backend == "ray"  # type: ignore[union-attr]
