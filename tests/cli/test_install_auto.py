"""`--family auto`: the family and the go/no-go come from the diagnosis of the host under --root
(fixture trees built from real captures)."""

from __future__ import annotations

import json

HOSTS = "tests/fixtures/hosts"
TAG = "vllm0.1.0-rocm7.0.0-gfx1151"


def _auto(lab, repo, host: str, *args: str):
    # Facts of a fixture host, the install into this lab's prefix: the mix the user asks for by name.
    return lab.cli("--root", str(repo / HOSTS / host), *lab.install_args("auto", "--with-root-facts", *args))


def test_another_roots_facts_for_a_live_install_are_refused_unless_asked_for(install_lab, repo):
    install_lab.pin("gfx1151", install_lab.bundle(TAG))
    root = repo / HOSTS / "strix-halo-clean"
    proc = install_lab.cli("--root", str(root), *install_lab.install_args("auto"))
    assert proc.returncode == 2 and "--with-root-facts" in proc.stderr and "Traceback" not in proc.stderr
    assert install_lab.current() is None and not (install_lab.prefix / "bundles").exists()
    # An explicit family reads no facts: nothing to mix, nothing refused.
    assert install_lab.cli("--root", str(root), *install_lab.install_args("gfx1151")).returncode == 0


def test_serve_refuses_another_roots_facts_for_a_live_start(repo, tmp_path):
    from harness.cli import rocmdoctor

    root = repo / HOSTS / "strix-halo-clean"
    proc = rocmdoctor("--root", str(root), "serve", "--model", str(tmp_path), "--prefix", str(tmp_path / "p"))
    assert proc.returncode == 2 and "--with-root-facts" in proc.stderr and "serve" in proc.stderr
    # Asked for by name, the facts are used and the start goes on (to the missing bundle's message).
    asked = rocmdoctor(
        "--root",
        str(root),
        "serve",
        "--with-root-facts",
        "--model",
        str(tmp_path),
        "--prefix",
        str(tmp_path / "p"),
    )
    assert asked.returncode == 2 and "install a bundle first" in asked.stderr


def test_clean_strix_halo_installs_the_gfx1151_bundle(install_lab, repo):
    install_lab.pin("gfx1151", install_lab.bundle(TAG))
    proc = _auto(install_lab, repo, "strix-halo-clean", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["family"] == "gfx1151" and doc["current"] == TAG and "forced_past" not in doc


def test_blocking_checks_refuse_naming_check_and_remedy_unless_forced(install_lab, repo):
    install_lab.pin("gfx1151", install_lab.bundle(TAG))
    proc = _auto(install_lab, repo, "strix-halo-nocwsr-dkms")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "kernel.cwsr:" in proc.stderr and "fix-kernel" in proc.stderr
    assert "driver.dkms:" in proc.stderr  # blocking on an APU
    assert "--force" in proc.stderr and install_lab.current() is None
    forced = _auto(install_lab, repo, "strix-halo-nocwsr-dkms", "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    doc = json.loads(forced.stdout)
    assert doc["current"] == TAG and any(p.startswith("kernel.cwsr:") for p in doc["forced_past"])


def test_host_without_amd_gpu_is_refused(install_lab, repo):
    install_lab.pin("gfx1151", install_lab.bundle(TAG))
    proc = _auto(install_lab, repo, "no-amd-gpu")
    assert proc.returncode == 1 and "gpu.present:" in proc.stderr and "modprobe amdgpu" in proc.stderr


def test_mi300x_maps_to_gfx942(install_lab, repo):
    install_lab.pin("gfx1151", install_lab.bundle(TAG))  # pins without gfx942
    proc = _auto(install_lab, repo, "mi300x")
    assert proc.returncode == 2 and "runs on gfx942 (its families: gfx1151)" in proc.stderr
    assert "'targets'" in proc.stderr


def test_a_fleets_own_manifest_adds_a_family_for_auto(install_lab, repo):
    """The manifest the user pins is the one `--family auto` maps the host's gfx through: a family the
    shipped manifest does not know (its own name, its own targets) is chosen by the diagnosis."""
    from harness.bundles import write_pins
    from harness.elf_bundle import family_code_objects

    tag = "vllm0.1.0-rocm7.0.0-gfx115X"
    built = install_lab.bundle(tag, extra=family_code_objects("gfx115X", ["gfx1151"]))
    write_pins(
        install_lab.pins,
        {"gfx115X": built},
        base_url=install_lab.server.mirror_url,
        targets={"gfx115X": ["gfx1150", "gfx1151"]},
    )
    proc = _auto(install_lab, repo, "strix-halo-clean", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["family"] == "gfx115X" and doc["current"] == tag
