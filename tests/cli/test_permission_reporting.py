"""Unreadable is not absent: when the KFD topology or a tree's device table cannot be read, `check` says
so, naming the file (a failed finding, exit 1, no check in error); it never reports "no GPU" or
"/dev/kfd does not exist".

The check runs as root without the capabilities that let root read anything (CAP_DAC_OVERRIDE and
CAP_DAC_READ_SEARCH dropped with setpriv) against a topology directory owned by another user: the
same denial an ordinary user meets on a host whose sysfs permissions were tightened.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import HOSTS


def check_without_dac_override(root: Path) -> subprocess.CompletedProcess:
    """`rocmdoctor --root ROOT check --json` as root without the capabilities that bypass file modes,
    so root meets unreadable files as an unprivileged user does."""
    return subprocess.run(
        [
            "setpriv",
            "--bounding-set",
            "-dac_override,-dac_read_search",
            sys.executable,
            "-m",
            "rocmdoctor",
            "--root",
            str(root),
            "check",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def check_with_unreadable(tmp_path: Path, relative: str, mode: int) -> tuple[Path, dict]:
    """`check --json` on a copy of a fixture whose `relative` path belongs to another user with `mode`:
    a finding (exit 1), never a check in error."""
    root = tmp_path / "root"
    shutil.copytree(HOSTS / "strix-halo-clean", root, symlinks=True)
    os.chown(root / relative, 65534, 65534)
    (root / relative).chmod(mode)
    done = check_without_dac_override(root)
    assert "Traceback" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert done.returncode == 1 and report["summary"]["error"] == 0, report["summary"]
    return root / relative, report


def test_unreadable_topology_is_a_finding_naming_the_path_and_user(tmp_path):
    _, report = check_with_unreadable(tmp_path, "sys/class/kfd/kfd/topology/nodes", 0o700)
    present = next(c for c in report["checks"] if c["id"] == "gpu.present")
    assert present["status"] == "fail", present
    assert "cannot read /sys/class/kfd/kfd/topology/nodes as" in present["summary"]
    assert "none is a GPU" not in present["summary"] and "root" in present["remedy"]
    arch = next(c for c in report["checks"] if c["id"] == "gpu.arch")
    assert arch["status"] == "skip" and arch["details"]["skipped_because_of"] == "gpu.present"


def test_a_readable_topology_is_judged_as_before(tmp_path):
    done = check_without_dac_override(HOSTS / "strix-halo-clean")
    present = next(c for c in json.loads(done.stdout)["checks"] if c["id"] == "gpu.present")
    assert present["status"] == "pass"


def test_an_unreadable_device_table_is_a_finding_not_a_missing_dev_kfd(tmp_path):
    table, report = check_with_unreadable(tmp_path, ".rocmdoctor/stat.json", 0o600)
    loaded = next(c for c in report["checks"] if c["id"] == "driver.loaded")
    assert loaded["status"] == "fail", loaded
    assert f"cannot read {table} (Permission denied)" in loaded["summary"], loaded["summary"]
    assert "does not exist" not in loaded["summary"] and "root" in loaded["remedy"]
    assert loaded["details"]["unreadable"] == [str(table)]
