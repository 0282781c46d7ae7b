"""rocmdoctor-health.service under a real systemd, with all of its hardening: a Debian root booted
with systemd-nspawn gets the unit and the timer from `rocmdoctor unit --write`; the service runs
`check --textfile` to the end and leaves a valid file in the textfile directory (the only place it
may write), and the timer is armed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO
from harness.nspawn import Bind, boot
from rocmdoctor.provision.server.health_unit import (
    SERVICE_NAME,
    TEXTFILE,
    TEXTFILE_DIR,
    TIMER_NAME,
    rocmdoctor_path,
)

pytestmark = [pytest.mark.nspawn, pytest.mark.timeout(600)]

PREFIX = "/opt/rocmdoctor"


@pytest.fixture
def machine(tmp_path):
    started = boot("health-unit", binds=[Bind(str(REPO)), Bind(str(Path(sys.base_prefix)))], log_dir=tmp_path)
    yield started
    started.stop()


def test_the_health_service_runs_under_its_sandbox_and_the_timer_is_armed(machine):
    # Where the role puts rocmdoctor (its venv); here the repository's own, run by the same python.
    tool = rocmdoctor_path(PREFIX)
    machine.run(
        f"mkdir -p {Path(tool).parent} {TEXTFILE_DIR} && printf '#!/bin/sh\\nexec {sys.executable} -m rocmdoctor \"$@\"\\n'"
        f" > {tool} && chmod 755 {tool}"
    )
    written = machine.run(
        [sys.executable, "-m", "rocmdoctor", "unit", "--write", "--model", "/srv/models/tiny",
         "--served-model-name", "tiny", "--gpu-memory-utilization", "0.5", "--port", "8000"],
    )  # fmt: skip
    assert f"/etc/systemd/system/{TIMER_NAME}" in written.stdout
    # The stand-in runs this checkout's python, which may live under /tmp: private to the unit
    # (PrivateTmp=yes), so the checkout is bound into the unit's namespace, read-only; the product's
    # sandbox is otherwise the unit's own (a clone under /tmp failed with "exec: ...python: not found").
    dropin = f"/etc/systemd/system/{SERVICE_NAME}.d"
    machine.run(
        f"mkdir -p {dropin} && printf '[Service]\\nBindReadOnlyPaths={REPO}\\n' > {dropin}/checkout.conf"
        " && systemctl daemon-reload"
    )
    started = machine.run(["systemctl", "start", SERVICE_NAME], timeout=180, check=False)
    status = machine.run(["systemctl", "status", "--no-pager", SERVICE_NAME], check=False).stdout
    assert started.returncode == 0, (
        status + machine.run(["journalctl", "-u", SERVICE_NAME, "--no-pager"]).stdout
    )
    text = machine.run(["cat", TEXTFILE]).stdout
    families = {f.name: f.samples for f in text_string_to_metric_families(text)}
    assert families["rocmdoctor_up"][0].value == 1.0
    (probe,) = families["rocmdoctor_server_probe"]
    assert probe.labels == {"server": "vllm", "verdict": "unreachable"}  # no server runs here
    lint = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True)
    assert (lint.returncode, lint.stdout + lint.stderr) == (0, b"")
    # the sandbox holds: the service cannot write outside the textfile directory
    props = machine.run(["systemctl", "show", "-p", "ProtectSystem,ReadWritePaths,User", SERVICE_NAME]).stdout
    assert "ProtectSystem=strict" in props and f"ReadWritePaths={TEXTFILE_DIR}" in props
    assert "User=vllm" in props.splitlines()  # not root (docs/security.md): it wrote the file above
    machine.run(["systemctl", "enable", "--now", TIMER_NAME])
    assert machine.run(["systemctl", "is-active", TIMER_NAME]).stdout.strip() == "active"
    nxt = machine.run(
        ["systemctl", "show", "-p", "NextElapseUSecMonotonic", "--value", TIMER_NAME]
    ).stdout.strip()
    assert nxt not in ("", "0", "infinity"), nxt
