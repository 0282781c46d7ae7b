"""The cluster pre-flight by the real ansible-playbook (playbooks/cluster.yml) over real SSH on three
fake nodes (network namespaces) joined by veth pairs on one bridge: a good set-up passes, and each
fault (wrong advertised address, down interface, dropped port, another bundle, another model file)
is named on the node where it is. Each node's /opt is its own: its bundle record and model live there.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pytest

from harness import cluster_net
from harness.fleet import SshFleet, run_playbook

pytestmark = pytest.mark.ssh

PORT = 29501
MODEL = "/opt/models/tiny"
PREFIX = "/opt/rocmdoctor"
DIGEST = "sha256:" + hashlib.sha256(b"vllm0.32.0-rocm7.1.0-gfx942 parts").hexdigest()


def write_node_files(host, digest: str = DIGEST, weights: bytes = b"\x08" + bytes(63)) -> None:
    """What install and a model download leave on a node: the bundle's qualification record
    (provision/bundle/qualify.py's fields) and a model directory at the same path everywhere."""
    current = host.opt / "rocmdoctor" / "current"
    current.mkdir(parents=True, exist_ok=True)
    record = {"tag": "vllm0.32.0-rocm7.1.0-gfx942", "bundle_digest": digest, "qualified": True}
    (current / ".rocmdoctor-qualification.json").write_text(json.dumps(record))
    model = host.opt / "models" / "tiny"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}\n')
    (model / "model.safetensors").write_bytes(weights)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = tmp_path_factory.mktemp("cluster-preflight")
    fleet = SshFleet("clu", work)
    net = None
    try:
        hosts = [fleet.add(f"node{i}") for i in range(3)]
        net = cluster_net.connect("clu", hosts)
        for host in hosts:
            write_node_files(host)
            host.hostvars.update(
                rocmdoctor_cluster_advertise=net.addresses[host.name],
                rocmdoctor_cluster_ifname=cluster_net.IFNAME,
            )
        yield fleet, hosts, net
    finally:
        if net is not None:
            net.close()
        fleet.close()


def preflight(fleet: SshFleet, tmp_path: Path, **overrides) -> tuple[int, list[dict], str]:
    hosts = {h.name: h for h in fleet.hosts}
    extra = {}
    for name, values in overrides.items():
        extra[name] = {**fleet.connection_vars(hosts[name]), **hosts[name].hostvars, **values}
    inventory = fleet.write_inventory(
        tmp_path / "inventory.json",
        group="rocmdoctor_cluster",
        group_vars={
            "rocmdoctor_cluster_cli": [sys.executable, "-m", "rocmdoctor"],
            "rocmdoctor_cluster_model": MODEL,
            "rocmdoctor_prefix": PREFIX,
            "rocmdoctor_cluster_ports": [PORT],
            "rocmdoctor_cluster_listen_s": 8,
        },
        extra_hosts=extra,
    )
    run = run_playbook(fleet, inventory, "--tags", "preflight", playbook="cluster.yml", timeout=300)
    found = re.search(r"cluster pre-flight: (\[.*\])", run.stdout)
    findings = json.loads(found.group(1).replace('\\"', '"')) if found else []
    return run.rc, findings, run.stdout + run.stderr


def ids(findings: list[dict]) -> set[tuple[str, str]]:
    return {(f["node"], f["id"]) for f in findings if f["severity"] == "fault"}


def test_a_good_cluster_passes(cluster, tmp_path):
    fleet, _hosts, _net = cluster
    rc, findings, out = preflight(fleet, tmp_path)
    assert rc == 0, out
    assert not ids(findings)
    # every node connected to every other node's port: 3 x 2 rows, and the recap has no failure
    assert "cluster pre-flight ok: 3 nodes, head node0, 6 of 6 connections" in out, out


def test_each_fault_is_named_on_its_node(cluster, tmp_path):
    fleet, hosts, net = cluster
    node0, node1, node2 = hosts
    # node1: another bundle, a model file that differs, and a firewall dropping the rendezvous port
    write_node_files(node1, digest="sha256:" + "1" * 64, weights=b"\x08" + bytes(62) + b"\x01")
    cluster_net.drop_port(node1, PORT)
    try:
        # node2 advertises an address it does not have (a multi-homed node's wrong pick)
        rc, findings, out = preflight(fleet, tmp_path, node2={"rocmdoctor_cluster_advertise": "10.88.0.99"})
    finally:
        cluster_net.clear_rules(node1)
        write_node_files(node1)
    assert rc != 0, out
    faults = ids(findings)
    assert ("node1", "bundle.digest_differs") in faults, findings
    assert ("node1", "model.files_differ") in faults, findings
    assert ("node1", "port.blocked") in faults, findings
    assert ("node2", "address.not_local") in faults, findings
    # the head itself is sound: nothing is named on it
    assert not {f for f in faults if f[0] == node0.name}, findings
    blocked = next(f for f in findings if f["id"] == "port.blocked" and f["node"] == "node1")
    assert f"{net.addresses['node1']}:{PORT}" in blocked["message"] and "timed out" in blocked["message"]
    model = next(f for f in findings if f["id"] == "model.files_differ")
    assert "model.safetensors (different digest)" in model["message"]


def test_a_down_interface_is_named(cluster, tmp_path):
    fleet, hosts, _net = cluster
    cluster_net.set_link(hosts[2], up=False)
    try:
        rc, findings, out = preflight(fleet, tmp_path)
    finally:
        cluster_net.set_link(hosts[2], up=True)
    assert rc != 0, out
    faults = ids(findings)
    assert ("node2", "ifname.down") in faults, findings
    down = next(f for f in findings if f["id"] == "ifname.down")
    assert "GLOO_SOCKET_IFNAME=eth1" in down["message"] or "NCCL_SOCKET_IFNAME=eth1" in down["message"]
    assert "ip link set eth1 up" in down["remedy"]
