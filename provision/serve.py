"""Run the vLLM server in the foreground: isolated environment, own process group, real readiness.

Ready means /health answers 200 AND a one-token completion with the served name succeeds (a
server can be healthy and crash at its first request). Stopping kills the whole process group and
then looks for any process that still carries this run's marker in its environment, because
VLLM::EngineCore outliving its API server is what keeps GPU memory held after an interrupted load.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ..bundle_env import bundle_env
from . import wait_ready as readiness
from .log_signatures import Cause, diagnose

MARKER = "ROCMDOCTOR_SERVE_ID"
STOP_GRACE_S = 30.0
POLL_S = 1.0
LOG_TAIL_LINES = 40


class Stopped(Exception):
    """SIGTERM or SIGINT arrived; the server is to be stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def default_cache_base(env: Mapping[str, str]) -> Path:
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def server_env(base: Mapping[str, str], cache_root: Path, api_key: str | None, marker: str) -> dict[str, str]:
    env = bundle_env(base, VLLM_CACHE_ROOT=str(cache_root))
    env[MARKER] = marker
    if api_key:
        env["VLLM_API_KEY"] = api_key
    return env


RESOLVE_TIMEOUT_S = 5.0


class HostUnresolvable(ValueError):
    """--host names no address this machine can bind (or its lookup did not answer in time)."""


@functools.lru_cache(maxsize=8)
def bind_address(host: str) -> str:
    """The address to bind for `host`: an IP literal as it is, a name looked up once within
    RESOLVE_TIMEOUT_S (a resolver that does not answer would otherwise hold every port probe)."""
    try:
        return str(ipaddress.ip_address(host or "0.0.0.0"))
    except ValueError:
        pass
    found: list[str] = []

    def lookup() -> None:
        try:
            found.append(str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]))
        except (OSError, UnicodeError, IndexError):
            pass

    thread = threading.Thread(target=lookup, daemon=True)
    thread.start()
    thread.join(RESOLVE_TIMEOUT_S)
    if not found:
        raise HostUnresolvable(
            f"--host {host!r} does not resolve to an address here (within {RESOLVE_TIMEOUT_S:g} s); "
            "give an address such as 127.0.0.1, 0.0.0.0 or ::1, or a name this host resolves"
        )
    return found[0]


def port_in_use(host: str, port: int) -> bool:
    """True when `port` cannot be bound on `host` (raises HostUnresolvable for a host that names nothing)."""
    address = bind_address(host)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return True
    return False


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 64 * 1024))
            text = log.read(64 * 1024).decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Outcome:
    ready: bool
    seconds: float
    reason: str = ""
    cause: Cause | None = None
    log_tail: str = ""
    returncode: int | None = None
    health_seconds: float | None = None  # when /health first answered 200

    def to_json(self) -> dict:
        return {
            "ready": self.ready,
            "seconds": round(self.seconds, 1),
            "reason": self.reason,
            "health_seconds": None if self.health_seconds is None else round(self.health_seconds, 1),
            "cause": self.cause.to_json() if self.cause else None,
            "returncode": self.returncode,
            "log_tail": self.log_tail,
        }


@dataclass
class Server:
    executable: Path
    argv: list[str]
    base_url: str
    served_name: str
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen | None = field(default=None, init=False)
    started_at: float = field(default=0.0, init=False)

    @property
    def marker(self) -> str:
        return self.env[MARKER]

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            # Own session = own process group: one killpg reaches the API server and EngineCore, and
            # the terminal's Ctrl-C reaches only us, so the stop is ours to sequence.
            self.process = subprocess.Popen(
                [str(self.executable), *self.argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.started_at = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    def failure(self, reason: str) -> Outcome:
        text = tail(self.log_path, 400)
        returncode = self.process.poll() if self.process else None
        return Outcome(
            False,
            self.elapsed(),
            reason,
            diagnose(text, returncode),
            "\n".join(text.splitlines()[-LOG_TAIL_LINES:]),
            returncode,
        )

    def wait_ready(
        self, timeout_s: float, progress: Callable[[float, str], None] = lambda s, line: None
    ) -> Outcome:
        assert self.process is not None
        key = self.env.get("VLLM_API_KEY")
        # Every request ends by the deadline, so a server that trickles its answers cannot hold us.
        while (left := timeout_s - self.elapsed()) > 0:
            if self.process.poll() is not None:
                return self.failure(f"the server exited with status {self.process.returncode} while loading")
            if readiness.healthy(self.base_url, left):
                health_s = self.elapsed()
                left = timeout_s - self.elapsed()
                if left <= 0:
                    break
                problem = readiness.completion(
                    self.base_url, self.served_name, key, min(left, readiness.COMPLETION_TIMEOUT_S)
                )
                if problem is None:
                    return Outcome(True, self.elapsed(), health_seconds=health_s)
                # Give a dying engine a moment so its traceback is in the log we diagnose.
                time.sleep(min(2.0, max(0.0, timeout_s - self.elapsed())))
                outcome = self.failure(
                    f"/health answered 200 but a completion with {self.served_name!r} failed: {problem}"
                )
                outcome.health_seconds = health_s
                return outcome
            progress(self.elapsed(), tail(self.log_path, 1))
            time.sleep(max(0.0, min(POLL_S, timeout_s - self.elapsed())))
        return self.failure(
            f"not ready after {timeout_s:.0f} s (raise --timeout for a cold JIT or a large model)"
        )

    def wait_exit(self) -> int:
        assert self.process is not None
        return self.process.wait()

    def leftovers(self) -> list[psutil.Process]:
        """Processes of this run still alive: same process group, or our marker in their environment."""
        pgid = self.process.pid if self.process else -1
        found = []
        for proc in psutil.process_iter(["pid"]):
            if proc.pid == os.getpid():
                continue
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if os.getpgid(proc.pid) == pgid or proc.environ().get(MARKER) == self.marker:
                    found.append(proc)
            except (psutil.Error, ProcessLookupError, PermissionError):
                continue
        return found

    def stop(self, grace_s: float = STOP_GRACE_S) -> list[int]:
        """SIGTERM the group, SIGKILL what is left after the grace period; the pids that survived."""
        if self.process is None:
            return []
        pgid = self.process.pid
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
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


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class SignalsToStop:
    """While active, the first SIGTERM, SIGINT or SIGHUP (terminal closed) raises Stopped in the main
    thread; later ones are ignored so that a second Ctrl-C cannot interrupt the stop (which ends in
    SIGKILL anyway)."""

    def __enter__(self) -> SignalsToStop:
        self.received = False

        def handler(signum, frame):
            if not self.received:
                self.received = True
                raise Stopped(signum)

        self.previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self.previous.items():
            signal.signal(sig, old)


def new_marker() -> str:
    return uuid.uuid4().hex


class ProgressLine:
    """A live line on a terminal; one line every 15 s when stderr is a log."""

    def __init__(self, name: str, stream=None) -> None:
        self.name = name
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.last = 0.0

    def __call__(self, seconds: float, log_line: str) -> None:
        line = f"loading {self.name}: {seconds:.0f} s | {log_line.strip()[-100:]}"
        if self.live:
            self.stream.write("\r\033[K" + line)
        elif seconds - self.last >= 15:
            self.last = seconds
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()
