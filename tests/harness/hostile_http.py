"""A loopback HTTP server that misbehaves on purpose, over real sockets (127.0.0.1 only).

Modes (HTTP/1.1 as RFC 9112 frames it: status line, header fields, CRLF, body of Content-Length bytes):
- "ok": the answer at once (status, headers, `body`);
- "drip-status": every byte of the answer, the status line's first included, one per `gap_s`;
- "drip-headers": the status line at once, then the header fields one byte per `gap_s`;
- "drip-body": status and headers at once (Content-Length of the whole body), the body one byte per `gap_s`;
- "silent": the connection is accepted and nothing is ever said.
The answer is the same for every path, so one server stands in for the release API, the Hub, /metrics and
a download mirror.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

MODES = ("ok", "drip-status", "drip-headers", "drip-body", "silent")


class HostileServer:
    def __init__(self, mode: str = "ok", body: bytes = b"{}", gap_s: float = 0.5, status: int = 200) -> None:
        assert mode in MODES
        self.mode, self.body, self.gap_s, self.status = mode, body, gap_s, status
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(32)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        try:
            self.sock.settimeout(0.2)
        except OSError:  # closed before the thread ran
            return
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            request = b""
            while b"\r\n\r\n" not in request and len(request) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                request += chunk
            status = f"HTTP/1.1 {self.status} X\r\n".encode()
            headers = (
                f"Content-Type: application/json\r\nContent-Length: {len(self.body)}\r\n"
                "Connection: close\r\n\r\n"
            ).encode()
            if self.mode == "silent":
                self.stop.wait(60)
                return
            if self.mode == "ok":
                conn.sendall(status + headers + self.body)
                return
            at_once, dripped = {
                "drip-status": (b"", status + headers + self.body),
                "drip-headers": (status, headers + self.body),
                "drip-body": (status + headers, self.body),
            }[self.mode]
            conn.sendall(at_once)
            for byte in dripped:
                if self.stop.wait(self.gap_s):
                    return
                conn.sendall(bytes([byte]))
        except OSError:
            pass
        finally:
            conn.close()

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


@contextmanager
def hostile_server(
    mode: str = "ok", body: bytes = b"{}", gap_s: float = 0.5, status: int = 200
) -> Iterator[HostileServer]:
    with HostileServer(mode, body, gap_s, status) as server:
        yield server


def elapsed(fn, *args, **kwargs) -> tuple[float, BaseException | None]:
    """Seconds `fn` took, and what it raised (None when it returned)."""
    started = time.monotonic()
    try:
        fn(*args, **kwargs)
    except BaseException as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None
