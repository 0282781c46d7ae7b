"""The process side of the write/run seam: every program provisioning starts goes through here.

Two shapes. `run_program`: a program that must finish within a total deadline (the new bundle's
interpreter, `compileall`); its whole process group is killed when the deadline passes. `ProcessGroup`:
a long-running program (the vLLM server) in its own session, whose `stop()` reaches the whole group
(SIGTERM, a grace period, then SIGKILL) and every process that carries the run's marker in its
environment (one that left the group). `hold_vllm_orphans`/`stop_held`: processes judged ours by their
identity (rocmdoctor.process_identity), signalled only through the pidfd held since the judgement.
`SignalsToStop` turns the terminal's signals into an exception so
that the caller's `finally`/`except` paths, not the default action, end the run.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from rocmdoctor.host import Host, RunResult
from rocmdoctor.process_identity import ProcessFacts, process_table, read_facts, vllm_reason

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


@dataclass
class HeldProcess:
    """A process judged to be ours, held through a pidfd from the judgement to the signal: the fd names
    that process and no other, so a PID reused in between is never signalled (the signal goes through
    the fd, which answers ESRCH once its process is gone)."""

    facts: ProcessFacts
    why: str
    fd: int

    @property
    def pid(self) -> int:
        return self.facts.pid

    def label(self) -> str:
        return self.facts.label()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _alive(fd: int) -> bool:
    try:
        signal.pidfd_send_signal(fd, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _same_process(held: HeldProcess, host: Host) -> bool:
    """The PID still names the process judged: its fd's process is alive and /proc shows the same start
    time, user and executable (read after the fd was checked, so a reuse cannot slip between)."""
    now = read_facts(host, held.pid)
    return (
        now is not None
        and (now.start, now.uid, now.exe) == (held.facts.start, held.facts.uid, held.facts.exe)
        and _alive(held.fd)
    )


def hold_vllm_orphans(users: Collection[int]) -> tuple[list[HeldProcess], list[str]]:
    """This machine's orphaned vLLM servers (parent PID 1), judged by their identity
    (rocmdoctor.process_identity) and held through pidfds; only those of `users` (uids). Returns the
    held processes and a note for each vLLM orphan left alone (another user's, or one this kernel
    cannot hold). The caller closes what it does not stop."""
    host = Host()
    table = process_table(host)
    held: list[HeldProcess] = []
    notes: list[str] = []
    for pid, facts in sorted(table.items()):
        if facts.ppid != 1:
            continue
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        except OSError as exc:
            if vllm_reason(host, facts, table) is not None:
                notes.append(f"{facts.label()}: cannot hold it through a pidfd ({exc.strerror}); not stopped")
            continue
        # Judged from what /proc says after the fd was opened; the fd's process alive afterwards means
        # these facts are its own (its PID could not be reused while it lived).
        now = read_facts(host, pid)
        why = vllm_reason(host, now, table) if now is not None and now.ppid == 1 else None
        if now is None or why is None or not _alive(fd):
            os.close(fd)
            continue
        if now.uid not in users:
            notes.append(
                f"{now.label()} ({why}) belongs to uid {now.uid}, not the service user or root: not stopped"
            )
            os.close(fd)
            continue
        held.append(HeldProcess(now, why, fd))
    return held, notes


def _wait_exit(fds: list[int], timeout_s: float) -> set[int]:
    """The fds (of `fds`) whose process has not exited after `timeout_s` (a pidfd polls readable on exit)."""
    left = set(fds)
    deadline = time.monotonic() + timeout_s
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select(list(left), [], [], remaining)
        left -= set(ready)
    return left


def stop_held(processes: list[HeldProcess], grace_s: float = 10.0) -> dict[int, str]:
    """Stop held processes (SIGTERM through the pidfd, `grace_s`, then SIGKILL), each only if its PID
    still names the process judged: pid -> how it ended ("terminated", "killed", "gone", "not
    signalled: ..."). The fds are closed."""
    host = Host()
    out: dict[int, str] = {}
    signalled: dict[int, HeldProcess] = {}
    try:
        for proc in processes:
            if not _same_process(proc, host):
                if _alive(proc.fd):
                    out[proc.pid] = "not signalled: it now runs something else (its identity changed)"
                elif read_facts(host, proc.pid) is not None:
                    out[proc.pid] = "gone; not signalled: its PID now names another process"
                else:
                    out[proc.pid] = "gone"
                continue
            try:
                signal.pidfd_send_signal(proc.fd, signal.SIGTERM)
                signalled[proc.fd] = proc
            except ProcessLookupError:
                out[proc.pid] = "gone"
            except PermissionError:
                out[proc.pid] = "not allowed to signal it (run as root)"
        left = _wait_exit(list(signalled), grace_s)
        for fd, proc in signalled.items():
            out[proc.pid] = "terminated"
            if fd in left:
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    out[proc.pid] = "killed"
                except ProcessLookupError:
                    pass
        _wait_exit(list(left), KILL_WAIT_S)
    finally:
        for proc in processes:
            proc.close()
    return out
