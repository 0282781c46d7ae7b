"""Least privilege, measured by systemd itself: `systemd-analyze security --offline=true` rates every
unit rocmdoctor writes (the single server, the instances' template, the cluster's head, worker and Ray
units, the health service) at 2.0 or below. The scores are recorded in docs/security.md; that the real
engine starts and serves under the hardened unit is tests/system/test_unit_systemd.py."""

from __future__ import annotations

import re
import subprocess

import pytest

from harness.hostile_units import cluster, health, server_args, single, template

LIMIT = 2.0
SCORE = re.compile(r"Overall exposure level for \S+: (\d+\.\d)")


def units() -> dict[str, str]:
    out = {**single(server_args()), **template()}
    out.update({name: text for name, text in cluster(server_args()).items()})
    out.update(
        {n: t for n, t in health("/var/lib/prometheus/node-exporter").items() if n.endswith(".service")}
    )
    return out


def score(path) -> float:
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = SCORE.search(done.stdout + done.stderr)
    assert found, done.stdout + done.stderr
    return float(found.group(1))


@pytest.mark.parametrize("name", sorted(units()))
def test_every_unit_is_rated_2_or_below(name, tmp_path):
    path = tmp_path / (name.replace("@", "-at-") if name.endswith("@.service") else name)
    path.write_text(units()[name])
    assert score(path) <= LIMIT, name


def test_a_server_on_loopback_with_a_local_model_is_fenced_to_loopback():
    text = single(server_args())["vllm.service"]
    assert "IPAddressAllow=localhost" in text.splitlines() and "IPAddressDeny=any" in text.splitlines()
    # A cluster's units talk to other nodes: never fenced.
    for name, unit in cluster(server_args()).items():
        assert "IPAddressDeny=" in unit.splitlines(), name
