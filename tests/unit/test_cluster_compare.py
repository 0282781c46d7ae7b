"""The cluster pre-flight's comparison, in-process, on facts recorded from two real network-namespace
nodes (tests/fixtures/cluster/SOURCES.md): the recorded pair passes, and each fault changed into a
copy is named on the node where it is, with a remedy; hostile input documents are refused in words."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from rocmdoctor.cluster import facts as cluster_facts
from rocmdoctor.cluster.compare import FAULT, WARNING, Probe, judge, report
from rocmdoctor.cluster.documents import parse_input
from rocmdoctor.documents import DocumentError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cluster"


def recorded() -> list[dict]:
    return [json.loads((FIXTURES / f"node{i}.json").read_text()) for i in (0, 1)]


def matrix(nodes: list[dict], **failed: str) -> list[Probe]:
    """Every node to every other node's ports; `failed` maps "src>dst" to the error."""
    out = []
    for a in nodes:
        for b in nodes:
            if a is b:
                continue
            for port in b["ports"]:
                error = failed.get(f"{a['node']}>{b['node']}")
                out.append(Probe(a["node"], b["node"], b["advertise"], port, error is None, error))
    return out


def compare(nodes: list[dict], probes: list[Probe] | None = None) -> dict:
    """The report `cluster check` prints: judge's findings in report's document."""
    return report(nodes, probes or [], judge(nodes, probes or []))


def faults(report: dict) -> set[tuple[str, str]]:
    return {(f["node"], f["id"]) for f in report["findings"] if f["severity"] == FAULT}


def test_the_recorded_pair_passes_with_its_matrix():
    nodes = recorded()
    report = compare(nodes, matrix(nodes))
    assert report["ok"] is True and report["findings"] == [], report["findings"]
    assert report["head"] == "node0" and report["nodes"] == ["node0", "node1"]
    assert len(report["matrix"]) == 2 and report["schema_version"] == 1


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda n: n["bundle"].update(digest="sha256:" + "1" * 64), ("node1", "bundle.digest_differs")),
        (lambda n: n["bundle"].update(digest=None, problem="missing"), ("node1", "bundle.missing")),
        (lambda n: n["bundle"].update(qualified=False), ("node1", "bundle.not_qualified")),
        (
            lambda n: n["model"]["files"].update({"config.json": "sha256:" + "2" * 64}),
            ("node1", "model.files_differ"),
        ),
        (lambda n: n["model"]["files"].pop("tokenizer.json"), ("node1", "model.files_differ")),
        (lambda n: n["model"].update(files={}, problem="/x is not a directory"), ("node1", "model.missing")),
        (lambda n: n["model"].update(path="/srv/other"), ("node1", "model.path_differs")),
        (lambda n: n["model"].update(revision="0123abc"), ("node1", "model.revision_differs")),
        (lambda n: n.update(advertise="10.77.0.99"), ("node1", "address.not_local")),
        (lambda n: n.update(advertise=None), ("node1", "address.unset")),
        (lambda n: n["socket_ifnames"].update(GLOO_SOCKET_IFNAME="eth9"), ("node1", "ifname.missing")),
        (lambda n: n["interfaces"]["clx-v1"].update(operstate="down", up=False), ("node1", "ifname.down")),
        (lambda n: n["socket_ifnames"].update(NCCL_SOCKET_IFNAME="lo"), ("node1", "ifname.wrong_network")),
        (lambda n: n["visibility"].update(CUDA_VISIBLE_DEVICES="1"), ("node1", "visibility.differs")),
        (
            lambda n: n["rdma"].append(
                {"device": "mlx5_0", "port": "1", "state": "DOWN", "phys_state": "Disabled"}
            ),
            ("node1", "rdma.port_down"),
        ),
        (lambda n: n.update(shm_bytes=64 << 20), ("node1", "shm.small")),
    ],
)
def test_each_fault_is_named_on_its_node(change, expected):
    nodes = recorded()
    change(nodes[1])
    report = compare(nodes, matrix(nodes))
    assert report["ok"] is False
    assert expected in faults(report), report["findings"]
    assert not {f for f in faults(report) if f[0] == "node0"}, "the sound head is named"
    finding = next(f for f in report["findings"] if (f["node"], f["id"]) == expected)
    assert finding["message"] and finding["remedy"]


def test_the_matrix_names_the_node_that_cannot_be_reached():
    nodes = recorded()
    report = compare(nodes, matrix(nodes, **{"node0>node1": "timed out", "node1>node0": "no route to host"}))
    assert faults(report) == {("node1", "port.blocked"), ("node0", "address.unreachable")}
    blocked = next(f for f in report["findings"] if f["id"] == "port.blocked")
    assert "10.77.0.2:29501 (timed out)" in blocked["message"] and "open TCP port 29501" in blocked["remedy"]


def test_gpus_differ_in_count_and_model():
    nodes = recorded()
    gpu = {"model": "gfx942", "node": 2, "pci_slot": "0000:47:00.0"}
    nodes[0]["gpus"] = [gpu, {**gpu, "node": 3}]
    nodes[1]["gpus"] = [gpu]
    assert ("node1", "gpu.count_differs") in faults(compare(nodes))
    nodes[1]["gpus"] = [{**gpu, "model": "gfx90a"}, gpu]
    report = compare(nodes)
    assert ("node1", "gpu.model_differs") in faults(report)
    # several GPUs and no iommu=pt on the recorded kernel command line: a warning on each node
    warned = {(f["node"], f["id"]) for f in report["findings"] if f["severity"] == WARNING}
    assert {("node0", "kernel.iommu_pt"), ("node1", "kernel.iommu_pt")} <= warned


def test_a_finding_is_a_result_row_and_keeps_its_earlier_fields():
    """Findings are the rows every result uses (id, status, summary, remedy, details), and the JSON keeps
    the fields it had (node, severity, message): a document gains fields, never loses them."""
    nodes = recorded()
    gpu = {"model": "gfx942", "node": 2, "pci_slot": "0000:47:00.0"}
    nodes[0]["gpus"], nodes[1]["gpus"] = [gpu, {**gpu, "node": 3}], [gpu]
    report = compare(nodes)
    assert report["findings"], "the changed GPUs give findings"
    for finding in report["findings"]:
        assert finding["status"] == {FAULT: "fail", WARNING: "warn"}[finding["severity"]], finding
        assert finding["summary"] == finding["message"] and finding["remedy"], finding
        assert finding["details"] == {"node": finding["node"]}, finding
    assert report["ok"] is not any(f["status"] == "fail" for f in report["findings"])


def test_two_nodes_with_one_address_or_one_name():
    nodes = recorded()
    nodes[1]["advertise"] = nodes[0]["advertise"]
    assert any(f["id"] == "address.duplicate" for f in compare(nodes)["findings"])
    nodes = recorded()
    nodes[1]["node"] = "node0"
    assert ("node0", "node.duplicate") in faults(compare(nodes))


def test_mixed_visibility_masks_are_a_warning():
    nodes = recorded()
    for node in nodes:
        node["visibility"].update(ROCR_VISIBLE_DEVICES="0,1", HIP_VISIBLE_DEVICES="0")
    report = compare(nodes)
    assert report["ok"] is True
    assert {f["id"] for f in report["findings"]} == {"visibility.mixed"}


def test_the_input_document_round_trips_and_hostile_ones_are_refused():
    nodes = recorded()
    doc = {"nodes": nodes, "probes": [p.__dict__ for p in matrix(nodes)]}
    parsed, probes = parse_input(json.dumps(doc).encode(), "input")
    assert compare(parsed, probes)["ok"] is True
    bad = [
        (b"not json", "not valid JSON"),
        (b'{"nodes": []}', "nodes"),
        (json.dumps({"nodes": [{**nodes[0], "ports": [70000]}]}).encode(), "ports"),
        (json.dumps({"nodes": [{**nodes[0], "node": ""}]}).encode(), "node"),
        (json.dumps({"nodes": [{**nodes[0], "schema_version": 99}]}).encode(), "same rocmdoctor"),
        (b"[" * 100_000, "input"),
        (b" " * (65 << 20), "larger than"),
    ]
    for raw, words in bad:
        with pytest.raises(DocumentError) as caught:
            parse_input(raw, "input")
        assert words in str(caught.value) or words in caught.value.path, str(caught.value)


def test_proc_net_parsers_on_recorded_files():
    fib = (FIXTURES / "fib_trie.clx-1").read_text()
    # the /32 host LOCAL leaves: not 127.0.0.0/8 (a route), not the broadcast addresses
    assert set(cluster_facts._fib_local_addresses(fib)) == {"10.77.0.2", "127.0.0.1"}
    assert "10.77.0.255" not in cluster_facts._fib_local_addresses(fib)  # a broadcast, not an address
    routes = cluster_facts._route_networks((FIXTURES / "route.clx-1").read_text())
    assert routes == {"clx-v1": ["10.77.0.0/24"]}


def test_recorded_facts_are_unchanged_by_a_copy():
    nodes = recorded()
    before = copy.deepcopy(nodes)
    compare(nodes, matrix(nodes))
    assert nodes == before
