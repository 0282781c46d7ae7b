"""`rocmdoctor cluster` and `plan --nodes` in-process: the comparison from documents (exit 0, 1, 2),
the probe against a real listener on loopback, the head's and a worker's units on a recorded
MI300X host, and the plan's proposal for a model no single node holds."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
from pathlib import Path

from conftest import FIXTURES
from harness.cli import rocmdoctor
from rocmdoctor.host_sockets import listen

CLUSTER = FIXTURES / "cluster"
MI300X = FIXTURES / "hosts" / "mi300x"
UNIT_OPTIONS = ["--model", "/srv/models/llama", "--served-model-name", "llama", "--max-model-len", "4096"]
UNIT_OPTIONS += ["--gpu-memory-utilization", "0.9"]


def recorded_input(tmp_path: Path, change=None) -> Path:
    nodes = [json.loads((CLUSTER / f"node{i}.json").read_text()) for i in (0, 1)]
    if change:
        change(nodes)
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"nodes": nodes, "probes": []}))
    return path


def test_check_exit_codes_and_report(tmp_path: Path):
    good = rocmdoctor("cluster", "check", "--input", str(recorded_input(tmp_path)), "--json")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["ok"] is True

    def other_bundle(nodes):
        nodes[1]["bundle"]["digest"] = "sha256:" + "9" * 64

    bad = rocmdoctor("cluster", "check", "--input", str(recorded_input(tmp_path, other_bundle)))
    assert bad.returncode == 1
    assert "node1: bundle.digest_differs" in bad.stdout and "-> install node0's bundle" in bad.stdout
    assert "FAULTS" in bad.stdout


def test_check_refuses_hostile_input_in_words(tmp_path: Path):
    cases = {
        "garbage": b"\x00\xff not json",
        "empty-nodes": b'{"nodes": []}',
        "wrong-type": b'{"nodes": [{"node": "a", "ports": "29501"}]}',
    }
    for name, raw in cases.items():
        path = tmp_path / name
        path.write_bytes(raw)
        done = rocmdoctor("cluster", "check", "--input", str(path))
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr and "cluster facts --json" in done.stderr, done.stderr
    absent = rocmdoctor("cluster", "check", "--input", str(tmp_path / "absent.json"))
    assert absent.returncode == 2 and "No such file" in absent.stderr and "Traceback" not in absent.stderr
    os.mkfifo(tmp_path / "fifo")  # nothing writes to it: a read would block forever
    fifo = rocmdoctor("cluster", "check", "--input", str(tmp_path / "fifo"))
    assert fifo.returncode == 2 and "not a regular file" in fifo.stderr, fifo.stderr
    stdin = rocmdoctor("cluster", "check", "--input", "-", input=recorded_input(tmp_path).read_text())
    assert stdin.returncode == 0, stdin.stderr


def test_probe_against_a_real_listener_and_a_closed_port():
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]
    reached: list[int] = []
    listener = threading.Thread(target=lambda: reached.extend(listen("127.0.0.1", [port], 3.0)))
    listener.start()
    try:
        done = rocmdoctor("cluster", "probe", "--name", "a", "--peer", f"b=127.0.0.1:{port}", "--json")
    finally:
        listener.join()
    assert done.returncode == 0, done.stdout + done.stderr
    row = json.loads(done.stdout)["probes"][0]
    assert row == {
        "source": "a",
        "target": "b",
        "address": "127.0.0.1",
        "port": port,
        "ok": True,
        "error": None,
    }
    assert reached == [port]
    closed = rocmdoctor(
        "cluster", "probe", "--name", "a", "--peer", f"127.0.0.1:{port}", "--wait", "0", "--json"
    )
    assert closed.returncode == 1
    assert json.loads(closed.stdout)["probes"][0]["error"] == "refused"
    for bad in ("nohost", "b=10.0.0.1", "b=10.0.0.1:0", "b=bad_host!:80"):
        done = rocmdoctor("cluster", "probe", "--name", "a", "--peer", bad)
        assert done.returncode == 2 and "NAME=ADDRESS:PORT" in done.stderr, (bad, done.stderr)


def test_listen_refuses_an_address_that_is_not_here():
    done = rocmdoctor("cluster", "listen", "--address", "192.0.2.123", "--port", "29501", "--seconds", "1")
    assert done.returncode == 2 and "cannot listen on 192.0.2.123:29501" in done.stderr, done.stderr


def test_head_and_worker_units_on_a_recorded_host():
    common = [
        "cluster", "unit", "--nnodes", "2", "--master-addr", "10.0.0.1", "--socket-ifname", "ens1",
        *UNIT_OPTIONS, "--json",
    ]  # fmt: skip
    head = rocmdoctor(*common, "--node-rank", "0", "--advertise", "10.0.0.1", root=MI300X)
    worker = rocmdoctor(*common, "--node-rank", "1", "--advertise", "10.0.0.2", root=MI300X)
    assert head.returncode == 0 and worker.returncode == 0, head.stderr + worker.stderr
    head_doc, worker_doc = json.loads(head.stdout), json.loads(worker.stdout)
    assert head_doc["path"] == "/etc/systemd/system/vllm.service" and head_doc["role"] == "head"
    assert worker_doc["path"] == "/etc/systemd/system/vllm-worker.service" and worker_doc["role"] == "worker"
    head_start = next(x for x in head_doc["unit"].splitlines() if x.startswith("ExecStart="))
    worker_start = next(x for x in worker_doc["unit"].splitlines() if x.startswith("ExecStart="))
    assert head_start.startswith("ExecStart=/opt/rocmdoctor/current/bin/vllm-server ")
    assert "--nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29501" in head_start
    assert "--headless" not in head_start
    # the worker runs `vllm serve` (bin/vllm-server ignores --headless) and has no HTTP gate of its own
    assert worker_start.startswith(
        "ExecStart=/opt/rocmdoctor/current/bin/python3 /opt/rocmdoctor/libexec/vllm-serve "
    )
    assert worker_start.endswith("--node-rank 1 --master-addr 10.0.0.1 --master-port 29501 --headless")
    assert "ExecStartPost=\n" in worker_doc["unit"] and "wait-ready" in head_doc["unit"]
    assert "VLLM_HOST_IP=10.0.0.2 GLOO_SOCKET_IFNAME=ens1 NCCL_SOCKET_IFNAME=ens1" in worker_doc["unit"]
    # the same hardening as every unit
    for line in ("ProtectSystem=strict", "NoNewPrivileges=yes", "KillMode=control-group"):
        assert line in worker_doc["unit"]
    bad = rocmdoctor(*common, "--node-rank", "2", "--advertise", "10.0.0.3", root=MI300X)
    assert bad.returncode == 2 and "--node-rank 2: between 0 and 1" in bad.stderr


def test_worker_units_written_and_converged(tmp_path: Path):
    from harness.trees import account_root

    root = account_root(tmp_path)
    args = [
        "cluster", "unit", "--write", "--target", str(root), "--nnodes", "2", "--node-rank", "1",
        "--master-addr", "10.0.0.1", "--advertise", "10.0.0.2", *UNIT_OPTIONS, "--json",
    ]  # fmt: skip
    first = rocmdoctor(*args, root=MI300X)
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert doc["changed"] is True and doc["schema_version"] == 1
    script = root / "opt/rocmdoctor/libexec/vllm-serve"
    assert script.stat().st_mode & 0o777 == 0o755 and "run_headless" in script.read_text()
    again = rocmdoctor(*args, root=MI300X)
    assert json.loads(again.stdout)["changed"] is False


def header_only_model(directory: Path, parameters: int) -> Path:
    """Llama-3.1-70B's real config.json and one safetensors header declaring its bf16 weights (the
    plan reads headers only, never the weights)."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(
        (FIXTURES / "model_configs/llama-3.1-70b-instruct/config.json").read_bytes()
    )
    header = {
        "model.embed_tokens.weight": {
            "dtype": "BF16",
            "shape": [parameters],
            "data_offsets": [0, 2 * parameters],
        }
    }
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob)
    return directory


def test_plan_proposes_nodes_for_a_model_one_node_cannot_hold(tmp_path: Path):
    model = header_only_model(tmp_path / "llama-70b", 70_553_706_496)
    # two 64 GiB GPUs per node (MI210): 131 GiB of weights fit no single node, two nodes hold them
    args = [
        "plan",
        "--model",
        str(model),
        "--memory",
        "64GiB",
        "--tensor-parallel-size",
        "2",
        "--max-model-len",
        "8192",
    ]
    alone = rocmdoctor(*args, "--json")
    assert alone.returncode == 1 and json.loads(alone.stdout)["cluster"] is None
    across = rocmdoctor(*args, "--nodes", "4", "--json")
    assert across.returncode == 0, across.stderr
    proposal = json.loads(across.stdout)["cluster"]
    assert proposal["nodes"] == 2 and proposal["tensor_parallel_size"] == 2
    assert proposal["pipeline_parallel_size"] == 2 and proposal["backend"] == "mp"
    text = rocmdoctor(*args, "--nodes", "4")
    assert "across nodes: 2 nodes" in text.stdout
    one = rocmdoctor(
        "plan", "--model", str(model), "--memory", "8GiB", "--max-model-len", "8192", "--nodes", "2"
    )
    assert one.returncode == 1 and "does not fit 2 nodes" in one.stdout
    # a node of four 256 GiB GPUs holds it: with three nodes, one replica on each
    big = ["plan", "--model", str(model), "--memory", "256GiB", "--tensor-parallel-size", "4"]
    replicas = rocmdoctor(*big, "--max-model-len", "8192", "--nodes", "3", "--json")
    assert replicas.returncode == 0, replicas.stderr
    doc = json.loads(replicas.stdout)["cluster"]
    assert doc["layout"] == "data" and doc["data_parallel_size"] == 3 and doc["nodes"] == 3


def test_gpu_facts_come_from_the_diagnosis_of_each_host(tmp_path: Path):
    """Two recorded hosts (an MI300X and an MI350X node): the GPUs are the diagnosis's, and the
    comparison names the worker whose GPUs differ from the head's."""
    docs = []
    for name in ("mi300x", "mi350x"):
        done = rocmdoctor("cluster", "facts", "--json", "--name", name, "--advertise", "10.0.0.1",
                          root=FIXTURES / "hosts" / name)  # fmt: skip
        assert done.returncode == 0, done.stderr
        docs.append(json.loads(done.stdout))
    assert [g["model"] for g in docs[0]["gpus"]] == ["gfx942 0x74a1"]
    assert [g["model"] for g in docs[1]["gpus"]] == ["gfx950 0x75a0"]
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"nodes": docs}))
    report = json.loads(rocmdoctor("cluster", "check", "--json", "--input", str(path)).stdout)
    named = {(f["node"], f["id"]) for f in report["findings"]}
    assert ("mi350x", "gpu.model_differs") in named, named  # one GPU each, of another model
    # a captured tree has no interfaces of its own: the advertised address is not local there
    assert ("mi300x", "address.not_local") in named


def test_ray_units_pin_ports_and_keep_rocr_masks(tmp_path: Path):
    from harness.trees import account_root

    common = [
        "cluster", "unit", "--backend", "ray", "--nnodes", "2", "--master-addr", "10.0.0.1", *UNIT_OPTIONS,
    ]  # fmt: skip
    root = account_root(tmp_path)
    head = rocmdoctor(*common, "--node-rank", "0", "--advertise", "10.0.0.1", "--write", "--target", str(root),
                      root=MI300X)  # fmt: skip
    assert head.returncode == 0, head.stderr
    units = root / "etc/systemd/system"
    vllm, ray_head = (units / "vllm.service").read_text(), (units / "ray-head.service").read_text()
    assert "--pipeline-parallel-size 2 --distributed-executor-backend ray" in vllm and "--nnodes" not in vllm
    assert "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES=1" in vllm
    start = next(x for x in ray_head.splitlines() if x.startswith("ExecStart="))
    assert start.startswith(
        "ExecStart=/opt/rocmdoctor/current/bin/python3 -m ray.scripts.scripts start --head"
    )
    assert "--port 6379" in start and "--min-worker-port 10002 --max-worker-port 10011" in start
    worker = rocmdoctor(*common, "--node-rank", "1", "--advertise", "10.0.0.2", "--json", root=MI300X)
    doc = json.loads(worker.stdout)
    assert doc["path"] == "/etc/systemd/system/ray-worker.service" and doc["ready_gate"] is None
    assert doc["exec_start"][3:6] == ["start", "--address", "10.0.0.1:6379"]
    assert doc["cluster"]["ports"] == [6379, 6380, 6381]
    refused = rocmdoctor(
        *common, "--node-rank", "1", "--advertise", "10.0.0.2", "--layout", "data", root=MI300X
    )
    assert refused.returncode == 2 and "mp backend" in refused.stderr
