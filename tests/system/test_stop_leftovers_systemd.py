"""The unit's ExecStartPre (provision/server/stop_leftovers.py) under a real systemd (systemd-nspawn):
processes an earlier run left in the unit's control group are gone before the next run starts, and
nothing outside that group is ever signalled.

To leave processes behind deterministically, the test unit says KillMode=process (systemd then stops
only the main process, as a container on the legacy hierarchy or a loaded machine was seen to leave
an orphaned VLLM::EngineCore: docs/unit.md); its sandbox is the shipped unit's own lines."""

from __future__ import annotations

import pytest

from conftest import REPO
from harness.nspawn import Machine, boot
from harness.polling import wait_for

pytestmark = [pytest.mark.nspawn, pytest.mark.timeout(300)]

SCRIPT = "/usr/local/libexec/stop-leftovers"
TEMPLATE = REPO / "provision" / "server" / "templates" / "vllm.service"
SANDBOX_PREFIXES = (
    "NoNewPrivileges",
    "Private",
    "Protect",
    "Restrict",
    "Lock",
    "SystemCall",
    "CapabilityBoundingSet",
    "UMask",
    "RemoveIPC",
    "Device",
)
# One leftover that goes on SIGTERM, one that ignores it (SIGKILL after the grace), as a worker does
# when its engine is gone.
SERVER = (
    "/bin/sh -c 'sleep 1000 & "
    'python3 -c "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1000)" & '
    "exec sleep 1000'"
)


def sandbox() -> str:
    lines = TEMPLATE.read_text().splitlines()
    kept = [line for line in lines if line.startswith(SANDBOX_PREFIXES)]
    assert any(line.startswith("ProtectProc=") for line in kept) and any(
        line.startswith("DevicePolicy=") for line in kept
    )
    return "\n".join(kept)


def unit_text() -> str:
    return (
        "[Service]\nType=exec\nUser=nobody\n"
        f"ExecStartPre=/usr/bin/python3 {SCRIPT} %n\n"
        f"ExecStart={SERVER}\n"
        "KillMode=process\nRestart=always\nRestartSec=1\n"
        f"{sandbox()}\n"
    )


# The unified hierarchy (every supported host) and the legacy one (a container on a cgroup v1 host,
# where systemd does not wait for a unit's leftovers): the script reads its group in either.
@pytest.fixture(params=["unified", "legacy"])
def machine(request, tmp_path):
    started = boot("leftovers", netns="leftovers", log_dir=tmp_path, unified=request.param == "unified")
    started.run(
        f"mkdir -p /usr/local/libexec && cat > {SCRIPT} && chmod 755 {SCRIPT}",
        input=(REPO / "provision" / "server" / "stop_leftovers.py").read_text(),
    )
    started.run("cat > /etc/systemd/system/leftover@.service && systemctl daemon-reload", input=unit_text())
    yield started
    # KillMode=process leaves the children at shutdown too (and one ignores SIGTERM): end them first
    started.run(["systemctl", "kill", "--signal=KILL", "leftover@*.service"], check=False)
    started.stop()


def group_pids(machine: Machine, unit: str) -> set[str]:
    group = machine.unit_property(unit, "ControlGroup")
    procs = machine.run(
        f"cat /sys/fs/cgroup{group}/cgroup.procs || cat /sys/fs/cgroup/systemd{group}/cgroup.procs"
    )
    return set(procs.stdout.split()) - {"0"}


def alive(machine: Machine, pids: set[str]) -> set[str]:
    if not pids:
        return set()
    done = machine.run(["ps", "-o", "pid=,stat=", "-p", ",".join(sorted(pids))], check=False)
    return {row.split()[0] for row in done.stdout.splitlines() if not row.split()[1].startswith("Z")}


def test_a_restart_stops_what_the_killed_run_left_and_nothing_else(machine):
    unit = "leftover@a.service"
    # the same user, another unit: never signalled
    machine.run(["systemd-run", "--uid=nobody", "--unit=bystander", "sleep", "1000"])
    bystander = machine.unit_property("bystander.service", "MainPID")
    machine.run(["systemctl", "start", unit])
    wait_for(lambda: len(group_pids(machine, unit)) == 3, 30, "the server and its two children")
    first = group_pids(machine, unit)
    main_pid = machine.unit_property(unit, "MainPID")

    machine.run(["kill", "-KILL", main_pid])
    wait_for(
        lambda: (
            machine.unit_property(unit, "ActiveState") == "active"
            and machine.unit_property(unit, "MainPID") not in ("0", main_pid)
            and int(machine.unit_property(unit, "NRestarts")) >= 1
        ),
        60,
        "systemd to restart the unit",
    )
    journal = machine.run(["journalctl", "-u", unit, "--no-pager", "-o", "cat"]).stdout
    assert alive(machine, first) == set(), journal
    assert "stopped leftovers of an earlier run (SIGKILL): " in journal, journal
    assert alive(machine, {bystander}) == {bystander}
    second = group_pids(machine, unit)
    wait_for(lambda: len(group_pids(machine, unit)) == 3, 30, "the new server and its children")
    assert not (second & first)

    # A clean start has nothing to stop and says nothing.
    machine.run(["systemctl", "stop", unit])
    machine.run(["pkill", "-KILL", "-u", "nobody", "-f", "sleep 1000|time.sleep"], check=False)
    machine.run(["systemctl", "start", "leftover@b.service"])
    quiet = machine.run(["journalctl", "-u", "leftover@b.service", "--no-pager", "-o", "cat"]).stdout
    assert "stopped leftovers" not in quiet


def test_outside_its_own_unit_it_refuses_and_stops_nothing(machine):
    unit = "leftover@a.service"
    machine.run(["systemctl", "start", unit])
    wait_for(lambda: len(group_pids(machine, unit)) == 3, 30, "the server and its two children")
    running = group_pids(machine, unit)
    # from another unit of the same user, and from a root shell, naming this unit
    other = machine.run(
        ["systemd-run", "--wait", "--pipe", "--uid=nobody", "/usr/bin/python3", SCRIPT, unit], check=False
    )
    shell = machine.run(["python3", SCRIPT, unit], check=False)
    for done in (other, shell):
        assert done.returncode == 2 and "stops nothing outside a unit's ExecStartPre" in done.stderr, done
    for bad in ([], ["a", "b"], ["../x.service"], ["vllm"]):
        done = machine.run(["python3", SCRIPT, *bad], check=False)
        assert done.returncode == 2 and done.stderr.startswith("usage: stop-leftovers UNIT_NAME"), done
    assert alive(machine, running) == running
