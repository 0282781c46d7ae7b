"""`bundle cache purge` stays inside the cache and never pulls a cache from under a running process:
a `jit` directory that is a link to another tree is refused (exit 2), links inside the cache are
removed and never followed, and a cache a live process uses (a cache variable of its environment
naming it, its working directory in it, a file of it open) is kept and named. The processes are real
ones the test starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_jit_cache import _installed

from harness.cli import rocmdoctor
from harness.polling import wait_for

STALE = "gfx1100-0123456789abcdef"
OTHER = "gfx942-fedcba9876543210"


def open_files(pid: int) -> list[str]:
    fds = Path(f"/proc/{pid}/fd")
    return [os.readlink(fds / fd) for fd in os.listdir(fds)]


def purge(prefix: Path, state: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return rocmdoctor("bundle", "cache", "purge", "--prefix", str(prefix), "--state-dir", str(state), *more)


def outside(tmp_path: Path) -> Path:
    """A tree that is not the cache's, with a file in it."""
    tree = tmp_path / "precious"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "data").write_text("keep me")
    return tree


def test_a_jit_directory_that_is_a_link_is_refused(tmp_path):
    _installed(tmp_path / "prefix")
    precious = outside(tmp_path)
    (precious / STALE).mkdir()
    state = tmp_path / "state"
    state.mkdir()
    (state / "jit").symlink_to(precious)
    done = purge(tmp_path / "prefix", state, "--all")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "symbolic link" in done.stderr and "Traceback" not in done.stderr
    assert (precious / "sub" / "data").read_text() == "keep me" and (precious / STALE).is_dir()


def test_links_inside_the_cache_are_removed_never_followed(tmp_path):
    _installed(tmp_path / "prefix")
    precious = outside(tmp_path)
    jit = tmp_path / "state" / "jit"
    (jit / STALE / "triton").mkdir(parents=True)
    (jit / STALE / "triton" / "escape").symlink_to(precious)  # a link to a directory inside a key dir
    (jit / STALE / "file-link").symlink_to(precious / "sub" / "data")
    (jit / OTHER).symlink_to(precious / "sub")  # a key "directory" that is a link
    done = purge(tmp_path / "prefix", tmp_path / "state", "--json")
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(done.stdout)["removed"]) == sorted([OTHER, STALE])
    assert not (jit / STALE).exists() and not (jit / OTHER).is_symlink()
    assert (precious / "sub" / "data").read_text() == "keep me"


@pytest.mark.parametrize("use", ["environment", "working directory", "open file"])
def test_a_cache_in_use_by_a_live_process_is_kept(tmp_path, use):
    _installed(tmp_path / "prefix")
    state = tmp_path / "state"
    stale = state / "jit" / STALE
    (stale / "triton").mkdir(parents=True)
    (stale / "triton" / "kernel.bin").write_bytes(b"\x7fELF")
    (state / "jit" / OTHER / "triton").mkdir(parents=True)
    code = (
        "import sys, time\n"
        + ("f = open(sys.argv[1], 'rb')\n" if use == "open file" else "")
        + "time.sleep(600)\n"
    )
    env = {"TRITON_CACHE_DIR": str(stale / "triton")} if use == "environment" else {}
    cwd = stale if use == "working directory" else None
    server = subprocess.Popen(
        [sys.executable, "-c", code, str(stale / "triton" / "kernel.bin")], env=env, cwd=cwd
    )
    try:
        # the process has started (and, for "open file", opened it) before the purge looks
        if use == "open file":
            wait_for(
                lambda: str(stale / "triton" / "kernel.bin") in open_files(server.pid), 60, "the open file"
            )
        done = purge(tmp_path / "prefix", state, "--all", "--json")
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["removed"] == [OTHER] and STALE in out["kept"]
        assert out["in_use"] == {
            STALE: [f"{server.pid} (python{sys.version_info.major}.{sys.version_info.minor})"]
        }
        assert (stale / "triton" / "kernel.bin").exists()
    finally:
        server.kill()
        server.wait()
    again = purge(tmp_path / "prefix", state, "--all", "--json")
    assert json.loads(again.stdout)["removed"] == [STALE] and not stale.exists()
