"""The socket side of the seam: the cluster pre-flight's TCP connect matrix (listen briefly on the
declared ports, connect to another node's), and nothing else opens a socket to another machine.

A connect that is refused means the path is open and nobody listens (the listener is not up); a
timeout means something drops the packets (a firewall's DROP); EHOSTUNREACH/ENETUNREACH that no route
reaches the address. Each is reported in words, never raised.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass

CONNECT_TIMEOUT_S = 3.0
BACKLOG = 16


@dataclass(frozen=True)
class ConnectResult:
    address: str
    port: int
    ok: bool
    error: str | None
    seconds: float


_ERRNO_WORDS = {
    errno.ECONNREFUSED: "refused",
    errno.EHOSTUNREACH: "no route to host",
    errno.ENETUNREACH: "network is unreachable",
    errno.ETIMEDOUT: "timed out",
    errno.EADDRNOTAVAIL: "address not available",
}


def connect(address: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> ConnectResult:
    """One TCP connect (closed at once); a reset by a REJECT rule reads as refused."""
    started = time.monotonic()
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect((address, port))
        except TimeoutError:
            return ConnectResult(address, port, False, "timed out", time.monotonic() - started)
        except OSError as exc:
            word = _ERRNO_WORDS.get(exc.errno or 0, exc.strerror or str(exc))
            return ConnectResult(address, port, False, word, time.monotonic() - started)
    return ConnectResult(address, port, True, None, time.monotonic() - started)


class ListenError(OSError):
    """A declared port could not be bound (in use, or the address is not this node's)."""


def listen(address: str, ports: Iterable[int], seconds: float) -> list[int]:
    """Accept (and close at once) connections on each port of `address` for `seconds`; the ports
    that were connected to. Every socket is bound before any is served: a port in use fails it whole."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with contextlib.ExitStack() as stack, selectors.DefaultSelector() as selector:
        for port in ports:
            sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
            except OSError as exc:
                raise ListenError(exc.errno, f"cannot listen on {address}:{port}: {exc.strerror}") from None
            sock.listen(BACKLOG)
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ, port)
        reached: set[int] = set()
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(timeout=left):
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    conn, _peer = key.fileobj.accept()  # type: ignore[union-attr]
                    conn.close()
                    reached.add(key.data)
    return sorted(reached)
