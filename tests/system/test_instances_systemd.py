"""Two instances of vllm@.service under a real systemd (a Debian root booted with systemd-nspawn):
`rocmdoctor instances --write` lays two partitions of the captured MI308X CPX node out, skipping a
port something else holds; `systemctl start vllm.target` starts both through their readiness gates,
each with its own port and devices; stopping one leaves the other serving; stopping the target
leaves no process behind; rewriting while they run changes nothing.

The server in each instance is harness/instance_server.py (the fake OpenAI protocol on the
instance's port, recording its argv and environment), installed as <prefix>/current/bin/vllm-server.
Test-only drop-in, as in test_unit_systemd.py: the venv's python lives under /root, which the
unit's ProtectHome=yes hides, so ProtectHome=tmpfs and that one tree bound read-only.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from harness.hosts import two_instance_layout
from harness.nspawn import Bind, Machine, boot
from harness.polling import wait_for

pytestmark = [pytest.mark.nspawn, pytest.mark.timeout(600)]

PREFIX = "/opt/rocmdoctor"
API_KEY = "rack-test-key-0123456789"
VENV_PYTHON = Path(sys.executable)


def stub_server() -> str:
    return f'#!/bin/sh\ncd {REPO / "tests"}\nexec {VENV_PYTHON} -m harness.instance_server "$@"\n'


def dropin() -> str:
    # The stand-in server runs from this checkout (which may live under /tmp, private to the unit).
    return f"[Service]\nProtectHome=tmpfs\nBindReadOnlyPaths={Path(sys.base_prefix)} {REPO}\nRestartSec=1\n"


def write(machine: Machine) -> dict:
    argv = [
        str(VENV_PYTHON),
        "-m",
        "rocmdoctor",
        "instances",
        *two_instance_layout(),
        "--port",
        "8000",
        "--model",
        "/srv/models/tiny",
        "--served-model-name",
        "tiny",
        "--prefix",
        PREFIX,
        "--api-key-file",
        "/root/vllm.key",
        "--timeout",
        "60",
        "--write",
        "--json",
    ]
    done = machine.run(argv, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def state(machine: Machine, unit: str) -> str:
    return machine.unit_property(unit, "ActiveState")


def settled(machine: Machine, unit: str, wanted: str, timeout: float = 90) -> None:
    """The unit reaches `wanted` (a stop job still deactivating it gets `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while (now := state(machine, unit)) != wanted and time.monotonic() < deadline:
        time.sleep(0.5)
    assert now == wanted, f"{unit} is {now}, not {wanted}, {timeout:.0f} s after the stop"


def completion_status(machine: Machine, port: int) -> int:
    code = (
        "import json,urllib.request,urllib.error\n"
        f"r=urllib.request.Request('http://127.0.0.1:{port}/v1/completions',"
        "json.dumps({'model':'tiny','prompt':'Hi','max_tokens':2}).encode(),"
        f"{{'Content-Type':'application/json','Authorization':'Bearer {API_KEY}'}})\n"
        "try: print(urllib.request.urlopen(r,timeout=20).status)\n"
        "except urllib.error.HTTPError as e: print(e.code)\n"
        "except OSError: print(0)\n"
    )
    return int(machine.run(["python3", "-c", code]).stdout.strip())


def recorded(machine: Machine, port: int) -> dict:
    return json.loads(machine.run(["cat", f"/var/lib/vllm/instance-{port}.json"]).stdout)


@pytest.fixture
def machine(tmp_path):
    started = boot(
        "rack-units",
        netns="rack-units",
        binds=[Bind(str(REPO)), Bind(str(Path(sys.base_prefix)))],
        log_dir=tmp_path,
    )
    yield started
    started.stop()


def test_two_instances_of_the_template_under_systemd(machine):
    machine.run(
        f"mkdir -p {PREFIX}/current/bin && ln -s /usr/bin/python3 {PREFIX}/current/bin/python3 && "
        f"cat > {PREFIX}/current/bin/vllm-server && chmod 755 {PREFIX}/current/bin/vllm-server",
        input=stub_server(),
    )
    machine.run(f"umask 077; echo {API_KEY} > /root/vllm.key")
    # Something else already listens on 8001: the layout must step over it.
    machine.run(
        ["systemd-run", "--unit=squatter", "python3", "-m", "http.server", "8001", "--bind", "127.0.0.1"]
    )
    wait_for(lambda: machine.run(["ss", "-Htln", "sport = :8001"]).stdout.strip() != "", 30, "the squatter")

    first = write(machine)
    assert first["changed"] is True and first["daemon_reload"] == "done", first
    assert [(i["name"], i["port"], i["visible_devices"]) for i in first["instances"]] == [
        ("0", 8000, "0"),
        ("1", 8002, "1"),
    ]
    assert first["skipped_ports"] == [8001]
    machine.run(
        "mkdir -p /etc/systemd/system/vllm@.service.d && cat > /etc/systemd/system/vllm@.service.d/50-test.conf"
        " && systemctl daemon-reload",
        input=dropin(),
    )

    start = machine.run(["systemctl", "start", "vllm.target"], timeout=180, check=False)
    journal = machine.run(["journalctl", "-u", "vllm@*", "--no-pager", "-n", "60"], check=False).stdout
    assert start.returncode == 0, start.stderr + journal
    # The target is ordered after its instances. On a loaded 2-core machine an instance can miss its
    # readiness gate once and be restarted (Restart=always, "activating" meanwhile): both must end up
    # active on their own, without anyone starting them again.
    wait_for(
        lambda: state(machine, "vllm@0.service") == state(machine, "vllm@1.service") == "active",
        180,
        "both instances active",
    )
    assert completion_status(machine, 8000) == completion_status(machine, 8002) == 200
    for inst in first["instances"]:
        seen = recorded(machine, inst["port"])
        assert seen["env"]["ROCR_VISIBLE_DEVICES"] == inst["visible_devices"]
        assert seen["env"]["HIP_VISIBLE_DEVICES"] is None and seen["env"]["CUDA_VISIBLE_DEVICES"] is None
        assert seen["env"]["VLLM_API_KEY"] == API_KEY
        argv = seen["argv"]
        assert argv[argv.index("--port") + 1] == str(inst["port"])
        assert argv[argv.index("--gpu-memory-utilization") + 1] == f"{inst['gpu_memory_utilization']:.2f}"
        assert argv[argv.index("--tensor-parallel-size") + 1] == "1"
        assert argv[argv.index("--model") + 1] == "/srv/models/tiny"

    # Rewriting while they run: their ports are theirs, nothing changes, nothing restarts.
    again = write(machine)
    assert again["changed"] is False and [i["port"] for i in again["instances"]] == [8000, 8002], again

    survivor_pid = machine.unit_property("vllm@1.service", "MainPID")
    machine.run(["systemctl", "stop", "vllm@0.service"], timeout=60)
    settled(machine, "vllm@0.service", "inactive")
    assert state(machine, "vllm@1.service") == "active"
    assert completion_status(machine, 8000) == 0  # nothing listens there any more
    assert completion_status(machine, 8002) == 200
    # RemoveIPC= is reference-counted per user: the survivor's shared memory is still there.
    assert machine.run(["test", "-e", "/dev/shm/rack-instance-8002"], check=False).returncode == 0
    assert machine.unit_property("vllm@1.service", "MainPID") == survivor_pid

    machine.run(["systemctl", "restart", "vllm@0.service"], timeout=120)
    assert completion_status(machine, 8000) == 200
    assert len(machine.user_processes("vllm")) >= 2

    machine.run(["systemctl", "stop", "vllm.target"], timeout=120)
    # systemctl waits for the target's own stop job; the instances' jobs it pulled in finish on their own.
    settled(machine, "vllm@0.service", "inactive")
    settled(machine, "vllm@1.service", "inactive")
    assert machine.user_processes("vllm") == [], "processes of the instances survived stopping vllm.target"
    assert (
        machine.run("ls /dev/shm | grep rack-instance", check=False).stdout == ""
    )  # the last one out cleans up
    assert state(machine, "squatter.service") == "active"  # the target stops its own, nothing else
