"""The process side of the write/run seam: every program provisioning starts goes through here.

Two shapes. `run_program`: a program that must finish within a total deadline (the new bundle's
interpreter, `compileall`); its whole process group is killed when the deadline passes. `ProcessGroup`:
a long-running program (the vLLM server) in its own session, whose `stop()` reaches the whole group
(SIGTERM, a grace period, then SIGKILL) and every process that carries the run's marker in its
environment (one that left the group). `SignalsToStop` turns the terminal's signals into an exception so
that the caller's `finally`/`except` paths, not the default action, end the run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from rocmdoctor.host import Host, RunResult

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
TETHER_GRACE_S = 10.0
# The tether of a ProcessGroup (see ProcessGroup's `tether`), run as `python -I -S -c` (standard library
# only): it reads the group's id from its stdin, then waits for EOF, which comes when the parent closes
# the pipe or dies, however (the kernel closes a dead process's descriptors, SIGKILL included). Then it
# stops the group and every process carrying the marker (SIGTERM, a grace period, SIGKILL), looking once
# more a moment after the last one is gone for a child that was between fork and exec.
TETHER_CODE = r"""
import os, signal, sys, time
key, value, grace = sys.argv[1], sys.argv[2], float(sys.argv[3])
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)
data = b""
while len(data) < 64:
    chunk = os.read(0, 64)
    if not chunk:
        break
    data += chunk
while os.read(0, 4096):
    pass
words = data.split()
pgid = int(words[0]) if words and words[0].isdigit() else None
if pgid is not None and (pgid <= 1 or pgid == os.getpgrp()):
    pgid = None
needle = (key + "=" + value).encode()

def alive():
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/" + name + "/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] == b"Z":
                continue
            if pgid is not None and int(fields[2]) == pgid:
                found.append(int(name))
                continue
            with open("/proc/" + name + "/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(name))
        except (OSError, ValueError, IndexError):
            pass
    return found

for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
    if pgid is not None:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass
    for pid in alive():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    end = time.monotonic() + wait
    while alive() and time.monotonic() < end:
        time.sleep(0.2)
    time.sleep(0.5)
    if not alive():
        break
"""
KILL_WAIT_S = 10.0
TAIL_WINDOW = 64 * 1024


def run_program(
    argv: list[str], timeout_s: float, max_output: int = 256 * 1024, env: dict[str, str] | None = None
) -> RunResult:
    """Run a program of this machine to completion within `timeout_s` (its group killed after that);
    never raises: a program that could not start has `spawn_error`, one that ran out of time `timed_out`.
    `env`: the whole environment it gets (default: this process's)."""
    return Host().run(argv, timeout=timeout_s, max_output=max_output, env=env)


class Stopped(Exception):
    """SIGTERM, SIGINT or SIGHUP arrived; what runs is to be stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalsToStop:
    """While active, the first SIGTERM, SIGINT or SIGHUP (terminal closed) raises Stopped in the main
    thread; later ones are ignored so that a second Ctrl-C cannot interrupt the stop (which ends in
    SIGKILL anyway)."""

    def __enter__(self) -> SignalsToStop:
        self.received = False

        def handler(signum: int, frame: FrameType | None) -> None:
            if not self.received:
                self.received = True
                raise Stopped(signum)

        self.previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        # Once a stop was asked for, the process is on its way out: a second Ctrl-C that arrives after
        # the stop finished must not turn a clean exit into death by SIGINT.
        for sig, old in self.previous.items():
            signal.signal(sig, signal.SIG_IGN if self.received else old)


def tail(path: Path, lines: int, window: int = TAIL_WINDOW) -> str:
    """The last `lines` lines of a log file, from at most its last `window` bytes ("" when absent)."""
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - window))
            text = log.read(window).decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class ProcessGroup:
    """A long-running program in its own session (so its own process group), stdout and stderr to
    `log_path`. `marker` names an environment variable and value set for it: a child that leaves the
    group is still found by it."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        log_path: Path,
        marker: tuple[str, str],
        tether: bool = False,
    ) -> None:
        """`tether`: the group dies with this process, even by SIGKILL (no finally runs then): a second
        process in its own session holds the read end of a pipe whose only write end is ours, and
        stops the group (and the marker's processes) when the pipe closes."""
        self.argv, self.env, self.log_path, self.marker = argv, env, log_path, marker
        self.process: subprocess.Popen[bytes] | None = None
        self.tether: subprocess.Popen[bytes] | None = None
        self._tether_fd: int | None = None
        self._tethered = tether

    def _start_tether(self) -> None:
        read_fd, self._tether_fd = os.pipe()  # both close-on-exec: no other child inherits the write end
        try:
            self.tether = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", TETHER_CODE, *self.marker, str(TETHER_GRACE_S)],
                stdin=read_fd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a signal to our group (Ctrl-C, kill -- -PGID) spares it
            )
        finally:
            os.close(read_fd)

    def _release_tether(self) -> None:
        """The group is stopped: close our end, so the tether looks once, finds nothing, and exits."""
        if self._tether_fd is not None:
            os.close(self._tether_fd)
            self._tether_fd = None
        if self.tether is not None:
            try:
                self.tether.wait(timeout=TETHER_GRACE_S)
            except subprocess.TimeoutExpired:
                pass

    def start(self) -> None:
        """Raises OSError when the program cannot be started (the log cannot be written, no such file)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._tethered:
            # The tether first: killed at any moment after this line, we leave nothing behind (before
            # the group id reaches it, the tether finds the server by its marker).
            self._start_tether()
        try:
            self._spawn()
        except BaseException:
            self._release_tether()
            raise
        if self._tether_fd is not None:
            assert self.process is not None
            os.write(self._tether_fd, f"{self.process.pid}\n".encode())

    def _spawn(self) -> None:
        with self.log_path.open("wb") as log:
            # Own session = own process group: one killpg reaches the API server and EngineCore, and
            # the terminal's Ctrl-C reaches only us, so the stop is ours to sequence.
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**self.env, self.marker[0]: self.marker[1]},
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def poll(self) -> int | None:
        return self.process.poll() if self.process else None

    @property
    def returncode(self) -> int | None:
        return self.process.returncode if self.process else None

    def wait(self) -> int:
        assert self.process is not None
        return self.process.wait()

    def log_tail(self, lines: int) -> str:
        return tail(self.log_path, lines)

    def leftovers(self) -> list[psutil.Process]:
        """Processes of this run still alive: same process group, or the marker in their environment."""
        pgid = self.process.pid if self.process else -1
        key, value = self.marker
        found = []
        for proc in psutil.process_iter(["pid"]):
            if proc.pid == os.getpid():
                continue
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if os.getpgid(proc.pid) == pgid or proc.environ().get(key) == value:
                    found.append(proc)
            except (psutil.Error, ProcessLookupError, PermissionError):
                continue
        return found

    def stop(self, grace_s: float, kill_wait_s: float = KILL_WAIT_S) -> list[int]:
        """SIGTERM the group, SIGKILL what is left after the grace period; the pids that survived."""
        try:
            return self._stop(grace_s, kill_wait_s)
        finally:
            self._release_tether()

    def _stop(self, grace_s: float, kill_wait_s: float) -> list[int]:
        if self.process is None:
            return []
        pgid = self.process.pid
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
            for proc in self.leftovers():
                try:
                    proc.send_signal(sig)
                except psutil.Error:
                    pass
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                self.process.poll()
                if not self.leftovers():
                    return []
                time.sleep(0.2)
        self.process.poll()
        return [p.pid for p in self.leftovers()]

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop(grace_s=0.0)


def stop_pids(pids: list[int], grace_s: float = 10.0) -> dict[int, str]:
    """Stop these processes of this machine (SIGTERM, `grace_s`, then SIGKILL): pid -> how it ended
    ("terminated", "killed", "gone", or why it could not be stopped)."""
    out: dict[int, str] = {}
    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            proc.terminate()
            procs.append(proc)
        except psutil.NoSuchProcess:
            out[pid] = "gone"
        except psutil.AccessDenied:
            out[pid] = "not allowed to signal it (run as root)"
    _gone, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in procs:
        out[proc.pid] = "terminated"
    for proc in alive:
        try:
            proc.kill()
            out[proc.pid] = "killed"
        except psutil.NoSuchProcess:
            out[proc.pid] = "terminated"
    psutil.wait_procs(alive, timeout=KILL_WAIT_S)
    return out
