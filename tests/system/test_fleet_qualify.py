"""ansible-playbook over real SSH: a host whose new bundle fails qualification is reported and left on
its previous bundle. One fake host (strix-halo-clean, gfx1151) converges the preflight and bundle
phases on a good bundle (real gcc-built ELF files, qualified), then on a bundle whose `vllm/_C.abi3.so`
needs a symbol its library does not define (vllm-rocm#36's shape)."""

from __future__ import annotations

import os

import pytest

from harness.bundles import REPO, build_bundle, write_pins
from harness.elf_bundle import EXT, build_elves, qualify_files
from harness.fleet import SshFleet, host_root, run_playbook
from harness.release_server import ReleaseServer

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(1800)]

GOOD = "vllm0.40.0-rocm7.0.0-gfx1151"
BAD = "vllm0.41.0-rocm7.0.0-gfx1151"


def test_a_bundle_that_fails_qualification_is_reported_and_not_activated(tmp_path):
    elves = build_elves(tmp_path / "elves")
    built = {}
    for tag, variant in ((GOOD, "good"), (BAD, "needs_c")):
        files = {"bin/vllm-server": (b"#!/bin/sh\necho stand-in\n", 0o755), **qualify_files(elves, variant)}
        built[tag] = build_bundle(tmp_path / "assets" / tag, tag, files, 64 * 1024)
    with ReleaseServer() as server, SshFleet("fleet-q", tmp_path / "fleet") as fleet:
        for bundle in built.values():
            server.add_release(REPO, bundle.tag, bundle.release_assets())
        host = fleet.add("halo", rocmdoctor_serve=False)
        host_root("strix-halo-clean", host.opt / "host-root")
        host.hostvars["rocmdoctor_root"] = "/opt/host-root"
        runs = {}
        for tag in (GOOD, BAD):
            pins = tmp_path / f"pins-{tag}"
            write_pins(pins, {"gfx1151": built[tag]}, base_url=server.mirror_url)
            inventory = fleet.write_inventory(
                tmp_path / f"inventory-{tag}.yml",
                group_vars={
                    "rocmdoctor_controller_cache": str(tmp_path / "controller-cache"),
                    "rocmdoctor_bundles_dir": str(pins),
                },
            )
            runs[tag] = run_playbook(fleet, inventory, "--tags", "preflight,bundle")
            (tmp_path / f"{tag}.log").write_text(runs[tag].stdout + runs[tag].stderr)
        current = os.readlink(host.opt / "rocmdoctor/current")

    good, bad = runs[GOOD], runs[BAD]
    assert good.rc == 0 and good.recap()["halo"]["failed"] == 0, good.stdout[-3000:]
    assert bad.rc != 0 and bad.recap()["halo"]["failed"] == 1, bad.stdout[-3000:]
    assert "BUNDLE NOT QUALIFIED on halo, left on its previous bundle" in bad.stdout
    assert f"{BAD}: {EXT} needs symbol provided_c@PROV_1.0" in bad.stdout
    assert f"Not activated: {GOOD} stays current" in bad.stdout
    assert current == f"bundles/{GOOD}"
