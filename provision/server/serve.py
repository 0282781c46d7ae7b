"""Run the vLLM server in the foreground: isolated environment, own process group, real readiness.

Ready means /health answers 200 AND a one-token completion with the served name succeeds (a
server can be healthy and crash at its first request). Stopping kills the whole process group and
then looks for any process that still carries this run's marker in its environment, because
VLLM::EngineCore outliving its API server is what keeps GPU memory held after an interrupted load.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from rocmdoctor.host_processes import ProcessGroup
from rocmdoctor.host_processes import SignalsToStop as SignalsToStop  # the serve command takes them from here
from rocmdoctor.host_processes import Stopped as Stopped
from rocmdoctor.host_processes import tail as log_tail
from rocmdoctor.provision.server import wait_ready as readiness
from rocmdoctor.provision.server.log_signatures import Cause, diagnose
from rocmdoctor.vllm.environment import bundle_env

MARKER = "ROCMDOCTOR_SERVE_ID"
STOP_GRACE_S = 30.0
POLL_S = 1.0
LOG_TAIL_LINES = 40


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
    return log_tail(path, lines)


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
    tether: bool = False  # the server dies with this process, even by SIGKILL (ProcessGroup's tether)
    process: ProcessGroup | None = field(default=None, init=False)
    started_at: float = field(default=0.0, init=False)

    @property
    def marker(self) -> str:
        return self.env[MARKER]

    def start(self) -> None:
        self.process = ProcessGroup(
            [str(self.executable), *self.argv], self.env, self.log_path, (MARKER, self.marker), self.tether
        )
        self.process.start()
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
        return self.process.leftovers() if self.process else []

    def stop(self, grace_s: float = STOP_GRACE_S) -> list[int]:
        """SIGTERM the group, SIGKILL what is left after the grace period; the pids that survived."""
        return self.process.stop(grace_s) if self.process else []


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
