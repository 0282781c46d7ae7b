"""A cluster network between fake hosts (harness.fleet namespaces): one switch namespace holding a
bridge, and a veth pair per node (`eth1` inside the node, its peer on the bridge), each node at
10.<net>.0.<i+1>/24. Nothing touches the machine's own network namespace.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from harness.fleet import FakeHost, kill_netns

IFNAME = "eth1"


def _ip(*argv: str, netns: str | None = None) -> None:
    cmd = (["ip", "netns", "exec", netns] if netns else []) + list(argv)
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@dataclass
class ClusterNet:
    switch: str  # the switch's namespace
    addresses: dict[str, str]  # host name -> its address

    def close(self) -> None:
        kill_netns(self.switch)


def connect(prefix: str, hosts: list[FakeHost], net: int = 88) -> ClusterNet:
    switch = f"{prefix}-sw"
    kill_netns(switch)
    _ip("ip", "netns", "add", switch)
    _ip("ip", "link", "add", "br0", "type", "bridge", netns=switch)
    _ip("ip", "link", "set", "br0", "up", netns=switch)
    addresses = {}
    for i, host in enumerate(hosts):
        port = f"p{i}"
        # created inside the switch namespace, one end then moved into the node's: no name in the
        # machine's own namespace, so two test modules never collide
        _ip("ip", "link", "add", port, "type", "veth", "peer", "name", IFNAME, netns=switch)
        _ip("ip", "link", "set", IFNAME, "netns", host.netns, netns=switch)
        _ip("ip", "link", "set", port, "master", "br0", "up", netns=switch)
        address = f"10.{net}.0.{i + 1}"
        _ip("ip", "addr", "add", f"{address}/24", "dev", IFNAME, netns=host.netns)
        _ip("ip", "link", "set", IFNAME, "up", netns=host.netns)
        addresses[host.name] = address
    return ClusterNet(switch, addresses)


def set_link(host: FakeHost, up: bool) -> None:
    _ip("ip", "link", "set", IFNAME, "up" if up else "down", netns=host.netns)


def drop_port(host: FakeHost, port: int) -> None:
    """An nftables rule in the node's namespace that drops incoming TCP to `port` (a firewall's DROP)."""
    rules = (
        "table inet preflight_test {\n"
        "  chain input { type filter hook input priority 0; policy accept; tcp dport %d drop; }\n"
        "}\n" % port
    )
    subprocess.run(["ip", "netns", "exec", host.netns, "nft", "-f", "-"], input=rules, check=True, text=True)


def clear_rules(host: FakeHost) -> None:
    subprocess.run(["ip", "netns", "exec", host.netns, "nft", "flush", "ruleset"], check=True)


def bare_nodes(prefix: str, count: int) -> list[FakeHost]:
    """`count` network namespaces (loopback up) standing for nodes that need no SSH: a command runs
    in one with `ip netns exec`. Stop them with `kill_netns`."""
    from pathlib import Path

    nodes = []
    for i in range(count):
        netns = f"{prefix}-{i}"
        kill_netns(netns)
        _ip("ip", "netns", "add", netns)
        _ip("ip", "link", "set", "lo", "up", netns=netns)
        nodes.append(FakeHost(name=f"node{i}", netns=netns, dir=Path("/nonexistent")))
    return nodes
