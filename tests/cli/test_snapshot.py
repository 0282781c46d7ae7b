"""`rocmdoctor snapshot` captures what the checks read; replaying it with --root gives the same report."""

from __future__ import annotations

import json
import shutil
import tarfile

import pytest

from harness.hosts import FIXTURE_IDS, check_json, fixture_root, normalize, run_cli
from rocmdoctor.checks import load_registry

BUNDLE = "vllm0.1.0-rocm7.0.0-gfx1151"


def take(root, out, *args):
    proc = run_cli("snapshot", str(out), *args, root=root)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.parametrize("fixture_id", FIXTURE_IDS)
def test_replayed_snapshot_gives_the_same_report(fixture_id, tmp_path):
    archive = tmp_path / "host.tar.gz"
    take(fixture_root(fixture_id), archive)
    _, original, _ = check_json(fixture_root(fixture_id))
    rc, replayed, stderr = check_json(archive)  # --root takes the archive itself
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
    _, replayed, _ = check_json(archive)
    # toolchain.jit runs the live host's compiler; on a capture it skips by design (nothing there to run).
    moving = {"processes.orphans", "disk.space", "toolchain.jit"}

    def strip(r):
        return {c["id"]: (c["status"], c["summary"]) for c in r["checks"] if c["id"] not in moving}

    assert strip(replayed) == strip(live)
    assert replayed["host"] == live["host"]


@pytest.mark.parametrize(
    "out, message", [("host.zip", "*.tar.gz"), ("missing-dir/host.tar.gz", "does not exist")]
)
def test_bad_output_path_is_a_clear_error(tmp_path, out, message):
    proc = run_cli("snapshot", str(tmp_path / out), root=fixture_root("strix-point"))
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def _archive_with(tmp_path, archive_name, **member):
    import io

    archive = tmp_path / archive_name
    with tarfile.open(archive, "w:gz") as tar:
        meta = tarfile.TarInfo(".rocmdoctor")
        meta.type = tarfile.DIRTYPE
        tar.addfile(meta)
        info = tarfile.TarInfo(member["name"])
        if "link" in member:
            info.type, info.linkname = tarfile.SYMTYPE, member["link"]
            tar.addfile(info)
        else:
            data = member.get("data", b"x")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


@pytest.mark.parametrize(
    "member",
    [
        {"name": "../../etc/evil"},
        {"name": "sys/class/kfd", "link": "/etc"},
    ],
)
def test_hostile_snapshot_archive_is_refused_with_a_message(tmp_path, member):
    archive = _archive_with(tmp_path, "hostile.tar.gz", **member)
    proc = run_cli("check", "--json", root=archive)
    assert proc.returncode == 2
    assert "refusing unsafe member" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path.parent / "etc" / "evil").exists()


def test_absolute_member_names_are_refused(tmp_path):
    from pathlib import Path

    archive = _archive_with(tmp_path, "absolute.tar.gz", name="/etc/rocmdoctor-absolute-member-test")
    proc = run_cli("check", "--json", root=archive)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "absolute path" in proc.stderr
    assert not Path("/etc/rocmdoctor-absolute-member-test").exists()


def test_a_file_that_is_no_archive_is_a_usage_error(tmp_path):
    bogus = tmp_path / "notes.txt"
    bogus.write_text("not a tarball")
    proc = run_cli("check", root=bogus)
    assert proc.returncode == 2 and "not a readable snapshot archive" in proc.stderr


def test_links_in_a_captured_tree_never_lead_outside_the_root(tmp_path):
    from rocmdoctor.host import Host, ReadState

    (tmp_path / "proc" / "sys" / "kernel").mkdir(parents=True)
    secret = tmp_path.parent / f"{tmp_path.name}-outside"
    secret.write_text("6.99.0-secret\n")
    (tmp_path / "proc" / "sys" / "kernel" / "osrelease").symlink_to(secret)
    (tmp_path / "sys").symlink_to("/sys")
    host = Host(tmp_path)
    # Links resolve as inside a chroot: the absolute target is looked up under the root, where it is absent.
    read = host.read_text("/proc/sys/kernel/osrelease")
    assert read.state is ReadState.MISSING and read.value is None
    assert host.listdir("/sys") == [] and not host.is_dir("/sys")
    # A relative link climbing out is clamped at the root, as `..` at / is.
    (tmp_path / "proc" / "up").symlink_to("../../../../../../../../" + str(secret).lstrip("/"))
    assert host.read_text("/proc/up").state is ReadState.MISSING
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "inside").write_text("ok\n")
    (tmp_path / "proc" / "abs").symlink_to("/etc/inside")  # re-rooted, not read from the live /etc
    assert host.read_text("/proc/abs").value == "ok\n"


def non_root_user(root) -> str:
    return [line.split(":")[0] for line in (root / "etc/passwd").read_text().splitlines()][-1]


@pytest.mark.parametrize("fixture_id", FIXTURE_IDS)
def test_capture_then_replay_equals_live_with_a_prefix_and_user_of_its_own(fixture_id, tmp_path, install_lab):
    """A run with options that move its reads (a bundle under /srv/rd, another user): the snapshot holds
    what that run read, so its replay with the same options gives the same report."""
    root = tmp_path / "host"
    shutil.copytree(fixture_root(fixture_id), root, symlinks=True)
    install_lab.pin("gfx1151", install_lab.bundle(BUNDLE))
    installed = install_lab.cli(
        "install",
        "--family",
        "gfx1151",
        "--prefix",
        str(root / "srv/rd"),
        "--bundles-dir",
        str(install_lab.pins),
    )
    assert installed.returncode == 0, installed.stderr
    options = ("--prefix", "/srv/rd", "--user", non_root_user(root))
    archive = tmp_path / "host.tar.gz"
    take(root, archive, *options)
    _, live, _ = check_json(root, *options)
    rc, replayed, stderr = check_json(archive, *options)
    assert "Traceback" not in stderr
    assert normalize(replayed) == normalize(live)
    assert rc == live["exit_code"]
    # the options did move the reads: the same tree judged at the default prefix differs
    _, default_prefix, _ = check_json(root, "--user", non_root_user(root))
    assert normalize(default_prefix) != normalize(live)
