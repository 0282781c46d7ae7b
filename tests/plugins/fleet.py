"""Fixtures for the fleet tests: an upstream that logs every read, and fake hosts over real SSH."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

# Two families, so the controller fetches one bundle per family and each host gets only its own.
FLEET_BUNDLES = {"gfx1151": "vllm0.32.0-rocm7.0.0-gfx1151", "gfx1150": "vllm0.32.0-rocm7.0.0-gfx1150"}


class Upstream(NamedTuple):
    server: object  # harness.release_server.ReleaseServer
    pins: Path  # manifest.toml + lock.json, their URLs on the server's flat mirror
    parts: list[str]  # every part file name of every bundle


# One per test module: the access log is what test_fleet.py counts ("each part read once for the
# fleet"), and another module's fleet (its own controller cache) must not add to it.
@pytest.fixture(scope="module")
def fleet_upstream(tmp_path_factory):
    """The test bundles (real engine behind bin/vllm-server) served over loopback HTTP."""
    from harness.bundles import REPO, vllm_test_bundle, write_pins
    from harness.release_server import ReleaseServer

    base = tmp_path_factory.mktemp("fleet-upstream")
    built = {family: vllm_test_bundle(base / family, family, tag) for family, tag in FLEET_BUNDLES.items()}
    with ReleaseServer() as server:
        for bundle in built.values():
            server.add_release(REPO, bundle.tag, bundle.release_assets())
        write_pins(base / "pins", built, base_url=server.mirror_url)
        yield Upstream(server, base / "pins", [a.name for b in built.values() for a in b.assets])
