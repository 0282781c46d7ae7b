"""Qualification before activation: real ELF files built with gcc, packed into bundles served by the
loopback release server, installed by the real CLI. A bad bundle is refused before activation with
the exact message and the previous one stays current; the good one is qualified and activated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.elf_bundle import CLANG, EXT, TORCH_LIB, build_elves, qualify_files

GOOD = "vllm0.1.0-rocm7.0.0-gfx1151"
BAD = "vllm0.2.0-rocm7.0.0-gfx1151"
NOT_ACTIVATED = f"Not activated: {GOOD} stays current"

# variant -> the exact first failure the refusal starts with
REFUSALS = {
    "needs_c": f"{BAD}: {EXT} needs symbol provided_c@PROV_1.0 (from libprovide.so.1), which none of the "
    "libraries it loads defines (libprovide.so.1)",
    "needs_v2": f"{BAD}: {EXT} needs symbol versioned_fn@PROV_2.0 (from libprovide.so.1), which none of "
    "the libraries it loads defines (libprovide.so.1)",
    "ghost": f"{BAD}: {EXT} needs libghost.so.1, which is neither in the bundle "
    "(lib/python3.13/site-packages/torch/lib) nor a library of this host",
    "wrong_gfx": f"{BAD}: {TORCH_LIB}/libtorch_hip.so carries GPU code for gfx1100, gfx1101 only, not this "
    "host's gfx1151",
    "bad_clang": f"{BAD}: the bundled compiler driver {CLANG} does not run (exit 127: ",
}


@pytest.fixture(scope="module")
def elves(tmp_path_factory) -> dict[str, bytes]:
    return build_elves(tmp_path_factory.mktemp("elves"))


def _json(proc) -> dict:
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def _install_args(lab, tag: str, *args: str) -> list[str]:
    return ["install", "--tag", tag, "--prefix", str(lab.prefix), "--gfx", "gfx1151", *args]


def _install(lab, tag: str, *args: str):
    return lab.cli(*_install_args(lab, tag, *args))


def _listing(lab) -> dict[str, dict]:
    doc = _json(lab.cli("bundles", "--prefix", str(lab.prefix), "--json"))
    return {b["tag"]: b for b in doc["bundles"]}


def _install_good(lab, elves) -> None:
    lab.bundle(GOOD, extra=qualify_files(elves, "good"))
    proc = _install(lab, GOOD, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = _json(proc)
    assert doc["current"] == GOOD and doc["qualification"]["qualified"] is True
    assert doc["qualification"]["steps"] == {
        "libraries": "passed",
        "symbols": "passed",
        "code_objects": "passed",
        "compiler": "passed",
        "import": "passed",
    }


def test_good_bundle_is_qualified_recorded_and_activated(install_lab, elves):
    _install_good(install_lab, elves)
    record = json.loads(
        (install_lab.prefix / "bundles" / GOOD / ".rocmdoctor-qualification.json").read_text()
    )
    assert record["qualified"] is True and record["host_gfx"] == "gfx1151"
    assert record["bundle_digest"].startswith("sha256:") and record["elf_files"] == 3
    assert _listing(install_lab)[GOOD]["qualification"] == "qualified"
    text = install_lab.cli("bundles", "--prefix", str(install_lab.prefix))
    assert f"* {GOOD}" in text.stdout and "qualified" in text.stdout

    again = install_lab.cli(
        "bundle", "qualify", "--prefix", str(install_lab.prefix), "--gfx", "gfx1151", "--json"
    )
    assert again.returncode == 0, again.stderr
    assert _json(again)["qualified"] is True


@pytest.mark.parametrize("variant", sorted(REFUSALS))
def test_bad_bundle_is_refused_before_activation(install_lab, elves, variant):
    _install_good(install_lab, elves)
    install_lab.bundle(BAD, extra=qualify_files(elves, variant))
    proc = _install(install_lab, BAD)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"rocmdoctor: {REFUSALS[variant]}"), proc.stderr
    assert NOT_ACTIVATED in proc.stderr and "--skip-qualify" in proc.stderr
    assert install_lab.current() == f"bundles/{GOOD}"
    listing = _listing(install_lab)
    assert listing[BAD]["qualification"] == "NOT QUALIFIED" and listing[GOOD]["current"] is True
    assert listing[BAD]["qualification_failure"].startswith(REFUSALS[variant])

    # rollback never goes to it without --force; a rerun refuses again without downloading
    refused = install_lab.cli("rollback", "--prefix", str(install_lab.prefix), "--to", BAD)
    assert refused.returncode == 1 and f"refusing to roll back to {BAD}" in refused.stderr
    assert install_lab.current() == f"bundles/{GOOD}"
    rerun = _install(install_lab, BAD)
    assert rerun.returncode == 1 and REFUSALS[variant] in rerun.stderr
    assert install_lab.current() == f"bundles/{GOOD}"


def test_skip_qualify_is_loud_recorded_and_prune_keeps_the_last_qualified(install_lab, elves):
    _install_good(install_lab, elves)
    install_lab.bundle(BAD, extra=qualify_files(elves, "needs_c"))
    proc = _install(install_lab, BAD, "--skip-qualify", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: --skip-qualify" in proc.stderr
    assert _json(proc)["qualification"]["skipped"] is True
    assert install_lab.current() == f"bundles/{BAD}"
    assert _listing(install_lab)[BAD]["qualification"] == "skipped"
    third = "vllm0.3.0-rocm7.0.0-gfx1151"
    install_lab.bundle(third, extra=qualify_files(elves, "wrong_gfx"))
    assert _install(install_lab, third, "--skip-qualify").returncode == 0

    pruned = _json(
        install_lab.cli("bundle", "prune", "--prefix", str(install_lab.prefix), "--keep", "1", "--json")
    )
    assert GOOD in pruned["kept"] and third in pruned["kept"]
    assert [r["tag"] for r in pruned["removed"]] == [BAD]
    forced = install_lab.cli("rollback", "--prefix", str(install_lab.prefix), "--to", GOOD)
    assert forced.returncode == 0, forced.stderr  # qualified: no --force needed


def test_rollback_force_goes_to_an_unqualified_bundle(install_lab, elves):
    _install_good(install_lab, elves)
    install_lab.bundle(BAD, extra=qualify_files(elves, "ghost"))
    assert _install(install_lab, BAD).returncode == 1
    again = install_lab.cli(
        "bundle", "qualify", BAD, "--prefix", str(install_lab.prefix), "--gfx", "gfx1151", "--json"
    )
    doc = _json(again)
    assert again.returncode == 1 and doc["failed"] is True and doc["qualified"] is False
    assert doc["msg"].startswith(f"{BAD} is NOT qualified: {REFUSALS['ghost']} (its loader searched /")
    assert doc["msg"].endswith(" (and 1 more failure(s))")
    forced = install_lab.cli("rollback", "--prefix", str(install_lab.prefix), "--to", BAD, "--force")
    assert forced.returncode == 0, forced.stderr
    assert install_lab.current() == f"bundles/{BAD}"


def test_qualify_without_a_bundle_says_what_to_do(install_lab, tmp_path: Path):
    proc = install_lab.cli("bundle", "qualify", "--prefix", str(tmp_path / "none"))
    assert proc.returncode == 2 and "no current bundle" in proc.stderr and "Traceback" not in proc.stderr
    bad = install_lab.cli("bundle", "qualify", "--prefix", str(tmp_path), "--gfx", "x; rm")
    assert bad.returncode == 2 and "--gfx" in bad.stderr


def test_a_broken_rebuild_of_the_current_tag_never_replaces_the_working_tree(install_lab, elves):
    _install_good(install_lab, elves)
    marker = install_lab.prefix / "current" / EXT
    good_bytes = marker.read_bytes()
    rebuilt = install_lab.bundle(GOOD, extra=qualify_files(elves, "needs_c"), publish=False)
    install_lab.server.add_release("lemonade-sdk/vllm-rocm", GOOD, rebuilt.release_assets())
    (install_lab.prefix / "lock.json").unlink()  # the rebuild reviewed and its pins dropped
    proc = _install(install_lab, GOOD, "--force")
    assert proc.returncode == 1, proc.stderr
    assert f"Not activated: the installed {GOOD} stays current" in proc.stderr
    assert (install_lab.prefix / "current" / EXT).read_bytes() == good_bytes
    assert install_lab.leftovers() == []


def test_a_damaged_ld_so_cache_of_the_host_is_refused_with_exit_2(install_lab, elves, tmp_path):
    """`bundle qualify` under --root judges the bundle by that host's loader; a cache cut short in its
    entries (a hostile or half-written file) is a clear refusal naming it, not a traceback."""
    _install_good(install_lab, elves)
    host = tmp_path / "damaged-host"
    (host / "etc").mkdir(parents=True)
    (host / "etc/ld.so.cache").write_bytes(Path("/etc/ld.so.cache").read_bytes()[:100])
    proc = install_lab.cli(
        "--root", str(host), "bundle", "qualify", "--prefix", str(install_lab.prefix), "--gfx", "gfx1151"
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert "/etc/ld.so.cache: it claims" in proc.stderr and "more than its 100 bytes hold" in proc.stderr
    # the record of the last good qualification is untouched
    assert _listing(install_lab)[GOOD]["qualification"] == "qualified"
    # an install judged by that host's libraries refuses the same way, and the current bundle stays
    install_lab.bundle(BAD, extra=qualify_files(elves, "good"))
    refused = install_lab.cli("--root", str(host), *_install_args(install_lab, BAD))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "/etc/ld.so.cache: it claims" in refused.stderr
    assert install_lab.current() == f"bundles/{GOOD}"
