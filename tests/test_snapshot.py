"""`rocmdoctor snapshot` captures what the checks read; replaying it with --root gives the same report."""

from __future__ import annotations

import json
import tarfile

import pytest
from harness.hosts import FIXTURE_IDS, check_json, fixture_root, normalize, run_cli
from rocmdoctor.checks import load_registry


def take(root, out, *args):
    proc = run_cli("snapshot", str(out), *args, root=root)
    assert proc.returncode == 0, proc.stderr
    return proc


def replay(archive, dest):
    dest.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="fully_trusted")
    return dest


@pytest.mark.parametrize("fixture_id", FIXTURE_IDS)
def test_replayed_snapshot_gives_the_same_report(fixture_id, tmp_path):
    archive = tmp_path / "host.tar.gz"
    take(fixture_root(fixture_id), archive)
    _, original, _ = check_json(fixture_root(fixture_id))
    rc, replayed, stderr = check_json(replay(archive, tmp_path / "replay"))
    assert "Traceback" not in stderr
    assert normalize(replayed) == normalize(original)
    assert rc == original["exit_code"]


def test_snapshot_holds_only_declared_env_and_the_users_lines(tmp_path):
    archive = tmp_path / "mi300x.tar.gz"
    take(fixture_root("mi300x"), archive)
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        env = json.load(tar.extractfile(".rocmdoctor/env.json"))
        group = tar.extractfile("etc/group").read().decode()
        engine_cmdline = tar.extractfile("proc/13673/cmdline").read()
    declared_env = {n for spec in load_registry().specs for n in spec.env}
    assert set(env) <= declared_env
    assert {line.split(":")[0] for line in group.splitlines()} == {"video", "render", "ubuntu"}
    # The engine is reported, so its command line is kept; the web server's is not.
    assert engine_cmdline.startswith(b"VLLM::EngineCore")
    assert "proc/22751/cmdline" not in names and "proc/22751/comm" in names


def test_snapshot_of_this_machine_replays(tmp_path):
    """The live host, as a user would run it: everything but the moving parts must agree."""
    archive = tmp_path / "live.tar.gz"
    take("/", archive)
    _, live, _ = check_json("/")
    _, replayed, _ = check_json(replay(archive, tmp_path / "replay"))
    moving = {"processes.orphans", "disk.space"}
    strip = lambda r: {c["id"]: (c["status"], c["summary"]) for c in r["checks"] if c["id"] not in moving}
    assert strip(replayed) == strip(live)
    assert replayed["host"] == live["host"]


@pytest.mark.parametrize(
    "out, message", [("host.zip", "*.tar.gz"), ("missing-dir/host.tar.gz", "does not exist")]
)
def test_bad_output_path_is_a_clear_error(tmp_path, out, message):
    proc = run_cli("snapshot", str(tmp_path / out), root=fixture_root("strix-point"))
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
