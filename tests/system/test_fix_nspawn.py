"""`rocmdoctor fix` on a real systemd machine (systemd-nspawn): the diagnosis of a captured Strix Halo
(default TTM limit) is applied to the booted machine with `--target /`: the service user joins render,
the TTM modprobe file is written; a program merely titled VLLM::EngineCore (its parent PID 1) is not
vLLM by its identity and is left running (tests/system/test_fix_process_identity.py stops real vLLM
orphans); the verify step passes and a rerun changes nothing. The GPU facts come from the capture (no GPU exists here); every change is real
(usermod, the file, the signal)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import REPO
from harness.hosts import fixture_root
from harness.nspawn import Bind, boot

pytestmark = [pytest.mark.nspawn, pytest.mark.timeout(300)]

FIXTURE = fixture_root("strix-halo-default-ttm")


@pytest.fixture
def machine(tmp_path):
    started = boot(
        "fix", netns="fix", binds=[Bind(str(REPO)), Bind(str(Path(sys.base_prefix)))], log_dir=tmp_path
    )
    yield started
    started.stop()


def fix(machine) -> dict:
    argv = [
        sys.executable,
        "-m",
        "rocmdoctor",
        "--root",
        str(FIXTURE),
        "fix",
        "--target",
        "/",
        "--yes",
        "--json",
    ]
    done = machine.run(argv, timeout=120)
    return json.loads(done.stdout)


def test_fix_applies_verifies_and_is_idempotent(machine):
    machine.run(
        "getent group render || groupadd --system render; useradd --system --user-group --no-create-home vllm"
    )
    # A title is not an identity: `sleep` named VLLM::EngineCore, reparented to PID 1, is not an engine.
    machine.run("setsid bash -c '(exec -a VLLM::EngineCore sleep 600) </dev/null >/dev/null 2>&1 &'")
    assert machine.run(["pgrep", "-f", "VLLM::EngineCore"], check=False).returncode == 0

    first = fix(machine)
    changed = {item["id"] for item in first["items"] if item["changes"]}
    assert first["changed"] is True and changed == {"groups", "ttm"}, first["items"]
    assert {row["id"]: row["state"] for row in first["verify"]} == {
        "groups": "ok",
        "ttm": "ok",
    }
    assert "orphans" not in {item["id"] for item in first["items"]}

    assert "render" in machine.run(["id", "-nG", "vllm"]).stdout.split()
    ttm = machine.run(["cat", "/etc/modprobe.d/ttm.conf"]).stdout
    assert ttm.startswith("options ttm pages_limit=") and ttm.strip().split("=")[1].isdigit()
    assert machine.run(["pgrep", "-f", "VLLM::EngineCore"], check=False).returncode == 0

    again = fix(machine)
    assert again["changed"] is False and again["msg"] == "nothing to change"
