"""`rocmdoctor unit`: the rendered unit passes systemd's own checks; --write is idempotent like Ansible."""

from __future__ import annotations

import json
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from harness import trees
from harness.cli import rocmdoctor as run_in_process
from rocmdoctor.provision.server.unit import UnitError, command_line

MAX_EXPOSURE = 3.5


def rocmdoctor(*argv: str, root: Path | None = None) -> subprocess.CompletedProcess:
    return run_in_process(*argv, root=root)


def fake_prefix(base: Path) -> Path:
    """The installed layout the unit points at: a bundle's server shim and python under current/."""
    prefix = base / "opt" / "rocmdoctor"
    bin_dir = prefix / "current" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("vllm-server", "python3"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    return prefix


def rendered_unit(tmp_path: Path, *argv: str) -> Path:
    prefix = fake_prefix(tmp_path)
    done = rocmdoctor(
        "unit",
        "--model",
        "/srv/models/tiny",
        "--gpu-memory-utilization",
        "0.8",
        "--prefix",
        str(prefix),
        *argv,
    )
    assert done.returncode == 0, done.stderr
    (prefix / "libexec").mkdir()
    shutil.copy(REPO / "provision" / "server" / "wait_ready.py", prefix / "libexec")
    path = tmp_path / "vllm.service"
    path.write_text(done.stdout)
    return path


UNIT_VARIANTS = [
    (),
    ("--port", "9001", "--host", "0.0.0.0", "--max-num-seqs", "4", "--max-model-len", "2048"),
    ("--served-model-name", "my model 100%", "--", "--chat-template", "{{ $x }}", "--enforce-eager"),
]


@pytest.mark.parametrize("argv", UNIT_VARIANTS)
def test_rendered_unit_passes_systemd_analyze_verify_silently(tmp_path, argv):
    path = rendered_unit(tmp_path, *argv)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    # verify exits 0 on unknown keys and unparsable values: any output at all is a failure.
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


@pytest.mark.parametrize("argv", UNIT_VARIANTS[:2])
def test_rendered_unit_exposure_is_at_most_3_5(tmp_path, argv):
    path = rendered_unit(tmp_path, *argv)
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    level = re.search(r"Overall exposure level for vllm.service: ([\d.]+)", done.stdout)
    assert level, done.stdout + done.stderr
    assert float(level.group(1)) <= MAX_EXPOSURE


def test_unit_carries_the_hardening_the_gpu_needs(tmp_path):
    text = rendered_unit(tmp_path).read_text()
    for line in (
        "SupplementaryGroups=render video",
        "DeviceAllow=/dev/kfd rw",
        "DeviceAllow=char-drm rw",
        "PrivateDevices=no",
        "ProtectSystem=strict",
        "KillMode=control-group",
        "Restart=always",  # the API server exits 0 when EngineCore dies (vllm#48966)
        "StartLimitBurst=5",
        "TimeoutStartSec=1860",
        "EnvironmentFile=-/etc/rocmdoctor/vllm.env",
    ):
        assert line in text.splitlines(), line
    assert "PYTHONNOUSERSITE=1" in text and "PYTHONPATH" not in text
    assert "MemoryDenyWriteExecute" not in text.replace("# No MemoryDenyWriteExecute", "")


def test_exec_words_are_quoted_for_systemd():
    assert (
        command_line(["/a b/x", "100%", "$HOME", 'say "hi"', "plain"])
        == '"/a b/x" 100%% $$HOME "say \\"hi\\"" plain'
    )
    with pytest.raises(UnitError, match="control characters"):
        command_line(["tiny\nExecStartPre=/bin/sh"])


def account_root(tmp_path: Path) -> Path:
    """A root with this machine's account databases, without a `render` group."""
    root = trees.account_root(tmp_path)
    # Minimal Debian has no `render` group: take it out so --write must create it.
    group = root / "etc" / "group"
    group.write_text(
        "".join(line for line in group.read_text().splitlines(True) if not line.startswith("render:"))
    )
    return root


def write_unit(root: Path, *argv: str, write: bool = True) -> dict:
    done = rocmdoctor(
        "unit",
        *(["--write"] if write else []),
        "--target",
        str(root),
        "--json",
        "--model",
        "/srv/models/tiny",
        "--gpu-memory-utilization",
        "0.8",
        *argv,
        root=root,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_write_is_idempotent_and_keeps_the_secret_file_private(tmp_path):
    root = account_root(tmp_path)
    key_file = tmp_path / "key"
    key_file.write_text("0123456789abcdef0123\n")
    first = write_unit(root, "--api-key-file", str(key_file))
    assert first["changed"] is True
    assert set(first["accounts_created"]) >= {"group render", "user vllm"}
    assert first["daemon_reload"] == "skipped: systemd is not running here"
    unit_path = root / "etc/systemd/system/vllm.service"
    env_path = root / "etc/rocmdoctor/vllm.env"
    script = root / "opt/rocmdoctor/libexec/wait-ready"
    assert stat.S_IMODE(env_path.stat().st_mode) == 0o600
    assert "VLLM_API_KEY=0123456789abcdef0123" in env_path.read_text()
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert "vllm:" in (root / "etc/passwd").read_text()
    diffs = {f["path"]: f["diff"] for f in first["files"]}
    assert "+ExecStart=/opt/rocmdoctor/current/bin/vllm-server" in diffs["/etc/systemd/system/vllm.service"]
    assert "0123456789abcdef" not in json.dumps(first)

    before = {p: p.stat().st_mtime_ns for p in (unit_path, env_path, script)}
    second = write_unit(root, "--api-key-file", str(key_file))
    assert second["changed"] is False and second["accounts_created"] == []
    assert second["daemon_reload"] == "not needed"
    assert {p: p.stat().st_mtime_ns for p in before} == before

    env_path.chmod(0o644)
    assert write_unit(root, "--api-key-file", str(key_file))["changed"] is True
    assert stat.S_IMODE(env_path.stat().st_mode) == 0o600

    third = write_unit(root, "--api-key-file", str(key_file), "--port", "9000")
    changed = {f["path"]: f for f in third["files"] if f["changed"]}
    assert list(changed) == ["/etc/systemd/system/vllm.service"]
    assert "-ExecStart=" in changed["/etc/systemd/system/vllm.service"]["diff"]
    assert "+ExecStart=" in changed["/etc/systemd/system/vllm.service"]["diff"]
    assert not list(unit_path.parent.glob(".vllm.service.*")), "temp file left behind"


def test_write_text_output_shows_the_diff_and_changed(tmp_path):
    root = account_root(tmp_path)
    first = rocmdoctor(
        "unit", "--write", "--target", str(root), "--model", "m", "--gpu-memory-utilization", "0.8", root=root
    )
    assert first.returncode == 0, first.stderr
    assert (
        "changed /etc/systemd/system/vllm.service" in first.stdout
        and "+KillMode=control-group" in first.stdout
    )
    assert first.stdout.rstrip().endswith("changed=true")
    again = rocmdoctor(
        "unit", "--write", "--target", str(root), "--model", "m", "--gpu-memory-utilization", "0.8", root=root
    )
    assert again.stdout.rstrip().endswith("changed=false") and "+KillMode" not in again.stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--user", "Root Admin"), "not a valid system user name"),
        (("--api-key-file", "/nonexistent/key"), "/nonexistent/key: no such file"),
        (("--", "--api-key", "x"), "--api-key-file"),
        (("--", "--port", "1"), "computed by rocmdoctor"),
        (("--vllm-args", "--chat-template 'open"), "check the quotes"),
    ],
)
def test_bad_input_is_refused_without_writing(tmp_path, argv, message):
    root = account_root(tmp_path)
    done = rocmdoctor(
        "unit",
        "--write",
        "--target",
        str(root),
        "--model",
        "m",
        "--gpu-memory-utilization",
        "0.8",
        *argv,
        root=root,
    )
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (root / "etc/systemd").exists()


def test_api_key_with_spaces_is_refused(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("two words here\n")
    done = rocmdoctor(
        "unit", "--model", "m", "--gpu-memory-utilization", "0.8", "--api-key-file", str(key_file)
    )
    assert done.returncode == 2 and "openssl rand -hex 32" in done.stderr


WAIT_READY = REPO / "provision" / "server" / "wait_ready.py"


def test_wait_ready_ends_when_the_server_process_is_gone():
    exited = subprocess.Popen(["true"])
    exited.wait()
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(WAIT_READY), "http://127.0.0.1:9", "tiny", "60"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"MAINPID": str(exited.pid)},
    )
    assert done.returncode == 1 and f"pid {exited.pid}) exited while loading" in done.stderr
    assert time.monotonic() - started < 10


def test_wait_ready_gives_up_after_its_timeout():
    done = subprocess.run(
        [sys.executable, str(WAIT_READY), "http://127.0.0.1:9", "tiny", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={},
    )
    assert done.returncode == 1 and "not ready after 1 s" in done.stderr


def test_check_mode_reports_changes_and_writes_nothing(tmp_path):
    root = account_root(tmp_path)
    passwd_before = (root / "etc/passwd").read_text()
    planned = write_unit(root, "--check")
    assert planned["changed"] is True and planned["daemon_reload"] == "would run"
    assert "user vllm" in planned["accounts_created"]
    assert not (root / "etc/systemd").exists() and (root / "etc/passwd").read_text() == passwd_before
    write_unit(root)
    assert write_unit(root, "--check")["changed"] is False
    # --check on its own is the same dry run as --write --check
    assert write_unit(root, "--check", write=False)["changed"] is False


def test_the_write_json_is_the_change_envelope(tmp_path):
    root = account_root(tmp_path)
    planned = write_unit(root, "--check")
    assert list(planned)[0] == "schema_version" and planned["check"] is True
    assert planned["msg"].startswith("would change 6 files; would create") and "user vllm" in planned["msg"]
    assert "+ExecStart=" in planned["diff"] and "secret, not shown" in planned["diff"]
    done = write_unit(root)
    assert done["check"] is False and done["msg"].startswith("changed 6 files; created")
    again = write_unit(root)
    assert (again["changed"], again["msg"], again["diff"]) == (False, "nothing to change", "")
