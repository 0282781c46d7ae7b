"""The cluster pre-flight's input, typed and bounded: the nodes' facts documents and the connect
matrix come over SSH from machines that may be anything (`cluster check --input`)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from rocmdoctor import documents
from rocmdoctor.cluster.compare import Probe
from rocmdoctor.model import SCHEMA_VERSION

# What a stranger's document may make this process hold: the facts of 1024 nodes are a few MiB (a node's
# facts are tens of KiB), and a connect matrix needs one probe per node pair and port, so 65,536 probes
# cover 64 nodes with 16 ports each. Larger documents are refused before parsing (300,000 probes took
# 1.3 GB of memory through the whole report when 64 MiB were accepted).
MAX_INPUT_BYTES = 8 << 20
MAX_PROBES = 65_536
Short = Annotated[str, Meta(max_length=4096)]
PortNumber = Annotated[int, Meta(ge=1, le=65535)]


class _Iface(msgspec.Struct, forbid_unknown_fields=False):
    operstate: Short | None = None
    up: bool | None = None
    networks: Annotated[list[Short], Meta(max_length=4096)] = []
    addresses: Annotated[list[Short], Meta(max_length=4096)] = []


class _Bundle(msgspec.Struct, forbid_unknown_fields=False):
    record: Short | None = None
    tag: Short | None = None
    digest: Short | None = None
    qualified: bool | None = None
    problem: Short | None = None


class _Model(msgspec.Struct, forbid_unknown_fields=False):
    path: Short | None = None
    revision: Short | None = None
    files: Annotated[dict[Short, Short], Meta(max_length=100_000)] = {}
    problem: Short | None = None


class _Rdma(msgspec.Struct, forbid_unknown_fields=False):
    device: Short | None = None
    port: Short | None = None
    state: Short | None = None
    phys_state: Short | None = None


class _Gpu(msgspec.Struct, forbid_unknown_fields=False):
    model: Short | None = None


class NodeFacts(msgspec.Struct, forbid_unknown_fields=False):
    node: Annotated[str, Meta(min_length=1, max_length=255)]
    schema_version: int = SCHEMA_VERSION
    advertise: Short | None = None
    addresses: Annotated[list[Short], Meta(max_length=4096)] = []
    interfaces: Annotated[dict[Short, _Iface], Meta(max_length=4096)] = {}
    socket_ifnames: Annotated[dict[Short, Short | None], Meta(max_length=64)] = {}
    visibility: Annotated[dict[Short, Short | None], Meta(max_length=64)] = {}
    ports: Annotated[list[PortNumber], Meta(max_length=256)] = []
    bundle: _Bundle | None = None
    model: _Model | None = None
    rdma: Annotated[list[_Rdma], Meta(max_length=1024)] = []
    shm_bytes: Annotated[int, Meta(ge=0)] | None = None
    kernel_options: Annotated[list[Short], Meta(max_length=4096)] = []
    gpus: Annotated[list[_Gpu], Meta(max_length=1024)] = []


class _ProbeDoc(msgspec.Struct, forbid_unknown_fields=False):
    source: Annotated[str, Meta(min_length=1, max_length=255)]
    target: Annotated[str, Meta(min_length=1, max_length=255)]
    address: Short
    port: PortNumber
    ok: bool
    error: Short | None = None


class ClusterInput(msgspec.Struct, forbid_unknown_fields=False):
    nodes: Annotated[list[NodeFacts], Meta(min_length=1, max_length=1024)]
    probes: Annotated[list[_ProbeDoc], Meta(max_length=MAX_PROBES)] = []


def parse_input(data: bytes, source: str) -> tuple[list[dict[str, Any]], list[Probe]]:
    """`{"nodes": [facts...], "probes": [...]}`, bounded and typed (documents.DocumentError otherwise)."""
    doc = documents.decode(data, ClusterInput, source, MAX_INPUT_BYTES)
    nodes = [documents.to_builtins(n) for n in doc.nodes]
    for node in nodes:
        if node["schema_version"] != SCHEMA_VERSION:
            raise documents.DocumentError(
                source,
                f"node {node['node']}: facts of schema_version {node['schema_version']}, this "
                f"rocmdoctor reads {SCHEMA_VERSION}: run the same rocmdoctor on every node",
            )
    return nodes, [Probe.from_json(documents.to_builtins(p)) for p in doc.probes]
