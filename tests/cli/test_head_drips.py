"""Bounded time for every network read, the first byte and each header line included, over loopback.

Every connection rocmdoctor opens goes through provision/bounded_http (tests/unit/test_mechanisms.py
fails otherwise), so the class is proved on its three calls (request, get, open_stream) and end to end on
the textfile's server probe and `lemonade install-backend`. A server that drips its status line and
headers a byte at a time keeps each socket read short, so only a clock on the whole head ends it; a
server that is slow to begin (an install that works for minutes, then answers at once) must still be
waited for.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from harness.lemonade_server import make_report_host
from rocmdoctor.cli import cli
from rocmdoctor.provision import bounded_http
from rocmdoctor.provision.verify import health

DRIP = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Drip: " + b"." * 400  # 80 s at 0.2 s
SYSTEM_INFO = b'{"recipes": {"vllm": {"backends": {"rocm": {"state": "installable"}}}}}'


@contextlib.contextmanager
def server(drip_paths: tuple[str, ...] = ("/",), first_byte_s: float = 0.0) -> Iterator[str]:
    """Raw HTTP/1.1 over a real socket: a path in `drip_paths` (or every path, "/") drips its head; any
    other answers `{...}` after `first_byte_s` (for /api/v1/system-info, Lemonade's documented shape)."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def answer(conn: socket.socket) -> None:
        with conn:
            request = conn.recv(65536).decode("latin-1")
            path = request.split(" ", 2)[1].split("?", 1)[0] if " " in request else "/"
            if "/" in drip_paths or path in drip_paths:
                for byte in DRIP:
                    if stop.is_set():
                        return
                    try:
                        conn.sendall(bytes([byte]))
                    except OSError:
                        return
                    time.sleep(0.2)
                return
            time.sleep(first_byte_s)
            body = SYSTEM_INFO if path == "/api/v1/system-info" else b'{"status": "success"}'
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + b"Content-Length: %d\r\n\r\n" % len(body)
                + body
            )

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


def _get(url: str) -> None:
    bounded_http.get(url + "/x", deadline=bounded_http.Deadline(300), limit=100, read_s=300)


def _request(url: str) -> None:
    bounded_http.request(
        "POST", url + "/x", deadline=bounded_http.Deadline(300), limit=100, json_body={}, read_s=300
    )


def _stream(url: str) -> None:
    bounded_http.open_stream(url + "/x", deadline=bounded_http.Deadline(300), read_s=300).close()


CALLS = {"get": _get, "request": _request, "open_stream": _stream}


@pytest.fixture(autouse=True)
def short_head_clock(monkeypatch):
    """The head clock at 1 s (10 s in use), so that a slow first byte (2 s) outlasts it cheaply."""
    monkeypatch.setattr(bounded_http, "HEAD_S", 1.0)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_dripped_head_ends_long_before_the_total_deadline(call: str):
    with server() as url:
        started = time.monotonic()
        with pytest.raises((bounded_http.HttpError, OSError)):
            CALLS[call](url)
        # the deadline is 300 s and the drip lasts 80: only the head clock (HEAD_S) ends it this soon
        assert time.monotonic() - started < 30


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_server_slow_to_begin_is_still_waited_for(call: str):
    with server(drip_paths=(), first_byte_s=bounded_http.HEAD_S + 1) as url:
        CALLS[call](url)  # no error: the head clock starts at the first byte


def test_the_textfiles_server_probe_ends_on_a_dripped_head():
    with server() as url:
        started = time.monotonic()
        result = health.probe(health.Managed("vllm", url, "m", None, None, None))
    assert result.verdict == "timeout" and "GET /health" in result.detail
    assert time.monotonic() - started < 30


def test_lemonade_install_backend_ends_on_a_dripped_head(tmp_path):
    host = make_report_host(tmp_path / "host")
    with server(drip_paths=("/api/v1/install",)) as url:
        started = time.monotonic()
        result = CliRunner().invoke(
            cli,
            ["--root", str(host), "lemonade", "install-backend", "--url", url],
            env={"LEMONADE_ADMIN_API_KEY": "", "LEMONADE_API_KEY": "", "ROCMDOCTOR_LEMONADE_URL": ""},
        )
        elapsed = time.monotonic() - started
    # install-backend waits up to 1800 s for an install; a dripped head still ends within the head clock
    assert result.exit_code == 2 and "internal error" not in result.output, result.output
    assert elapsed < 30, elapsed
