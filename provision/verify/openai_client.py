"""A small async client for vLLM's OpenAI-compatible server, shared by smoke and bench.

Every way a request can go wrong ends in one `ServerError` whose `kind` names the cause, so callers
turn it into a message a user can act on. Streams are parsed as server-sent events; a stream that
ends without `data: [DONE]` is an error, not a short answer.

Every request has a total deadline (connect, headers and the whole body or stream, wall clock), not
only a limit on each silence: a server that trickles a byte a second, or streams comments forever,
ends in TIMEOUT by then. Every body is capped by what its endpoint can legitimately weigh
(`openai_schema`), and every answer is checked against its endpoint's shape there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from rocmdoctor import documents
from rocmdoctor.provision.verify import openai_schema as schema
from rocmdoctor.provision.verify import prometheus

UNREACHABLE = "unreachable"
TIMEOUT = "timeout"
UNAUTHORIZED = "unauthorized"
MODEL_NOT_FOUND = "model_not_found"
HTTP = "http"
DISCONNECTED = "disconnected"
STREAM_CUT = "stream_cut"
BAD_RESPONSE = "bad_response"


# Served by vLLM itself, on the backend's address when a proxy (Lemonade) does not forward them.
# /tokenize too: the tokenizer is the model's, and vLLM, not the proxy, is its authority.
BACKEND_PATHS = ("/metrics", "/version", "/tokenize")


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
    path = path.removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"


# The bodies parsed here were already capped by their endpoint's limit (_read_capped); this bound is
# the reader's own backstop.
MAX_ANSWER_BYTES = 64 << 20


@dataclass(frozen=True)
class Server:
    base_url: str
    api_key: str | None = None
    # The longest one request may take, from connect to the last byte of its body or stream.
    timeout_s: float = 30.0
    # When set (time.monotonic()), no request runs past it: the command's own end.
    deadline: float | None = None
    # A server in front of vLLM (Lemonade) has its own health path and leaves vLLM's /metrics and
    # /version on vLLM's private address (`backend_base`), which is sent no key.
    health_path: str = "/health"
    backend_base: str | None = None


def _error_message(body: bytes) -> str:
    try:
        document = documents.load_value(body, "the error answer", MAX_ANSWER_BYTES)
    except documents.DocumentError:
        return body.decode(errors="replace").strip()[:300]
    if not isinstance(document, dict):
        return str(document)[:300]
    error = document.get("error")
    if isinstance(error, dict):
        return str(error.get("message", error))[:300]
    return str(error or document.get("message") or document)[:300]


def _http_error(path: str, status: int, body: bytes) -> ServerError:
    message = _error_message(body)
    if status == 401:
        return ServerError(UNAUTHORIZED, f"{path}: HTTP 401 {message}".strip(), status)
    if status == 404 and "does not exist" in message:
        return ServerError(MODEL_NOT_FOUND, f"{path}: {message}", status)
    return ServerError(HTTP, f"{path}: HTTP {status}: {message}", status)


@asynccontextmanager
async def _translated(where: str) -> AsyncIterator[None]:
    try:
        yield
    except aiohttp.ClientConnectorError as exc:
        reason = (
            "connection refused" if isinstance(exc.os_error, ConnectionRefusedError) else str(exc.os_error)
        )
        raise ServerError(UNREACHABLE, f"cannot connect to {where}: {reason}") from None
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
        raise ServerError(
            DISCONNECTED, f"{where}: the server closed the connection mid-answer ({exc})"
        ) from None
    except aiohttp.ClientError as exc:
        # also a status line or header that is not HTTP, or one longer than any server sends
        detail = " ".join(str(getattr(exc, "message", None) or exc).split())[:300]
        raise ServerError(BAD_RESPONSE, f"{where}: not a valid HTTP answer ({detail})") from None
    except schema.ShapeError as exc:
        raise ServerError(BAD_RESPONSE, str(exc)) from None


def _json(path: str, payload: bytes) -> Any:
    try:
        return documents.load_value(payload, path, MAX_ANSWER_BYTES)
    except documents.DocumentError as exc:
        raise ServerError(
            BAD_RESPONSE, f"{path}: the answer is not JSON ({exc.why}): {payload[:120]!r}"
        ) from None


def _too_large(path: str, cap: int, what: str = "") -> ServerError:
    return ServerError(
        BAD_RESPONSE, f"{path} answered {what}more than {cap} bytes; no {path} answer is that large"
    )


@dataclass
class _Progress:
    """What a request received so far: says whether a timeout hit a silent or a trickling server."""

    received: int = 0


async def _read_capped(path: str, response: aiohttp.ClientResponse, cap: int, progress: _Progress) -> bytes:
    if response.content_length is not None and response.content_length > cap:
        raise _too_large(path, cap)
    body = bytearray()
    async for piece in response.content.iter_chunked(64 * 1024):
        body += piece
        progress.received = len(body)
        if len(body) > cap:
            raise _too_large(path, cap)
    return bytes(body)


async def _sse_lines(path: str, response: aiohttp.ClientResponse, total_cap: int, progress: _Progress):
    """The stream's lines, each at most SSE_LINE_BYTES long, all together at most total_cap bytes."""
    line_cap = schema.SSE_LINE_BYTES
    pending = bytearray()
    async for piece in response.content.iter_any():
        progress.received += len(piece)
        if progress.received > total_cap:
            raise _too_large(path, total_cap, "a stream of ")
        start, scan_from = 0, len(pending)  # only the new bytes are searched: linear in the stream
        pending += piece
        while (end := pending.find(b"\n", scan_from)) >= 0:
            if end - start > line_cap:
                raise _too_large(path, line_cap, "a stream line of ")
            yield bytes(pending[start:end])
            start = scan_from = end + 1
        if start:
            del pending[:start]
        if len(pending) > line_cap:
            raise _too_large(path, line_cap, "a stream line of ")
    if pending:
        yield bytes(pending)


@dataclass
class Streamed:
    """One streamed answer, timed the way `vllm bench serve` times it."""

    start: float
    # perf_counter of every SSE chunk that carries choices (vLLM's TTFT/ITL/E2EL reference points)
    chunk_times: list[float] = field(default_factory=list)
    text: str = ""
    usage: schema.Usage | None = None

    @property
    def output_tokens(self) -> int | None:
        return None if self.usage is None else self.usage.completion_tokens


class Client:
    """One aiohttp session against one server; every method raises ServerError on failure."""

    def __init__(self, server: Server, session: aiohttp.ClientSession) -> None:
        self.server = server
        self._session = session

    def _url(self, path: str) -> str:
        if self.server.backend_base and path in BACKEND_PATHS:
            return self.server.backend_base + path
        return self.server.base_url + path

    def _headers(self, path: str) -> dict[str, str]:
        if self.server.api_key and not (self.server.backend_base and path in BACKEND_PATHS):
            return {"Authorization": f"Bearer {self.server.api_key}"}
        return {}

    def _limit_s(self) -> float:
        limit = self.server.timeout_s
        if self.server.deadline is not None:
            limit = min(limit, self.server.deadline - time.monotonic())
        return max(limit, 0.0)

    async def _bounded(self, path: str, work: Callable[[_Progress], Awaitable[Any]]) -> Any:
        """Run one request under its total deadline; a timeout says whether anything arrived."""
        progress = _Progress()
        limit = self._limit_s()
        try:
            if limit <= 0:
                raise asyncio.TimeoutError
            return await asyncio.wait_for(work(progress), limit)
        except asyncio.TimeoutError:
            timeout = self.server.timeout_s
            if progress.received:
                raise ServerError(
                    TIMEOUT,
                    f"{self._url(path)}: no complete answer within {timeout:g} s "
                    f"({progress.received} bytes of it arrived)",
                ) from None
            raise ServerError(TIMEOUT, f"{self._url(path)}: no answer within {timeout:g} s") from None

    async def request(
        self, method: str, path: str, body: dict[str, Any] | None = None, cap: int = schema.ERROR_BYTES
    ) -> bytes:
        """The body of a 2xx answer, at most `cap` bytes, within the request's deadline."""

        async def work(progress: _Progress) -> bytes:
            async with (
                _translated(self._url(path)),
                self._session.request(
                    method, self._url(path), json=body, headers=self._headers(path)
                ) as response,
            ):
                if response.status >= 400:
                    error = await _read_capped(path, response, schema.ERROR_BYTES, progress)
                    raise _http_error(path, response.status, error)
                return await _read_capped(path, response, cap, progress)

        return await self._bounded(path, work)

    async def health(self) -> None:
        await self.request("GET", self.server.health_path, cap=schema.HEALTH_BYTES)

    async def models(self) -> list[str]:
        payload = await self.request("GET", "/v1/models", cap=schema.MODELS_BYTES)
        return _checked(schema.models, "/v1/models", _json("/v1/models", payload))

    async def max_model_len(self, model: str) -> int | None:
        """The served model's max_model_len; behind a proxy whose model list leaves it out (Lemonade),
        that of the one model vLLM serves at the backend's address."""
        payload = await self.request("GET", "/v1/models", cap=schema.MODELS_BYTES)
        length = _checked(schema.max_model_len, "/v1/models", _json("/v1/models", payload), model)
        if length is not None or not self.server.backend_base:
            return length
        backend = Client(
            Server(self.server.backend_base, None, self.server.timeout_s, self.server.deadline), self._session
        )
        try:
            served = await backend.models()
            if len(served) != 1:
                return None
            payload = await backend.request("GET", "/v1/models", cap=schema.MODELS_BYTES)
        except ServerError:
            return None  # the backend's list is a fallback: a key it wants, or no answer, leaves it unknown
        return _checked(schema.max_model_len, "/v1/models", _json("/v1/models", payload), served[0])

    async def version(self) -> str | None:
        payload = await self.request("GET", "/version", cap=schema.VERSION_BYTES)
        return _checked(schema.version, "/version", _json("/version", payload))

    async def tokenize(self, body: dict[str, Any]) -> list[int]:
        if self.server.backend_base:
            # the backend serves one model, maybe under another name than the proxy's: its default
            body = {k: v for k, v in body.items() if k != "model"}
        payload = await self.request("POST", "/tokenize", body, cap=schema.TOKENIZE_BYTES)
        return _checked(schema.tokenize, "/tokenize", _json("/tokenize", payload))

    async def metrics(self) -> list[prometheus.Sample]:
        payload = await self.request("GET", "/metrics", cap=schema.METRICS_BYTES)
        try:
            return prometheus.parse(payload.decode(errors="replace"))
        except prometheus.MetricsFormatError as exc:
            raise ServerError(BAD_RESPONSE, f"/metrics: not the Prometheus text format: {exc}") from None

    async def completion(self, path: str, body: dict[str, Any]) -> schema.Completion:
        """A non-streamed completion (`/v1/chat/completions` when the path says so), shape-checked."""
        max_tokens = body.get("max_tokens")
        payload = await self.request("POST", path, body, cap=schema.completion_bytes(max_tokens or 0))
        document = _json(path, payload)
        return _checked(schema.completion, path, document, path.endswith("/chat/completions"), max_tokens)

    async def probe_completion(self, body: dict[str, Any]) -> schema.ProbeAnswer:
        """A /v1/completions answer with token ids and log-probabilities (the context probe's);
        its cap grows with the prompt, whose every token may carry prompt log-probabilities."""
        path = "/v1/completions"
        body = {**body, "return_token_ids": True, "return_tokens_as_token_ids": True}
        max_tokens = int(body.get("max_tokens") or 0)
        prompt = body.get("prompt")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt))
        payload = await self.request("POST", path, body, cap=schema.probe_bytes(prompt_tokens, max_tokens))
        return _checked(schema.probe_answer, path, _json(path, payload), max_tokens)

    async def stream(self, path: str, body: dict[str, Any]) -> Streamed:
        """POST with `stream: true` and usage in the final chunk; reads the SSE stream to `[DONE]`."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        max_tokens = body.get("max_tokens")
        chat = path.endswith("/chat/completions")
        result = Streamed(start=time.perf_counter())

        async def work(progress: _Progress) -> Streamed:
            pieces: list[str] = []
            async with (
                _translated(self._url(path)),
                self._session.post(self._url(path), json=body, headers=self._headers(path)) as response,
            ):
                if response.status >= 400:
                    error = await _read_capped(path, response, schema.ERROR_BYTES, progress)
                    raise _http_error(path, response.status, error)
                total_cap = schema.stream_bytes(max_tokens or 0)
                async for raw in _sse_lines(path, response, total_cap, progress):
                    now = time.perf_counter()
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue  # blank separators, comments and other SSE fields
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        result.text = "".join(pieces)
                        return result
                    event = schema.stream_event(path, _json(path, data), chat)
                    if event.error is not None:
                        raise ServerError(HTTP, f"{path}: error inside the stream: {event.error}")
                    if event.has_choices:
                        result.chunk_times.append(now)
                        pieces.append(event.text)
                        if max_tokens and len(result.chunk_times) > schema.stream_chunks(max_tokens):
                            raise ServerError(
                                BAD_RESPONSE,
                                f"{path}: the stream sent more than {schema.stream_chunks(max_tokens)} "
                                f"chunks for max_tokens {max_tokens}",
                            )
                    if event.usage is not None:
                        schema.within_max_tokens(path, event.usage.completion_tokens, max_tokens)
                        result.usage = event.usage
            raise ServerError(
                STREAM_CUT,
                f"{path}: the stream ended after {len(result.chunk_times)} chunks without `data: [DONE]`",
            )

        return await self._bounded(path, work)


def _checked(validate: Callable[..., Any], path: str, *args: Any) -> Any:
    try:
        return validate(path, *args)
    except schema.ShapeError as exc:
        raise ServerError(BAD_RESPONSE, str(exc)) from None


def counter(endpoint_samples: list[prometheus.Sample], name: str, **labels: str) -> float | None:
    """The sum of a counter's samples; a NaN, infinite or negative one is a BAD_RESPONSE."""
    return _checked(
        schema.counter_value, "/metrics", name, prometheus.counter_sum(endpoint_samples, name, **labels)
    )


@asynccontextmanager
async def open_client(server: Server, connections: int = 0) -> AsyncIterator[Client]:
    # identity: a compressed body could expand past every cap inside one read
    headers = {"Accept-Encoding": "identity"}  # the key goes per request (Client._headers)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=server.timeout_s)
    connector = aiohttp.TCPConnector(limit=connections, keepalive_timeout=60)
    async with aiohttp.ClientSession(
        headers=headers, timeout=timeout, connector=connector, auto_decompress=False
    ) as session:
        yield Client(server, session)
