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
import time
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from rocmdoctor.host import Host, RunResult

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
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

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, marker: tuple[str, str]) -> None:
        self.argv, self.env, self.log_path, self.marker = argv, env, log_path, marker
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Raises OSError when the program cannot be started (the log cannot be written, no such file)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
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
