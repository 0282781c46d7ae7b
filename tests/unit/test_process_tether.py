"""A tethered ProcessGroup dies with the process that started it, SIGKILL included (no `finally` runs
then): the tether stops the group and every process carrying the marker, one that left the group too.
`sleep` stands in for the server here; tests/system/test_tune_engine.py proves it on vLLM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

from rocmdoctor.host_processes import ProcessGroup

PARENT = """
import sys, time
from pathlib import Path
from rocmdoctor.host_processes import ProcessGroup
group = ProcessGroup(["sh", "-c", "setsid sleep 1001 & exec sleep 1000"], {"PATH": "/usr/bin:/bin"},
                     Path(sys.argv[1]), ("TETHER_TEST", sys.argv[2]), tether=True)
group.start()
print(group.process.pid, group.tether.pid, flush=True)
time.sleep(600)
"""


def marked(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get("TETHER_TEST") == tag:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def wait_until(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_a_sigkilled_parent_leaves_nothing_of_its_group(tmp_path):
    tag = uuid.uuid4().hex
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "log"), tag], stdout=subprocess.PIPE, text=True
    )
    try:
        server_pid, tether_pid = map(int, parent.stdout.readline().split())
        assert wait_until(lambda: len(marked(tag)) == 2)  # the group's sleep and the one that left it
        assert os.getpgid(tether_pid) == tether_pid != os.getpgid(server_pid)  # its own session
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert wait_until(lambda: not marked(tag)), [p.cmdline() for p in marked(tag)]
        assert wait_until(
            lambda: (
                not psutil.pid_exists(tether_pid)
                or psutil.Process(tether_pid).status() == psutil.STATUS_ZOMBIE
            )
        )
    finally:
        parent.kill()
        for proc in marked(tag):
            proc.kill()


def test_a_normal_stop_releases_the_tether(tmp_path):
    tag = uuid.uuid4().hex
    group = ProcessGroup(
        ["sleep", "1000"],
        {"PATH": "/usr/bin:/bin"},
        Path(tmp_path / "log"),
        ("TETHER_TEST", tag),
        tether=True,
    )
    group.start()
    assert group.tether is not None and group.tether.poll() is None
    assert group.stop(grace_s=5) == []
    assert group.tether.poll() is not None  # it looked once, found nothing, and exited
    assert marked(tag) == []


def test_a_program_that_cannot_start_leaves_no_tether(tmp_path):
    group = ProcessGroup(
        ["/nonexistent/server"], {}, Path(tmp_path / "log"), ("TETHER_TEST", "x"), tether=True
    )
    try:
        group.start()
    except OSError:
        pass
    else:
        raise AssertionError("started a program that does not exist")
    assert group.tether is not None and group.tether.poll() is not None
