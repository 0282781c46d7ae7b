"""The cluster pre-flight's verdict: the nodes' facts documents (`cluster_facts.collect`) and the TCP
connect matrix compared, each fault named on the node where it is, with its remedy. Pure.

The first node is the head (rank 0, the `--master-addr`): every "same on every node" rule compares
the others with it, so a differing worker is the one named. Rules and sources: cluster_facts.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rocmdoctor.model import Result, Row, Status, envelope

KIND = "rocmdoctor.cluster.report"
FAULT = "fault"
WARNING = "warning"
# vLLM's docs start multi-node containers with --shm-size 16G (and ROCm's checklist asks for /dev/shm
# shared across ranks); below this a warning, not a fault: tensor exchange falls back, not fails.
MIN_SHM_BYTES = 16 << 30
SHM_MIN_WARN = 1 << 30  # below 1 GiB the shared-memory broadcast queues themselves run short


SEVERITY = {FAULT: Status.FAIL, WARNING: Status.WARN}


def finding(node: str, ident: str, severity: str, message: str, remedy: str) -> Row:
    """A fault or a warning on `node`, as every judged item is: a result row about that node."""
    return Row(ident, Result(SEVERITY[severity], message, remedy, {"node": node}), subject=node)


def finding_json(row: Row) -> dict[str, Any]:
    """The row, and the fields the report carried before findings were rows (node, severity, message)."""
    severity = FAULT if row.status is Status.FAIL else WARNING
    return {**row.to_json(), "node": row.subject, "severity": severity, "message": row.result.summary}


@dataclass(frozen=True)
class Probe:
    """One TCP connect from node `source` to `target`'s advertised address and port."""

    source: str
    target: str
    address: str
    port: int
    ok: bool
    error: str | None = None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Probe:
        return cls(
            str(doc["source"]),
            str(doc["target"]),
            str(doc["address"]),
            int(doc["port"]),
            bool(doc["ok"]),
            None if doc.get("error") is None else str(doc["error"]),
        )


def _name(facts: Mapping[str, Any]) -> str:
    return str(facts.get("node") or "unknown")


def _networks_of(facts: Mapping[str, Any], address: str) -> list[str]:
    """The interfaces of this node whose routed networks contain `address`."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return []
    out = []
    for name, iface in (facts.get("interfaces") or {}).items():
        for net in iface.get("networks") or []:
            try:
                if ip in ipaddress.ip_network(net, strict=False):
                    out.append(name)
                    break
            except ValueError:
                continue
    return out


def _iface_up(iface: Mapping[str, Any]) -> bool:
    # a veth or a bond reports operstate "up"; loopback "unknown" with IFF_UP set
    return iface.get("operstate") == "up" or (iface.get("operstate") == "unknown" and iface.get("up") is True)


def _address_findings(facts: Mapping[str, Any]) -> list[Row]:
    node, advertise = _name(facts), facts.get("advertise")
    if not advertise:
        return [
            finding(
                node,
                "address.unset",
                FAULT,
                "no advertised address: VLLM_HOST_IP is unset and none was given",
                f"set VLLM_HOST_IP (or --advertise) to {node}'s address on the cluster network",
            )
        ]
    if advertise not in (facts.get("addresses") or []):
        owned = ", ".join(a for a in facts.get("addresses") or [] if not ipaddress.ip_address(a).is_loopback)
        return [
            finding(
                node,
                "address.not_local",
                FAULT,
                f"advertised address {advertise} is not an address of this node (it has: {owned or 'none'})",
                f"set VLLM_HOST_IP (--advertise) to one of {owned or 'this node addresses'}, the one on the "
                "network the other nodes reach; a multi-homed node otherwise advertises the wrong one",
            )
        ]
    return []


def _ifname_findings(facts: Mapping[str, Any]) -> list[Row]:
    node, out = _name(facts), []
    ifaces = facts.get("interfaces") or {}
    advertise = facts.get("advertise")
    carriers = _networks_of(facts, advertise) if advertise else []
    for variable, value in (facts.get("socket_ifnames") or {}).items():
        if not value:
            continue
        # NCCL's syntax: "^" excludes, "=" matches exactly; a prefix matches otherwise.
        if value.startswith("^"):
            continue
        names = [v.lstrip("=") for v in value.split(",") if v]
        exact = value.startswith("=")
        matching = [i for i in ifaces if any((i == n) if exact else i.startswith(n) for n in names)]
        if not matching:
            out.append(
                finding(
                    node,
                    "ifname.missing",
                    FAULT,
                    f"{variable}={value} names no interface of this node (it has: {', '.join(sorted(ifaces))})",
                    f"set {variable} to the interface that carries {advertise or 'the cluster network'}"
                    + (f" ({', '.join(carriers)})" if carriers else ""),
                )
            )
            continue
        down = [i for i in matching if not _iface_up(ifaces[i])]
        if down and len(down) == len(matching):
            out.append(
                finding(
                    node,
                    "ifname.down",
                    FAULT,
                    f"{variable}={value}: interface {', '.join(down)} is "
                    f"{ifaces[down[0]].get('operstate') or 'not up'}",
                    f"bring it up (`ip link set {down[0]} up`, check the cable/switch port) or point {variable} "
                    "at an interface that is up",
                )
            )
        elif carriers and not set(matching) & set(carriers):
            out.append(
                finding(
                    node,
                    "ifname.wrong_network",
                    FAULT,
                    f"{variable}={value} is not the interface of the advertised address {advertise} "
                    f"({', '.join(carriers)})",
                    f"set {variable}={carriers[0]}: the collectives must run on the network the ranks meet on",
                )
            )
    return out


def _same_findings(head: Mapping[str, Any], facts: Mapping[str, Any]) -> list[Row]:
    """What must equal the head's: bundle, model, GPUs, visibility."""
    node, hname, out = _name(facts), _name(head), []
    hb, b = head.get("bundle") or {}, facts.get("bundle") or {}
    if not b.get("digest"):
        out.append(
            finding(
                node,
                "bundle.missing",
                FAULT,
                f"no qualified bundle record at {b.get('record')}: {b.get('problem') or 'no digest'}",
                "install the same bundle as the head: `rocmdoctor install --frozen` from the same lock",
            )
        )
    elif hb.get("digest") and b["digest"] != hb["digest"]:
        out.append(
            finding(
                node,
                "bundle.digest_differs",
                FAULT,
                f"bundle {b.get('tag')} ({b['digest']}) differs from {hname}'s {hb.get('tag')} ({hb['digest']}): "
                "Python, torch and Ray must match exactly between nodes",
                f"install {hname}'s bundle here from the same lock (`rocmdoctor install --frozen`)",
            )
        )
    if b.get("digest") and b.get("qualified") is not True:
        out.append(
            finding(
                node,
                "bundle.not_qualified",
                FAULT,
                f"bundle {b.get('tag')} is {'NOT QUALIFIED' if b.get('qualified') is False else 'not qualified yet'}",
                "run `rocmdoctor bundle qualify` and fix what it names",
            )
        )
    out += _model_findings(head, facts)
    hg, g = head.get("gpus") or [], facts.get("gpus") or []
    hmodels, models = sorted(x.get("model") or "?" for x in hg), sorted(x.get("model") or "?" for x in g)
    if len(hg) != len(g):
        out.append(
            finding(
                node,
                "gpu.count_differs",
                FAULT,
                f"{len(g)} GPU(s) here, {len(hg)} on {hname}: the layout puts the same ranks on every node",
                "use nodes with the same GPU count, or give each the same visibility mask",
            )
        )
    elif hmodels != models:
        out.append(
            finding(
                node,
                "gpu.model_differs",
                FAULT,
                f"GPUs {', '.join(sorted(set(models)))} here, {', '.join(sorted(set(hmodels)))} on {hname}",
                "run one model across nodes of one GPU model (kernels and memory sizing are per GPU)",
            )
        )
    hv, v = head.get("visibility") or {}, facts.get("visibility") or {}
    differing = [k for k in sorted(set(hv) | set(v)) if hv.get(k) != v.get(k)]
    if differing:
        out.append(
            finding(
                node,
                "visibility.differs",
                FAULT,
                "; ".join(f"{k}={v.get(k)!r} here, {hv.get(k)!r} on {hname}" for k in differing),
                "give every rank the same visibility variables (asymmetric masks broke RCCL P2P, ROCM-27034)",
            )
        )
    return out


def _model_findings(head: Mapping[str, Any], facts: Mapping[str, Any]) -> list[Row]:
    node, hname = _name(facts), _name(head)
    hm, m = head.get("model"), facts.get("model")
    if not hm and not m:
        return []
    if not m or m.get("problem") and not m.get("files"):
        where = (m or hm or {}).get("path")
        return [
            finding(
                node,
                "model.missing",
                FAULT,
                f"model not found at {where}" + (f": {m.get('problem')}" if m else ""),
                f"download the model on every node to the same path ({where}); vLLM loads it on each",
            )
        ]
    out = []
    if hm and m.get("path") != hm.get("path"):
        out.append(
            finding(
                node,
                "model.path_differs",
                FAULT,
                f"model at {m.get('path')} here, {hm.get('path')} on {hname}",
                f"put it at {hm.get('path')} on every node: the head sends its path to the workers",
            )
        )
    if hm and m.get("revision") != hm.get("revision"):
        out.append(
            finding(
                node,
                "model.revision_differs",
                FAULT,
                f"model revision {m.get('revision')} here, {hm.get('revision')} on {hname}",
                f"download revision {hm.get('revision')} here",
            )
        )
    if hm:
        hf, f = hm.get("files") or {}, m.get("files") or {}
        differ = sorted(k for k in set(hf) | set(f) if hf.get(k) != f.get(k))
        if differ:
            shown = ", ".join(
                f"{k} ({'missing' if k not in f else 'extra' if k not in hf else 'different digest'})"
                for k in differ[:5]
            )
            out.append(
                finding(
                    node,
                    "model.files_differ",
                    FAULT,
                    f"model files differ from {hname}'s: {shown}" + (" ..." if len(differ) > 5 else ""),
                    f"copy the model from {hname} again (or download the same revision) to {m.get('path')}",
                )
            )
    return out


def _host_findings(facts: Mapping[str, Any], multi_gpu: bool) -> list[Row]:
    node, out = _name(facts), []
    for port in facts.get("rdma") or []:
        if port.get("state") != "ACTIVE":
            out.append(
                finding(
                    node,
                    "rdma.port_down",
                    FAULT,
                    f"RDMA port {port.get('device')}/{port.get('port')} is {port.get('state')} "
                    f"({port.get('phys_state')}): RCCL falls back to TCP sockets (NET/Socket)",
                    "check the link (`ibstat`), the cable and the subnet manager; or exclude the device "
                    "with NCCL_IB_HCA",
                )
            )
    shm = facts.get("shm_bytes")
    if isinstance(shm, int) and shm < MIN_SHM_BYTES:
        out.append(
            finding(
                node,
                "shm.small",
                FAULT if shm < SHM_MIN_WARN else WARNING,
                f"/dev/shm is {shm / (1 << 30):.1f} GiB; multi-node vLLM is run with 16 GiB (--shm-size 16G)",
                "enlarge it (`mount -o remount,size=16G /dev/shm`, or --shm-size for a container)",
            )
        )
    if multi_gpu and "iommu=pt" not in (facts.get("kernel_options") or []):
        out.append(
            finding(
                node,
                "kernel.iommu_pt",
                WARNING,
                'kernel command line lacks iommu=pt (RCCL warns: "can lead to system instability or hang")',
                "add iommu=pt to the kernel command line (`rocmdoctor fix-kernel`) and reboot",
            )
        )
    visible = facts.get("visibility") or {}
    if visible.get("ROCR_VISIBLE_DEVICES") and (
        visible.get("HIP_VISIBLE_DEVICES") or visible.get("CUDA_VISIBLE_DEVICES")
    ):
        out.append(
            finding(
                node,
                "visibility.mixed",
                WARNING,
                "ROCR_VISIBLE_DEVICES and HIP/CUDA_VISIBLE_DEVICES are both set: the second renumbers "
                "what the first left ('invalid device ordinal', vllm#12572)",
                "mask with one variable (vLLM on ROCm reads CUDA_VISIBLE_DEVICES; keep HIP unset)",
            )
        )
    return out


def _probe_findings(probes: Iterable[Probe]) -> list[Row]:
    out = []
    for p in probes:
        if p.ok:
            continue
        unreachable = p.error in ("no route to host", "network is unreachable")
        out.append(
            finding(
                p.target,
                "address.unreachable" if unreachable else "port.blocked",
                FAULT,
                f"{p.source} cannot connect to {p.target} at {p.address}:{p.port} ({p.error})",
                (
                    f"route {p.source}'s traffic to {p.address} (same network, or a route) and check "
                    f"{p.target}'s advertised address"
                    if unreachable
                    else f"open TCP port {p.port} on {p.target} to the other nodes (firewall: nft/iptables, "
                    "security group)"
                ),
            )
        )
    return out


def report(
    nodes: Sequence[Mapping[str, Any]], probes: Sequence[Probe], findings: Sequence[Row]
) -> dict[str, Any]:
    """The versioned report of `judge`'s findings: `ok` when none is a fault."""
    return envelope(
        kind=KIND,
        ok=not any(f.status is Status.FAIL for f in findings),
        head=_name(nodes[0]),
        nodes=[_name(n) for n in nodes],
        findings=[finding_json(f) for f in findings],
        matrix=[asdict(p) for p in probes],
    )


def judge(nodes: Sequence[Mapping[str, Any]], probes: Sequence[Probe]) -> list[Row]:
    """Every finding about these nodes and their connect matrix, in the report's order."""
    findings: list[Row] = []
    if not nodes:
        raise ValueError("no node facts to compare")
    head = nodes[0]
    multi_gpu = any(len(n.get("gpus") or []) > 1 for n in nodes) or len(nodes) > 1 and bool(head.get("gpus"))
    names = [_name(n) for n in nodes]
    for twice in sorted({n for n in names if names.count(n) > 1}):
        findings.append(
            finding(
                twice,
                "node.duplicate",
                FAULT,
                f"two nodes report the name {twice}",
                "give each node its own name",
            )
        )
    for facts in nodes:
        findings += _address_findings(facts) + _ifname_findings(facts) + _host_findings(facts, multi_gpu)
        if facts is not head:
            findings += _same_findings(head, facts)
    advertised = [str(n["advertise"]) for n in nodes if n.get("advertise")]
    for twice in sorted({a for a in advertised if advertised.count(a) > 1}):
        findings.append(
            finding(
                ", ".join(_name(n) for n in nodes if n.get("advertise") == twice),
                "address.duplicate",
                FAULT,
                f"{twice} is advertised by more than one node",
                "set each node's VLLM_HOST_IP to its own address",
            )
        )
    return findings + _probe_findings(probes)
