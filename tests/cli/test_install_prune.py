"""`bundle prune` and `install --prune` on real trees: keeps current and previous, frees the rest,
refuses a bundle a running process uses (a real process whose executable or cwd lies in it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

TAGS = [f"vllm0.{n}.0-rocm7.0.0-gfx1151" for n in range(1, 6)]


def _json(proc):
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def _five_bundles(prefix: Path) -> None:
    """Five complete bundles (payload on disk, metadata), TAGS[4] current and TAGS[3] previous."""
    for index, tag in enumerate(TAGS):
        root = prefix / "bundles" / tag
        (root / "bin").mkdir(parents=True)
        (root / "bin" / "payload").write_bytes(os.urandom(100_000))
        meta = {
            "schema_version": 1,
            "tag": tag,
            "family": "gfx1151",
            "installed_at": f"2026-01-0{index + 1}T00:00:00Z",
        }
        (root / ".rocmdoctor-bundle.json").write_text(json.dumps(meta))
    os.symlink(f"bundles/{TAGS[4]}", prefix / "current")
    os.symlink(f"bundles/{TAGS[3]}", prefix / "previous")


def _prune(lab, *args):
    return lab.cli("bundle", "prune", "--prefix", str(lab.prefix), *args)


def test_check_shows_what_would_go_and_removes_nothing(install_lab):
    _five_bundles(install_lab.prefix)
    doc = _json(_prune(install_lab, "--check", "--json"))
    assert doc["check"] is True and doc["changed"] is True and doc["schema_version"] == 1
    assert [r["tag"] for r in doc["removed"]] == TAGS[:3] and doc["kept"] == [TAGS[4], TAGS[3]]
    assert doc["freed_bytes"] >= 3 * 100_000 and "would remove 3 bundle(s)" in doc["msg"]
    assert sorted(p.name for p in (install_lab.prefix / "bundles").iterdir()) == sorted(TAGS)


def test_prune_keeps_current_and_previous_and_frees_the_rest(install_lab):
    _five_bundles(install_lab.prefix)
    proc = _prune(install_lab, "--json")
    doc = _json(proc)
    assert proc.returncode == 0 and doc["changed"] is True and doc["failed"] is False
    assert sorted(r["tag"] for r in doc["removed"]) == TAGS[:3] and doc["freed_bytes"] >= 3 * 100_000
    assert sorted(p.name for p in (install_lab.prefix / "bundles").iterdir()) == sorted(TAGS[3:])
    assert install_lab.current() == f"bundles/{TAGS[4]}"
    assert doc["diff"]["before"]["bundles"] != doc["diff"]["after"]["bundles"]
    again = _json(_prune(install_lab, "--json"))
    assert again["changed"] is False and again["removed"] == []


def test_keep_one_drops_previous_and_its_link(install_lab):
    _five_bundles(install_lab.prefix)
    doc = _json(_prune(install_lab, "--keep", "1", "--json"))
    assert doc["kept"] == [TAGS[4]] and len(doc["removed"]) == 4
    assert not os.path.lexists(install_lab.prefix / "previous")


@pytest.mark.parametrize("how", ["exe", "cwd"])
def test_prune_refuses_a_bundle_a_running_process_uses(install_lab, how):
    _five_bundles(install_lab.prefix)
    busy = install_lab.prefix / "bundles" / TAGS[1]
    if how == "exe":
        shutil.copy2(shutil.which("sleep"), busy / "bin" / "vllm-server")
        argv, cwd = [str(busy / "bin" / "vllm-server"), "60"], "/"
    else:
        argv, cwd = [shutil.which("sleep"), "60"], str(busy / "bin")
    server = subprocess.Popen(argv, cwd=cwd)
    try:
        time.sleep(0.2)
        proc = _prune(install_lab, "--json")
        doc = _json(proc)
        assert proc.returncode == 1 and doc["failed"] is True
        assert [r["tag"] for r in doc["refused"]] == [TAGS[1]]
        assert f"pid {server.pid}" in doc["refused"][0]["users"][0] and f"pid {server.pid}" in doc["msg"]
        assert sorted(r["tag"] for r in doc["removed"]) == [TAGS[0], TAGS[2]]
        assert busy.is_dir() and server.poll() is None
    finally:
        server.kill()
        server.wait()
    after = _json(_prune(install_lab, "--json"))  # once it stopped, the bundle goes
    assert [r["tag"] for r in after["removed"]] == [TAGS[1]]


def test_prune_and_rollback_on_a_missing_prefix_do_not_create_it(install_lab):
    for args in (["bundle", "prune"], ["rollback"], ["bundles"]):
        proc = install_lab.cli(*args, "--prefix", str(install_lab.prefix))
        assert "Traceback" not in proc.stderr
        assert proc.returncode in (0, 2), (args, proc.stderr)
    assert not install_lab.prefix.exists()


def test_install_reports_older_bundles_and_prunes_when_asked(install_lab):
    lab = install_lab
    _five_bundles(lab.prefix)
    new = "vllm0.9.0-rocm7.0.0-gfx1151"
    lab.bundle(new)
    plain = lab.shipped("--tag", new, "--json")
    doc = _json(plain)
    assert plain.returncode == 0, plain.stderr
    # current -> new, previous -> TAGS[4]: TAGS[0..3] are older
    assert sorted(b["tag"] for b in doc["older_bundles"]) == TAGS[:4]
    assert doc["older_bundles_bytes"] >= 4 * 100_000 and any("bundle prune" in n for n in doc["notes"])
    pruned = _json(lab.shipped("--tag", new, "--prune", "--json"))
    assert pruned["changed"] is True and sorted(r["tag"] for r in pruned["prune"]["removed"]) == TAGS[:4]
    assert sorted(p.name for p in (lab.prefix / "bundles").iterdir() if not p.name.startswith(".")) == sorted(
        [new, TAGS[4]]
    )


def test_the_writer_in_check_mode_records_each_removal_and_rollback_and_makes_none(tmp_path):
    """Check mode lives in the writer: prune and rollback get no check flag, and what they would change
    is the writer's record, the tree untouched."""
    from harness.trees import tree_state
    from rocmdoctor.host import Host
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.provision.bundle.install import prune, rollback

    _five_bundles(tmp_path)
    before = tree_state(tmp_path)
    writer = HostWriter("/", check_mode=True)
    result = prune(tmp_path, 1, Host(Path("/")), writer)
    rolled = rollback(tmp_path, writer, force=True)
    assert tree_state(tmp_path) == before
    assert result.check and rolled.check and rolled.changed
    removed = [op.subject for op in writer.operations if op.action == "remove"]
    assert removed == [str(tmp_path / "bundles" / t) for t in TAGS[:4]] + [str(tmp_path / "previous")]
    assert [op.action for op in writer.operations][-1] == "activate"
