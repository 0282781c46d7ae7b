"""A small async client for vLLM's OpenAI-compatible server, shared by smoke and bench.

Every way a request can go wrong ends in one `ServerError` whose `kind` names the cause, so callers
turn it into a message a user can act on. Streams are parsed as server-sent events; a stream that
ends without `data: [DONE]` is an error, not a short answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

UNREACHABLE = "unreachable"
TIMEOUT = "timeout"
UNAUTHORIZED = "unauthorized"
MODEL_NOT_FOUND = "model_not_found"
HTTP = "http"
DISCONNECTED = "disconnected"
STREAM_CUT = "stream_cut"
BAD_RESPONSE = "bad_response"


class ServerError(Exception):
    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


def normalize_url(url: str) -> str:
    """`http://host:8000`, `…/`, `…/v1` all mean the server root; anything else is a ValueError."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL such as http://127.0.0.1:8000")
    try:
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        raise ValueError(f"{url!r} has an invalid port") from None
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"


@dataclass(frozen=True)
class Server:
    base_url: str
    api_key: str | None = None
    # Connect limit and the longest silence tolerated between two reads: a stalled server ends
    # in a timeout, never a hang, while a long answer that keeps streaming is fine.
    timeout_s: float = 30.0


def _error_message(body: bytes) -> str:
    try:
        document = json.loads(body)
    except ValueError:
        return body.decode(errors="replace").strip()[:300]
    error = document.get("error") if isinstance(document, dict) else None
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error or document.get("message") or document)[:300]


def _http_error(path: str, status: int, body: bytes) -> ServerError:
    message = _error_message(body)
    if status == 401:
        return ServerError(UNAUTHORIZED, f"{path}: HTTP 401 {message}".strip(), status)
    if status == 404 and "does not exist" in message:
        return ServerError(MODEL_NOT_FOUND, f"{path}: {message}", status)
    return ServerError(HTTP, f"{path}: HTTP {status}: {message}", status)


@asynccontextmanager
async def _translated(where: str, timeout_s: float) -> AsyncIterator[None]:
    try:
        yield
    except aiohttp.ClientConnectorError as exc:
        reason = (
            "connection refused" if isinstance(exc.os_error, ConnectionRefusedError) else str(exc.os_error)
        )
        raise ServerError(UNREACHABLE, f"cannot connect to {where}: {reason}") from None
    except (asyncio.TimeoutError, aiohttp.ServerTimeoutError):
        raise ServerError(TIMEOUT, f"{where}: no answer within {timeout_s:g} s") from None
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
        raise ServerError(
            DISCONNECTED, f"{where}: the server closed the connection mid-answer ({exc})"
        ) from None
    except aiohttp.ClientError as exc:
        raise ServerError(BAD_RESPONSE, f"{where}: {type(exc).__name__}: {exc}") from None


def _json(path: str, payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        raise ServerError(BAD_RESPONSE, f"{path}: the answer is not JSON: {payload[:120]!r}") from None


@dataclass
class Streamed:
    """One streamed answer, timed the way `vllm bench serve` times it."""

    start: float
    # perf_counter of every SSE chunk that carries choices (vLLM's TTFT/ITL/E2EL reference points)
    chunk_times: list[float] = field(default_factory=list)
    text: str = ""
    usage: dict[str, Any] | None = None

    @property
    def output_tokens(self) -> int | None:
        return None if self.usage is None else self.usage.get("completion_tokens")


def _chunk_text(choice: dict[str, Any]) -> str:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return delta.get("content") or ""
    return choice.get("text") or ""


class Client:
    """One aiohttp session against one server; every method raises ServerError on failure."""

    def __init__(self, server: Server, session: aiohttp.ClientSession) -> None:
        self.server = server
        self._session = session

    def _url(self, path: str) -> str:
        return self.server.base_url + path

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
        async with (
            _translated(self._url(path), self.server.timeout_s),
            self._session.request(method, self._url(path), json=body) as response,
        ):
            payload = await response.read()
            if response.status >= 400:
                raise _http_error(path, response.status, payload)
            return payload

    async def get_json(self, path: str) -> Any:
        return _json(path, await self.request("GET", path))

    async def post_json(self, path: str, body: dict[str, Any]) -> Any:
        return _json(path, await self.request("POST", path, body))

    async def stream(self, path: str, body: dict[str, Any]) -> Streamed:
        """POST with `stream: true` and usage in the final chunk; reads the SSE stream to `[DONE]`."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        result = Streamed(start=time.perf_counter())
        pieces: list[str] = []
        async with (
            _translated(self._url(path), self.server.timeout_s),
            self._session.post(self._url(path), json=body) as response,
        ):
            if response.status >= 400:
                raise _http_error(path, response.status, await response.read())
            async for raw in response.content:
                now = time.perf_counter()
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments and other SSE fields
                data = line[5:].strip()
                if data == b"[DONE]":
                    result.text = "".join(pieces)
                    return result
                chunk = _json(path, data)
                if "error" in chunk and not chunk.get("choices"):
                    raise ServerError(HTTP, f"{path}: error inside the stream: {_error_message(data)}")
                if choices := chunk.get("choices"):
                    result.chunk_times.append(now)
                    pieces.append(_chunk_text(choices[0]))
                if chunk.get("usage"):
                    result.usage = chunk["usage"]
        raise ServerError(
            STREAM_CUT,
            f"{path}: the stream ended after {len(result.chunk_times)} chunks without `data: [DONE]`",
        )


@asynccontextmanager
async def open_client(server: Server, connections: int = 0) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=server.timeout_s, sock_read=server.timeout_s)
    connector = aiohttp.TCPConnector(limit=connections, keepalive_timeout=60)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout, connector=connector) as session:
        yield Client(server, session)
