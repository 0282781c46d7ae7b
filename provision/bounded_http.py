"""The one HTTP client of rocmdoctor's foreign servers (the release API, bundle downloads, the Hugging
Face Hub, vLLM's /metrics, Lemonade's API): one total deadline over connect, response headers and body.

`requests`' timeouts bound each socket read, not the whole exchange: a server that drips its status line
or headers one byte a second, or its body, keeps a plain `requests.get` busy forever. Here the exchange
runs in a worker thread and the caller waits for it at most until the deadline; when the deadline
passes, the response (if any) is closed, which ends the worker's next read, and the caller gets
`HttpTimeout` at once. Between reads the worker checks the deadline too (urllib3's `read1` returns
whatever one socket read gave), so a drip cannot outlast it either.

Error texts go through `sensitive.redact_exception`: an exception of requests can quote a header or a
URL with userinfo, and with them a token.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeVar

from rocmdoctor.sensitive import redact_exception, register_secret, register_url

CHUNK = 64 << 10
HEAD_S = 10.0  # a status line and its headers, from their first byte: a server writes them at once
T = TypeVar("T")


class HttpError(Exception):
    """The exchange failed: no connection, a broken answer. The text is redacted."""


class HttpTimeout(HttpError):
    """The deadline passed before the exchange finished."""


class HttpNoAnswer(HttpError):
    """One connect or read waited out its socket timeout (the server accepted nothing, or said nothing)."""


class HttpUnreachable(HttpError):
    """No connection: nothing listens there, or the name does not resolve."""


class BodyTooSlow(HttpTimeout):
    pass


@dataclass
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes = b""
    url: str = ""


@dataclass
class Deadline:
    """One total deadline for an operation (several requests share it)."""

    seconds: float
    end: float = field(init=False)

    def __post_init__(self) -> None:
        self.end = time.monotonic() + self.seconds

    def left(self) -> float:
        return self.end - time.monotonic()


@lru_cache(maxsize=1)
def _head_clock_adapter() -> Any:
    """requests' adapter whose connections read a response's head on a clock: once the first byte of the
    status line has come, the status line and every header line must all arrive within HEAD_S. A socket
    timeout bounds one read, so a server that drips its head a byte at a time never trips it; the total
    deadline ends such an exchange only when it is long (an install may legitimately wait minutes for
    the first byte, never for the rest of a head a server writes at once)."""
    import http.client
    import io
    import socket

    import requests
    import urllib3

    class HeadClockIO(socket.SocketIO):
        head_done = False
        first: float | None = None

        def readinto(self, b: Any) -> int | None:
            if self.head_done:
                return super().readinto(b)
            sock: Any = self._sock  # type: ignore[attr-defined]
            saved = sock.gettimeout()
            if self.first is not None:
                left = self.first + HEAD_S - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the status line and headers took longer than {HEAD_S:g} s")
                sock.settimeout(left if saved is None else min(saved, left))
            try:
                got = super().readinto(b)
            finally:
                sock.settimeout(saved)
            if got and self.first is None:
                self.first = time.monotonic()
            return got

    class ClockedResponse(http.client.HTTPResponse):
        def __init__(self, sock: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(sock, *args, **kwargs)
            self.fp.close()
            sock._io_refs += 1  # as socket.makefile does: the descriptor outlives the connection's close
            self.fp = io.BufferedReader(HeadClockIO(sock, "rb"))

        def begin(self) -> None:
            super().begin()
            raw = getattr(self.fp, "raw", None)
            if isinstance(raw, HeadClockIO):
                raw.head_done = True

    class Connection(urllib3.connection.HTTPConnection):
        response_class = ClockedResponse

    class TlsConnection(urllib3.connection.HTTPSConnection):
        response_class = ClockedResponse

    # urllib3's own names: its messages quote the pool's class ("HTTPSConnectionPool(host=...)")
    class HTTPConnectionPool(urllib3.HTTPConnectionPool):
        ConnectionCls = Connection

    class HTTPSConnectionPool(urllib3.HTTPSConnectionPool):
        ConnectionCls = TlsConnection

    class Adapter(requests.adapters.HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = {
                "http": HTTPConnectionPool,
                "https": HTTPSConnectionPool,
            }

    return Adapter


def new_session() -> Any:
    """A connection pool for several requests to one server (handed to `request`/`get` as `session`),
    whose responses' heads are read on the head clock."""
    import requests

    session = requests.Session()
    adapter = _head_clock_adapter()()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "x-api-key", "api-key")


def _learn_secrets(url: str, headers: Mapping[str, str] | None) -> None:
    """Every credential rocmdoctor sends leaves through here: the one redactor learns each (a Bearer
    token, a key header, a URL's userinfo), so a server that echoes it back is printed with ***."""
    register_url(url)
    for name, value in (headers or {}).items():
        if name.lower() in CREDENTIAL_HEADERS and isinstance(value, str):
            register_secret(value.split(None, 1)[-1] if " " in value else value)


def read_body(response, limit: int, deadline: float) -> bytes:
    """Up to `limit` bytes of `response` (a streamed requests.Response); BodyTooSlow when `deadline`
    (a time.monotonic() value) passes first, or a read stalls past the socket's read timeout. The caller asks for one byte more than it accepts to
    tell a body at the cap from a longer one."""
    from urllib3.exceptions import ReadTimeoutError

    raw = response.raw
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        if time.monotonic() > deadline:
            raise BodyTooSlow()
        try:
            chunk = raw.read1(min(CHUNK, limit - size), decode_content=True)
        except ReadTimeoutError:
            # The socket's read timeout is capped by the deadline: a body that stalls that long is one
            # that did not arrive in time, however loaded the machine that waited for it.
            raise BodyTooSlow() from None
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def within(deadline: Deadline, work: Callable[[dict[str, Any]], T], name: str = "http") -> T:
    """`work(box)` in a worker thread, waited for until `deadline` at most. `work` puts the response it
    opens into box["response"], so that it can be closed when the deadline passes (HttpTimeout)."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = work(box)
        except BaseException as exc:
            box["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    if not done.wait(max(0.0, deadline.left())) or isinstance(box.get("error"), BodyTooSlow):
        box["late"] = True
        response = box.get("response")
        if response is not None:
            try:
                response.close()  # wakes the worker; it is a daemon thread either way
            except Exception:
                pass
        raise HttpTimeout(f"no complete answer within {deadline.seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _timeouts(deadline: Deadline, connect_s: float, read_s: float) -> tuple[float, float]:
    left = max(0.05, deadline.left())
    return (min(connect_s, left), min(read_s, left))


def get(
    url: str,
    *,
    deadline: Deadline,
    limit: int,
    headers: Mapping[str, str] | None = None,
    session=None,
    byte_range: tuple[int, int] | None = None,
    connect_s: float = 10.0,
    read_s: float = 30.0,
) -> Answer:
    """GET `url`: status, headers and at most `limit` bytes of body (limit + 1 read without a range, so
    the caller can tell a body over the cap), all before `deadline`. With `byte_range`, a server that
    ignores Range (200 from byte 0) is read only up to the range's end and the range is cut out. The body
    of an answer other than 200 or 206 is not read."""
    sent = dict(headers or {})
    if byte_range:
        sent["Range"] = f"bytes={byte_range[0]}-{byte_range[1]}"
    return request(
        "GET",
        url,
        deadline=deadline,
        limit=limit,
        headers=sent,
        session=session,
        byte_range=byte_range,
        error_bodies=False,
        connect_s=connect_s,
        read_s=read_s,
    )


def request(
    method: str,
    url: str,
    *,
    deadline: Deadline,
    limit: int,
    headers: Mapping[str, str] | None = None,
    json_body: Any = None,
    session=None,
    byte_range: tuple[int, int] | None = None,
    error_bodies: bool = True,
    connect_s: float = 10.0,
    read_s: float = 30.0,
) -> Answer:
    """`method` on `url` with an optional JSON body: the answer's status, headers and at most `limit` + 1
    bytes of its body (the body of any status, unless `error_bodies` is off), all before `deadline`."""
    import requests
    import urllib3

    _learn_secrets(url, headers)
    sender = session or new_session()

    def work(box: dict[str, Any]) -> Answer:
        try:
            response = sender.request(
                method,
                url,
                json=json_body,
                headers=dict(headers or {}),
                stream=True,
                timeout=_timeouts(deadline, connect_s, read_s),
            )
            box["response"] = response
            with response:
                skip = byte_range[0] if byte_range and response.status_code == 200 else 0
                want = skip + limit + (0 if byte_range else 1)
                body = b""
                if error_bodies or response.status_code in (200, 206):
                    body = read_body(response, want, deadline.end)[skip:]
                return Answer(response.status_code, dict(response.headers), body, response.url or url)
        except BodyTooSlow:
            raise
        except requests.Timeout as exc:
            if box.get("late"):
                raise HttpTimeout("closed at the deadline") from None
            raise HttpNoAnswer(redact_exception(exc)) from None
        except requests.ConnectionError as exc:
            if box.get("late"):
                raise HttpTimeout("closed at the deadline") from None
            # requests wraps a refused connect or an unknown name in MaxRetryError(NewConnectionError); a
            # connection reset mid-answer is a broken answer, not an unreachable server
            cause = exc.args[0] if exc.args else None
            unreachable = isinstance(cause, urllib3.exceptions.MaxRetryError) and isinstance(
                cause.reason, urllib3.exceptions.NewConnectionError
            )
            raise (HttpUnreachable if unreachable else HttpError)(redact_exception(exc)) from None
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            if box.get("late"):
                raise HttpTimeout("closed at the deadline") from None
            raise HttpError(redact_exception(exc)) from None
        finally:
            if session is None:
                sender.close()

    return within(deadline, work, f"http-{method.lower()}")


def open_stream(
    url: str,
    *,
    deadline: Deadline,
    headers: Mapping[str, str] | None = None,
    session=None,
    connect_s: float = 10.0,
    read_s: float = 30.0,
):
    """A streamed response whose status line and headers arrived before `deadline` (HttpTimeout
    otherwise); its body is the caller's to read, with its own rule (downloads: a stall timeout per
    read and a minimum throughput). requests' own exceptions pass through, for the caller's retries."""
    _learn_secrets(url, headers)
    sender = session or new_session()

    def work(box: dict[str, Any]):
        response = sender.get(url, headers=dict(headers or {}), stream=True, timeout=(connect_s, read_s))
        box["response"] = response
        if box.get("late"):
            response.close()
        return response

    return within(deadline, work, "http-open")
