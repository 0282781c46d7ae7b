"""One policy: each check's severity and declared scope decide what blocks install and serving."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import HOSTS
from rocmdoctor.checks import load_registry
from rocmdoctor.model import Action, Result, Severity, Status, failed, passed, warned
from rocmdoctor.policy import blocked_actions, blocking
from rocmdoctor.registry import CheckSpec, Outcome


def outcome(check_id: str, result: Result, severity=Severity.BLOCKING, blocks=None) -> Outcome:
    spec = CheckSpec(check_id, check_id, lambda ctx: result, severity=severity, blocks=blocks)
    return Outcome(spec, result, 0.0)


FAIL = failed("broken", "fix it")
ERROR = Result(Status.ERROR, "could not evaluate")


@pytest.mark.parametrize(
    "severity, status_result, blocks, action, blocked",
    [
        (Severity.BLOCKING, FAIL, None, Action.SERVE, True),
        (Severity.BLOCKING, FAIL, None, Action.INSTALL, False),  # default scope: serving only
        (Severity.BLOCKING, FAIL, (Action.INSTALL, Action.SERVE), Action.INSTALL, True),
        (Severity.BLOCKING, ERROR, (Action.INSTALL,), Action.INSTALL, True),  # cannot vouch: blocks
        (Severity.BLOCKING, warned("meh", "tune"), None, Action.SERVE, False),
        (Severity.BLOCKING, passed("fine"), None, Action.SERVE, False),
        (Severity.DEGRADING, FAIL, (Action.SERVE,), Action.SERVE, False),  # severity decides first
        (Severity.ADVISORY, FAIL, None, Action.SERVE, False),
    ],
)
def test_severity_and_scope_decide(severity, status_result, blocks, action, blocked):
    verdict = blocking([outcome("x.y", status_result, severity, blocks)], action)
    assert verdict.blocked is blocked
    assert verdict.to_json() == {"blocked": blocked, "blocking": ["x.y"] if blocked else []}


def test_every_blocking_check_guards_serving_and_install_guards_are_declared():
    specs = load_registry().specs
    for spec in specs:
        actions = blocked_actions(spec)
        assert (Action.SERVE in actions) == (spec.severity is Severity.BLOCKING), spec.id
    install = {s.id for s in specs if Action.INSTALL in blocked_actions(s)}
    assert install == {"gpu.present", "kernel.cwsr", "driver.dkms", "disk.space"}


def run_json(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "rocmdoctor", *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def test_report_carries_the_verdict_the_playbook_reads():
    report = run_json("--root", str(HOSTS / "strix-halo-nocwsr-dkms"), "check", "--json")
    failing = {c["id"] for c in report["checks"] if c["status"] == "fail"}
    assert report["policy"]["install"]["blocked"] is True
    assert set(report["policy"]["install"]["blocking"]) == {"kernel.cwsr", "driver.dkms"}
    assert set(report["policy"]["serve"]["blocking"]) <= failing
    assert "kernel.cwsr" in report["policy"]["serve"]["blocking"]


def test_clean_host_blocks_nothing():
    report = run_json("--root", str(HOSTS / "strix-halo-clean"), "check", "--json")
    assert report["policy"] == {
        "install": {"blocked": False, "blocking": []},
        "serve": {"blocked": False, "blocking": []},
    }
