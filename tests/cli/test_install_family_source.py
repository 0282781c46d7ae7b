"""A family published in its own repository (the manifest's per-family `repo` and `tag_pattern`):
install, channels, TOFU pins and mirrors take that family's releases from there, over the loopback
release server speaking the GitHub API."""

from __future__ import annotations

import json

from harness.bundles import build_bundle
from plugins.install import FAST, bundle_files

CDNA_REPO = "ianbmacdonald/vllm-rocm-cdna"
MAIN_REPO = "lemonade-sdk/vllm-rocm"
CDNA = "vllm0.19.1-rocm7.13.0-gfx942"
CDNA_NEWER_ELSEWHERE = "vllm0.30.0-rocm7.13.0-gfx942"  # in the main repo: must not be picked
CDNA_RDNA = "vllm0.30.0-rocm7.13.0-gfx1151"  # the CDNA repo also builds RDNA targets


def _manifest(lab) -> None:
    lab.pins.mkdir(parents=True, exist_ok=True)
    (lab.pins / "manifest.toml").write_text(
        "schema_version = 1\n"
        f'repo = "{MAIN_REPO}"\n'
        "[families.gfx942]\n"
        'targets = ["gfx942"]\n'
        'channel = "stable"\n'
        f'repo = "{CDNA_REPO}"\n'
        'tag_pattern = "vllm[^-]+-rocm[^-]+-gfx942"\n'
    )
    (lab.pins / "lock.json").write_text(json.dumps({"schema_version": 1, "repo": MAIN_REPO, "families": {}}))


def _publish(lab, repo: str, tag: str) -> None:
    built = build_bundle(lab.root / "assets" / tag, tag, bundle_files(tag), 64 * 1024)
    lab.server.add_release(repo, tag, built.release_assets())


def test_cdna_family_installs_from_its_own_repository(install_lab):
    lab = install_lab
    _manifest(lab)
    _publish(lab, CDNA_REPO, CDNA)
    _publish(lab, CDNA_REPO, CDNA_RDNA)
    _publish(lab, MAIN_REPO, CDNA_NEWER_ELSEWHERE)
    proc = lab.install("gfx942", "--gfx", "gfx942", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["current"] == CDNA and doc["qualification"]["qualified"] is True
    downloads = [e.path for e in lab.server.log if e.path.endswith(".tar.gz")]
    assert downloads and all(f"/{CDNA_REPO}/releases/download/{CDNA}/" in p for p in downloads), downloads
    pins = json.loads((lab.prefix / "lock.json").read_text())
    assert pins["families"]["gfx942"]["tag"] == CDNA and pins["families"]["gfx942"]["pinned"] is True

    listing = lab.cli(
        "bundles",
        "--available",
        "--family",
        "gfx942",
        "--prefix",
        str(lab.prefix),
        "--bundles-dir",
        str(lab.pins),
        "--json",
    )
    doc = json.loads(listing.stdout)
    assert doc["repo"] == CDNA_REPO and [r["tag"] for r in doc["available"]] == [CDNA]

    # a mirror for the fleet fills from the CDNA repository's release too
    mirror = lab.root / "mirror"
    fetched = lab.cli(
        "bundle",
        "fetch",
        "--to",
        str(mirror),
        "--family",
        "gfx942",
        "--prefix",
        str(lab.prefix),
        "--bundles-dir",
        str(lab.pins),
        *FAST,
    )
    assert fetched.returncode == 0, fetched.stderr
    assert sorted(p.name for p in mirror.iterdir()) == [f"{CDNA}-x64.part01-of-01.tar.gz"]


def test_a_tag_outside_the_familys_pattern_is_refused(install_lab):
    lab = install_lab
    _manifest(lab)
    proc = lab.install("gfx942", "--tag", "vllm-omni0.1.0-rocm7.13.0-gfx942")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"is not a gfx942 release of {CDNA_REPO}" in proc.stderr


def test_shipped_manifest_sends_instinct_to_the_cdna_repository():
    from importlib import resources

    from rocmdoctor.facts.manifest import parse_manifest

    manifest = parse_manifest(resources.files("rocmdoctor.bundles").joinpath("manifest.toml").read_text())
    assert manifest.repo_for("gfx942") == CDNA_REPO and manifest.repo_for("gfx950") == CDNA_REPO
    assert manifest.repo_for("gfx1151") == MAIN_REPO
    assert manifest.families["gfx942"].tag == CDNA
    manifest.override_repo("me/mirror")
    assert manifest.repo_for("gfx942") == "me/mirror"
