"""One installed-bundle reader (`facts.installed_bundle`): a bundle of several parts, installed by the
real CLI from the loopback release server under a replayed root, is labelled in the health textfile
with the same digest `cluster facts` reports, and that digest is the one over every part
(`bundle_digest`), not its first part's; the version is the bundle's own vLLM dist-info's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from harness.cli import rocmdoctor
from harness.hosts import fixture_root
from rocmdoctor.facts.installed_bundle import bundle_digest, read_installed
from rocmdoctor.host import Host

TAG = "vllm0.32.0-rocm7.1.0-gfx1151"
DIST_INFO = "lib/python3.13/site-packages/vllm-0.32.0+rocm713.dist-info/METADATA"


def _installed_root(install_lab, tmp_path: Path):
    root = tmp_path / "root"
    shutil.copytree(fixture_root("strix-halo-clean"), root, symlinks=True)
    # Several parts (small part size) so "the first part's digest" and the bundle's differ.
    metadata = b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+rocm713\n\nVersion: 9.9 (not a header)\n"
    built = install_lab.bundle(TAG, extra={DIST_INFO: metadata}, payload=200_000, part_size=64 * 1024)
    assert len(built.assets) > 1
    prefix = root / "opt" / "rocmdoctor"
    done = install_lab.cli(
        "install", "--tag", TAG, "--prefix", str(prefix), "--gfx", "gfx1151", "--skip-qualify", "--json"
    )
    assert done.returncode == 0, done.stderr
    return root, built


def test_the_textfile_and_cluster_facts_give_one_digest_for_one_bundle(install_lab, tmp_path):
    root, built = _installed_root(install_lab, tmp_path)
    whole = bundle_digest((a.name, a.digest) for a in built.assets)

    out = tmp_path / "textfile" / "rocmdoctor.prom"
    out.parent.mkdir()
    check = rocmdoctor("--root", str(root), "check", "--prefix", "/opt/rocmdoctor", "--textfile", str(out))
    assert check.returncode in (0, 1), check.stderr
    families = {f.name: f.samples for f in text_string_to_metric_families(out.read_text())}
    (info,) = families["rocmdoctor_bundle_info"]

    facts = rocmdoctor(
        "--root", str(root), "cluster", "facts", "--json", "--advertise", "10.0.0.1", "--prefix", "/opt/rocmdoctor"
    )  # fmt: skip
    assert facts.returncode == 0, facts.stderr
    bundle = json.loads(facts.stdout)["bundle"]

    assert info.labels["digest"] == bundle["digest"] == whole
    assert whole != built.assets[0].digest
    assert info.labels["tag"] == bundle["tag"] == TAG
    # --skip-qualify records "not qualified": both say so from the same record
    assert info.labels["qualified"] == "false" and bundle["qualified"] is False
    assert bundle["vllm_version"] == "0.32.0+rocm713" and bundle["family"] == "gfx1151"


def test_a_qualification_record_of_other_parts_does_not_qualify_this_bundle(install_lab, tmp_path):
    root, _ = _installed_root(install_lab, tmp_path)
    record = root / "opt/rocmdoctor/current/.rocmdoctor-qualification.json"
    doc = json.loads(record.read_text())
    record.write_text(json.dumps({**doc, "qualified": True, "bundle_digest": "sha256:" + "0" * 64}))
    bundle = read_installed(Host(str(root)), "/opt/rocmdoctor")
    assert bundle.qualified is None and bundle.problem is not None
    assert "recorded for other parts" in bundle.problem


def test_no_bundle_and_a_hostile_record_are_said_not_guessed(tmp_path):
    root = tmp_path / "root"
    (root / "opt/rocmdoctor").mkdir(parents=True)
    none = read_installed(Host(str(root)), "/opt/rocmdoctor")
    assert not none.present and none.problem is not None
    current = root / "opt/rocmdoctor/current"
    current.mkdir()
    (current / ".rocmdoctor-qualification.json").write_text('{"tag": ' + "[" * 100_000)
    deep = read_installed(Host(str(root)), "/opt/rocmdoctor")
    assert not deep.present and "nested too deeply" in (deep.problem or "")
