"""One node's facts for the cluster pre-flight, read through the `Host` (so a replayed tree answers
for the machine it was captured on): what every node of a multi-node vLLM must agree on or have.

`rocmdoctor cluster facts --json` prints `collect(...)` on each node; `cluster_compare` compares the
documents. The GPU facts come from the diagnosis (the command joins them; core never imports checks).

Sources of the rules (ecosystem-2026-11.md section 2.5): vLLM `distributed_troubleshooting.md`
(VLLM_HOST_IP, *_SOCKET_IFNAME, the same model at the same path), ROCm `vllm-optimization.rst`'s
multi-node checklist (/dev/shm, `ibstat` link state), RCCL's `Missing "iommu=pt"` warning.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from rocmdoctor.host import Host
from rocmdoctor.model import envelope

KIND = "rocmdoctor.cluster.facts"
FIB_TRIE = "/proc/net/fib_trie"
ROUTES = "/proc/net/route"
IF_INET6 = "/proc/net/if_inet6"
NET_CLASS = "/sys/class/net"
INFINIBAND = "/sys/class/infiniband"
CMDLINE = "/proc/cmdline"
SHM = "/dev/shm"
HOSTNAME = "/proc/sys/kernel/hostname"
# The variables that pick the address and the interfaces the backends use (vLLM envs.py; NCCL/RCCL
# and Gloo read the *_SOCKET_IFNAME ones, a comma list, `^` excluding, `=` exact: NCCL env docs).
ADDRESS_VARIABLES = ("VLLM_HOST_IP",)
IFNAME_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
# Model files hashed whole up to this size; larger ones (weights) by size, head and tail, unless they
# are blobs of the Hugging Face cache, whose file names are their sha256 already.
WHOLE_HASH_LIMIT = 64 << 20
EDGE_BYTES = 1 << 20
MAX_MODEL_FILES = 10_000


@dataclass(frozen=True)
class NodeSettings:
    """What this node is told to use (the unit's environment or the inventory): unset ones are read
    from the environment of the run."""

    name: str | None = None
    advertise: str | None = None
    socket_ifname: str | None = None
    prefix: str = "/opt/rocmdoctor"
    model: str | None = None
    ports: tuple[int, ...] = ()


def _fib_local_addresses(text: str) -> list[str]:
    """The IPv4 addresses this network namespace owns: fib_trie's `/32 host LOCAL` leaves."""
    found: list[str] = []
    last: str | None = None
    for line in text.splitlines():
        word = line.strip()
        if word.startswith(("|--", "+--")):
            last = word.split()[-1]
        elif word.startswith("/32 host LOCAL") and last and last not in found:
            found.append(last)
    return found


def _inet6_addresses(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 6 and len(parts[0]) == 32:
            try:
                addr = str(ipaddress.IPv6Address(int(parts[0], 16)))
            except ValueError:
                continue
            out.setdefault(parts[5], []).append(addr)
    return out


def _route_networks(text: str) -> dict[str, list[str]]:
    """Interface -> the IPv4 networks routed straight onto it (/proc/net/route, little-endian hex)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 8:
            continue
        try:
            dest = ipaddress.IPv4Address(int(parts[1], 16).to_bytes(4, "little"))
            mask = ipaddress.IPv4Address(int(parts[7], 16).to_bytes(4, "little"))
            gateway = int(parts[2], 16)
        except ValueError:
            continue
        if gateway == 0 and int(mask) != 0:
            net = str(ipaddress.IPv4Network(f"{dest}/{mask}", strict=False))
            out.setdefault(parts[0], []).append(net)
    return out


def interfaces(host: Host) -> dict[str, dict[str, Any]]:
    """Every interface: its operstate and the networks it carries; addresses by the networks they fall in."""
    routes = _route_networks(str(host.read_text(ROUTES).value or ""))
    v4 = _fib_local_addresses(str(host.read_text(FIB_TRIE, limit=4 << 20).value or ""))
    v6 = _inet6_addresses(str(host.read_text(IF_INET6).value or ""))
    out: dict[str, dict[str, Any]] = {}
    for name in host.listdir(NET_CLASS):
        state = host.read_text(f"{NET_CLASS}/{name}/operstate")
        flags = host.read_text(f"{NET_CLASS}/{name}/flags")
        networks = routes.get(name, [])
        addresses = [
            a for a in v4 if any(ipaddress.IPv4Address(a) in ipaddress.IPv4Network(n) for n in networks)
        ]
        try:
            up_flag = bool(int(str(flags.value).strip(), 16) & 0x1) if flags.ok else None
        except ValueError:
            up_flag = None
        out[name] = {
            "operstate": str(state.value).strip() if state.ok else None,
            "up": up_flag,
            "networks": networks,
            "addresses": addresses + v6.get(name, []),
        }
    if v4:
        # loopback's /8 is in the local table, not the main one /proc/net/route shows
        out.setdefault("lo", {"operstate": None, "up": None, "networks": [], "addresses": []})
        for a in v4:
            if ipaddress.IPv4Address(a).is_loopback and a not in out["lo"]["addresses"]:
                out["lo"]["addresses"].append(a)
    return out


def local_addresses(ifaces: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return sorted({a for i in ifaces.values() for a in i["addresses"]})


def rdma_ports(host: Host) -> list[dict[str, str | None]]:
    """Each InfiniBand/RoCE port with its link state (what `ibstat` prints), where the class exists."""
    out: list[dict[str, str | None]] = []
    for device in host.listdir(INFINIBAND):
        for port in host.listdir(f"{INFINIBAND}/{device}/ports"):
            base = f"{INFINIBAND}/{device}/ports/{port}"
            state = host.read_text(f"{base}/state")
            phys = host.read_text(f"{base}/phys_state")
            out.append(
                {
                    "device": device,
                    "port": port,
                    # sysfs says "4: ACTIVE", "5: LinkUp"
                    "state": str(state.value).strip().split(":")[-1].strip() if state.ok else None,
                    "phys_state": str(phys.value).strip().split(":")[-1].strip() if phys.ok else None,
                }
            )
    return out


def kernel_options(host: Host) -> list[str]:
    """The kernel's own options (what follows `--` goes to init)."""
    read = host.read_text(CMDLINE)
    words = str(read.value).split() if read.ok else []
    return words[: words.index("--")] if "--" in words else words


def bundle(host: Host, prefix: str) -> dict[str, Any]:
    """The current bundle's identity (`facts.installed_bundle`: the digest the textfile reports too)."""
    from rocmdoctor.facts.installed_bundle import read_installed

    return read_installed(host, prefix).to_json()


def _hub_blob(host: Host, path: str) -> str | None:
    """A Hugging Face snapshot file is a link to its blob, named by its sha256: that name is the digest
    (the link is read, never followed)."""
    link = host.readlink(path)
    if not link.ok:
        return None
    target = PurePosixPath(str(link.value))
    name = target.name
    if target.parent.name == "blobs" and len(name) == 64 and all(c in "0123456789abcdef" for c in name):
        return f"sha256:{name}"
    return None


def model(host: Host, path: str | None) -> dict[str, Any] | None:
    """The model directory's files and their digests, and the revision when it is a hub snapshot; read
    through the Host (a captured tree's links resolved inside it, no other link followed)."""
    if not path:
        return None
    out: dict[str, Any] = {"path": path, "revision": None, "files": {}, "problem": None}
    root = os.path.normpath(path)
    if not root.startswith("/"):
        out["problem"] = f"{path} is not an absolute path"
        return out
    if os.path.basename(os.path.dirname(root)) == "snapshots":
        out["revision"] = os.path.basename(root)
    if not host.is_dir(root):
        out["problem"] = f"{path} is not a directory on this node"
        return out
    files: dict[str, str] = {}
    pending = [root]
    while pending and len(files) < MAX_MODEL_FILES:
        directory = pending.pop(0)
        for name in host.listdir(directory):
            if name.startswith("."):
                continue
            full = f"{directory}/{name}"
            info = host.stat(full)
            if info is None:
                continue
            if info.type == "dir":
                pending.append(full)
                continue
            rel = full[len(root) + 1 :]
            if info.type == "link":
                blob = _hub_blob(host, full)
                files[rel] = blob or "link: not followed"
            elif info.type == "file":
                read = host.file_digest(full, WHOLE_HASH_LIMIT, EDGE_BYTES)
                files[rel] = str(read.value) if read.ok else f"unreadable: {read.describe()}"
            if len(files) >= MAX_MODEL_FILES:
                out["problem"] = f"more than {MAX_MODEL_FILES} files; only the first are compared"
                break
    out["files"] = dict(sorted(files.items()))
    return out


def shm_bytes(host: Host) -> int | None:
    """The size of /dev/shm (its mount on this node; a captured tree's stat.json entry, else unknown)."""
    return host.fs_size_bytes(SHM)


def hostname(host: Host) -> str | None:
    read = host.read_text(HOSTNAME)
    return str(read.value).strip() if read.ok else None


def collect(
    host: Host, settings: NodeSettings, gpus: list[dict[str, Any]], visibility: Iterable[str]
) -> dict[str, Any]:
    """This node's facts document (versioned); `gpus` come from the diagnosis's facts, `visibility`
    names the variables that pick a rank's GPUs (the diagnosis's rules data)."""
    env = host.env
    ifaces = interfaces(host)
    advertise = settings.advertise or env.get("VLLM_HOST_IP") or None
    ifname = settings.socket_ifname
    socket_ifnames = {v: (ifname if ifname is not None else env.get(v)) for v in IFNAME_VARIABLES}
    return envelope(
        kind=KIND,
        node=settings.name or hostname(host) or "unknown",
        advertise=advertise,
        addresses=local_addresses(ifaces),
        interfaces=ifaces,
        socket_ifnames=socket_ifnames,
        visibility={v: env.get(v) for v in visibility},
        ports=list(settings.ports),
        bundle=bundle(host, settings.prefix),
        model=model(host, settings.model),
        rdma=rdma_ports(host),
        shm_bytes=shm_bytes(host),
        kernel_options=kernel_options(host),
        gpus=gpus,
    )
