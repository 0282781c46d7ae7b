"""`rocmdoctor explain --unit` and `--lemonade` on a real systemd and journald (systemd-nspawn): the
journal of a unit's last start, not of its earlier runs, read through the Host's process seam."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import REPO
from harness.nspawn import Bind, boot
from harness.polling import wait_for

pytestmark = [pytest.mark.nspawn, pytest.mark.timeout(300)]

# A unit that prints whatever /etc/explain-msg says, then fails, as a vLLM start that died does.
UNIT = "[Service]\nType=exec\nExecStart=/bin/sh -c 'cat /etc/explain-msg; exit 1'\n"
EARLIER = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`\n"
LAST = "INFO 11-27 10:00:00 [api_server.py:1] starting\nOSError: [Errno 98] Address already in use\n"
# Lemonade's message (vllm_server.cpp) in lemond's line format, as lemond.service writes it to the journal.
LEMOND = (
    "[Error] (Router) Failed to load model: vllm-server failed to start within timeout. "
    "Your kernel may be missing the gfx1151 CWSR fix — see https://lemonade-server.ai/gfx1151_linux.html\n"
)


@pytest.fixture
def machine(tmp_path):
    started = boot(
        "explain-journal",
        netns="explain-journal",
        binds=[Bind(str(REPO)), Bind(str(Path(sys.base_prefix)))],
        log_dir=tmp_path,
    )
    started.run("cat > /etc/systemd/system/explain-vllm.service && systemctl daemon-reload", input=UNIT)
    yield started
    started.stop()


def run_once(machine, unit: str, text: str, journald_late: bool = False) -> None:
    """Start the unit once with `text` as its output; wait until the unit has failed and its output is in
    the journal. `journald_late`: journald is stopped until the process has exited, so it reads the
    output from a dead process, as it does under load (the lines then carry no invocation id)."""
    machine.run("cat > /etc/explain-msg", input=text)
    if journald_late:
        machine.run(["systemctl", "kill", "--signal=SIGSTOP", "systemd-journald.service"])
    try:
        machine.run(["systemctl", "start", unit], check=False)
        wait_for(lambda: machine.unit_property(unit, "ActiveState") == "failed", 30, f"{unit} failed")
    finally:
        if journald_late:
            machine.run(["systemctl", "kill", "--signal=SIGCONT", "systemd-journald.service"])
    last = text.strip().splitlines()[-1]
    wait_for(
        lambda: last in machine.run(["journalctl", "--unit", unit, "-o", "cat"]).stdout,
        30,
        f"{unit}'s output in the journal",
    )


def explain(machine, *args: str) -> dict:
    done = machine.run(
        [sys.executable, "-m", "rocmdoctor", "explain", "--json", *args], timeout=120, check=False
    )
    assert done.returncode == 1, done.stderr
    return json.loads(done.stdout)


def test_a_units_journal_is_read_since_its_last_start(machine):
    run_once(machine, "explain-vllm.service", EARLIER)
    run_once(machine, "explain-vllm.service", LAST, journald_late=True)
    report = explain(machine, "--unit", "explain-vllm")
    assert [c["id"] for c in report["causes"]] == ["port-in-use"]  # not the earlier run's no-kv-cache
    assert (
        report["sources"][0]["kind"] == "journal" and "since its last start" in report["sources"][0]["name"]
    )
    assert report["causes"][0]["host"]["verdict"] in ("confirmed", "ruled_out", "cannot_tell")


# lemond.service, and the name releases before lemond installed: --lemonade finds whichever is there.
@pytest.mark.parametrize("unit", ["lemond.service", "lemonade-server.service"])
def test_lemonade_is_read_from_its_services_journal(machine, unit):
    machine.run(f"cat > /etc/systemd/system/{unit} && systemctl daemon-reload", input=UNIT)
    run_once(machine, unit, LEMOND)
    report = explain(machine, "--lemonade")
    assert report["causes"][0]["id"] == "cwsr"
    assert report["sources"][0]["name"].startswith(f"journal of {unit}")
