"""The unit under a real systemd: a Debian root booted with systemd-nspawn runs `rocmdoctor install`
and `rocmdoctor unit --write`, then systemd starts the real engine, restarts it after SIGKILL of the
API server and after the death of its EngineCore (the API server exits 0 then, vllm#48966: the unit
restarts whatever the status), and stops it.

Test-only drop-in (never part of the product unit): the engine's venv and pyenv's python live under
/root on the test machine, which the unit's ProtectHome=yes hides, so the drop-in switches to
ProtectHome=tmpfs and binds exactly those two trees read-only; it also sets the CPU engine's
environment and RestartSec=1 so the restart is observed without waiting 15 s.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from harness.engine import vllm_python
from harness.nspawn import Bind, Machine, boot
from harness.polling import wait_for
from harness.served_bundle import ENGINE_ARGS, ENGINE_CORE_ENV, install_argv

pytestmark = [pytest.mark.nspawn, pytest.mark.engine, pytest.mark.timeout(900)]

PREFIX = "/opt/rocmdoctor"
MODEL = "/srv/models/tiny"
API_KEY = "nspawn-test-key-0123456789"
VLLM_VENV = vllm_python().parent.parent


def dropin() -> str:
    env = " ".join(f"{k}={v}" for k, v in ENGINE_CORE_ENV.items())
    return (
        "[Service]\nProtectHome=tmpfs\n"
        f"BindReadOnlyPaths={Path(sys.base_prefix)} {VLLM_VENV}\n"
        f"Environment={env}\nRestartSec=1\n"
    )


def completion_status(machine: Machine, key: str | None) -> int:
    code = (
        "import json,sys,urllib.request,urllib.error\n"
        "h={'Content-Type':'application/json'}\n"
        f"k={key!r}\n"
        "if k: h['Authorization']='Bearer '+k\n"
        "r=urllib.request.Request('http://127.0.0.1:8000/v1/completions',"
        "json.dumps({'model':'tiny','prompt':'Hi','max_tokens':2}).encode(),h)\n"
        "try: print(urllib.request.urlopen(r,timeout=60).status)\n"
        "except urllib.error.HTTPError as e: print(e.code)\n"
    )
    return int(machine.run(["python3", "-c", code]).stdout.strip())


@pytest.fixture
def machine(bundle_mirror, tiny_model, tmp_path):
    mirror, pins = bundle_mirror
    # The service user must be able to read the model (the cached copy is 0700 from mkdtemp).
    tiny_model.chmod(0o755)
    binds = [
        Bind(str(REPO)),
        Bind(str(Path(sys.base_prefix))),
        Bind(str(VLLM_VENV)),
        Bind(str(mirror)),
        Bind(str(pins)),
        Bind(str(tiny_model), MODEL),
    ]
    started = boot("serve-unit", netns="serve-unit", binds=binds, log_dir=tmp_path)
    yield started
    started.stop()


def test_unit_runs_restarts_and_stops_under_systemd(machine, bundle_mirror):
    mirror, pins = bundle_mirror
    installed = machine.run(install_argv(mirror, pins, Path(PREFIX), python=sys.executable), timeout=300)
    assert json.loads(installed.stdout)["changed"] is True
    machine.run(f"umask 077; echo {API_KEY} > /root/vllm.key")

    def write(model: str) -> dict:
        argv = [
            sys.executable,
            "-m",
            "rocmdoctor",
            "unit",
            "--write",
            "--json",
            "--model",
            model,
            "--served-model-name",
            "tiny",
            "--gpu-memory-utilization",
            "0.5",
            "--max-model-len",
            "512",
            "--max-num-seqs",
            "4",
            "--api-key-file",
            "/root/vllm.key",
            "--timeout",
            "300",
            "--",
            *ENGINE_ARGS,
        ]
        return json.loads(machine.run(argv).stdout)

    first = write("/srv/models/missing")
    assert first["changed"] is True and first["daemon_reload"] == "done"
    assert "group render" in first["accounts_created"] and "user vllm" in first["accounts_created"]
    machine.run(
        "mkdir -p /etc/systemd/system/vllm.service.d && cat > /etc/systemd/system/vllm.service.d/50-test.conf"
        " && systemctl daemon-reload",
        input=dropin(),
    )

    # A server that dies while loading fails the start at once, not after the 300 s readiness timeout:
    # the readiness gate says the server exited (a timed bound flaked on the shared 2-core machine).
    assert machine.run(["systemctl", "start", "vllm.service"], timeout=300, check=False).returncode != 0
    journal = machine.run(["journalctl", "-u", "vllm.service", "--no-pager"], check=False).stdout
    assert "exited while loading" in journal and "not ready after" not in journal, journal[-3000:]
    machine.run(["systemctl", "stop", "vllm.service"], check=False)

    fixed = write(MODEL)
    assert fixed["changed"] is True and fixed["daemon_reload"] == "done" and fixed["accounts_created"] == []
    assert [f["path"] for f in fixed["files"] if f["changed"]] == ["/etc/systemd/system/vllm.service"]
    again = write(MODEL)
    assert again["changed"] is False and again["daemon_reload"] == "not needed"
    machine.run(["systemctl", "reset-failed", "vllm.service"], check=False)

    start = machine.run(["systemctl", "start", "vllm.service"], timeout=480, check=False)
    journal = machine.run(["journalctl", "-u", "vllm.service", "--no-pager", "-n", "60"], check=False).stdout
    assert start.returncode == 0, start.stderr + journal
    assert machine.unit_property("vllm.service", "ActiveState") == "active"
    assert "ready after" in journal, "ExecStartPost's readiness wait did not report"
    assert completion_status(machine, API_KEY) == 200
    assert completion_status(machine, None) == 401

    main_pid = machine.unit_property("vllm.service", "MainPID")
    status = machine.run(["cat", f"/proc/{main_pid}/status"]).stdout
    groups = {
        line.split(":")[0]: line.split(":")[2]
        for line in machine.run(["getent", "group", "render", "video"]).stdout.splitlines()
    }
    proc_groups = next(x for x in status.splitlines() if x.startswith("Groups:")).split()[1:]
    assert set(groups.values()) <= set(proc_groups)
    assert "NoNewPrivs:\t1" in status
    # It serves under the hardening docs/security.md scores: the system-call filter and, bound to
    # 127.0.0.1 with a local model, loopback only (the completions above came through it).
    assert "Seccomp:\t2" in status
    assert machine.unit_property("vllm.service", "IPAddressDeny") not in ("", "[no data]")

    # SIGKILL of the API server orphans VLLM::EngineCore (vllm#55510); systemd must kill the rest
    # of the control group before it restarts the unit.
    first_generation = {line.split()[0] for line in machine.user_processes("vllm")}
    assert len(first_generation) >= 2, "expected the API server and EngineCore"
    machine.run(["kill", "-KILL", main_pid])
    restarted = wait_for(
        lambda: (
            machine.unit_property("vllm.service", "ActiveState") == "active"
            and machine.unit_property("vllm.service", "MainPID") not in ("0", main_pid)
            and int(machine.unit_property("vllm.service", "NRestarts")) >= 1
        ),
        420,
        "systemd to restart the unit",
    )
    assert restarted
    assert completion_status(machine, API_KEY) == 200

    # Gone before the new server started: systemd stops the whole group, and the unit's ExecStartPre
    # (stop-leftovers) stops what a stop that could not left in it.
    survivors = first_generation & {line.split()[0] for line in machine.user_processes("vllm")}
    everything = machine.run(["ps", "-e", "-o", "pid,stat,ppid,user,cgroup:60,args"], check=False).stdout
    journal = machine.run(["journalctl", "-u", "vllm.service", "--no-pager"], check=False).stdout
    everything += "\n".join(line for line in journal.splitlines() if "vllm-server[" not in line)
    assert survivors == set(), f"processes of the killed generation survived the restart:\n{everything}"
    assert "Main process exited, code=killed, status=9/KILL" in journal
    # The orphaned EngineCore was stopped by systemd's control-group kill (each test machine has a group
    # of its own: one shared with another machine's unit is one systemd 252 cannot kill).
    assert "Failed to kill control group" not in journal, everything

    # The EngineCore dies on its own (SIGKILL here): vLLM's API server then exits, with status 0
    # (vllm#48966), which Restart=on-failure took for a clean end; the unit restarts whatever the
    # status (Restart=always) and serves again.
    restarts = int(machine.unit_property("vllm.service", "NRestarts"))
    main_pid = machine.unit_property("vllm.service", "MainPID")
    engine_core = machine.run(["pgrep", "-u", "vllm", "-f", "^VLLM::EngineCore"]).stdout.split()
    seen = len(machine.run(["journalctl", "-u", "vllm.service", "--no-pager"], check=False).stdout)
    assert engine_core, machine.user_processes("vllm")
    machine.run(["kill", "-KILL", *engine_core])
    wait_for(
        lambda: (
            int(machine.unit_property("vllm.service", "NRestarts")) > restarts
            and machine.unit_property("vllm.service", "ActiveState") == "active"
            and machine.unit_property("vllm.service", "MainPID") not in ("0", main_pid)
        ),
        420,
        "systemd to restart the unit after its EngineCore died",
    )
    assert completion_status(machine, API_KEY) == 200
    journal = machine.run(["journalctl", "-u", "vllm.service", "--no-pager"], check=False).stdout
    since = journal[seen:]
    # The API server ended on its own after its engine died, and systemd scheduled a restart. systemd
    # logs a main process's exit at notice level only when it failed: with status 0 (vllm#48966) it
    # says "Deactivated successfully", an end Restart=on-failure would never have restarted.
    assert "Scheduled restart job" in since, since[-3000:]
    assert "Deactivated successfully" in since or "code=exited" in since, since[-3000:]

    before_stop = machine.user_processes("vllm")
    assert before_stop, "the engine should be running as user vllm"
    machine.run(["systemctl", "stop", "vllm.service"], timeout=150)
    assert machine.unit_property("vllm.service", "ActiveState") == "inactive"
    # `systemctl stop` returns once the cgroup is empty; a process pgrep listed as it exited (not yet
    # reaped on a loaded machine) gets a few seconds, a process that keeps running does not pass.
    reaped = time.monotonic() + 15
    while machine.user_processes("vllm") and time.monotonic() < reaped:
        time.sleep(1)
    left = machine.user_processes("vllm")
    assert left == [], (
        f"processes of the unit survived `systemctl stop`: {left}\n"
        + machine.run(["journalctl", "-u", "vllm.service", "--no-pager", "-n", "30"], check=False).stdout
    )
