"""A stand-in for the GitHub releases API and its asset downloads, over real loopback HTTP.

It speaks the parts of the protocol rocmdoctor relies on: `GET /repos/<owner>/<repo>/releases/tags/<tag>`
and `GET /repos/<owner>/<repo>/releases?per_page=N&page=P` (newest first; `tag_name`, `draft`,
`prerelease`, `assets[]` carrying `name`, `size`, `digest`, `browser_download_url` with the tag and name
percent-encoded as GitHub does), asset downloads at `/<owner>/<repo>/releases/download/<tag>/<name>` and a
flat mirror at `/mirror/<name>`, with `Range`, `If-Range` and `ETag`. Every request is logged; faults are
injected per asset name, and for the API as a whole (`api_fault`: "hang", "trickle", "huge"):

    with ReleaseServer() as server:
        server.add_release("lemonade-sdk/vllm-rocm", tag, assets)     # assets: (name, path|bytes[, digest])
        server.inject(name, Fault("cut", after=100_000))               # first GET dies after 100 kB
        ...
        server.range_requests(name)                                    # what the client asked for
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote

from harness.app_thread import serve_in_thread

CHUNK = 1 << 20
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class Fault:
    """What goes wrong with one asset's downloads.

    kind: "cut" (close the connection after `after` body bytes), "corrupt" (flip the byte at `offset`),
    "status" (answer `status`, e.g. 404 or 500), "stall" (send `after` body bytes, then nothing for
    `seconds`), "short" (serve only the first `length` bytes, as if the file were that long),
    "norange" (ignore Range and answer 200 with the whole file, like a server without range support),
    "trickle" (send `after` bytes, then one byte every `seconds`: never stalls, never gets anywhere).
    For the API (`ReleaseServer.api_fault`): "hang" (read the request, answer nothing for `seconds`),
    "trickle" (headers, then one body byte every `seconds`), "huge" (a body that never ends).
    `times`: how many requests it affects (None: all of them).
    """

    kind: str
    after: int = 0
    offset: int = 0
    status: int = 500
    seconds: float = 30.0
    length: int = 0
    times: int | None = 1


@dataclass
class LogEntry:
    method: str
    path: str
    status: int
    range: str | None
    if_range: str | None
    body_bytes: int
    raw_path: str = ""  # as sent, before percent-decoding


@dataclass
class _Release:
    tag: str
    assets: list[_Asset]
    prerelease: bool = False
    draft: bool = False


@dataclass
class _Asset:
    name: str
    source: Path | bytes
    size: int
    digest: str | None
    etag: str

    def read(self, start: int, end: int) -> Iterable[bytes]:
        """Body bytes [start, end) in chunks."""
        if isinstance(self.source, bytes):
            for pos in range(start, end, CHUNK):
                yield self.source[pos : min(end, pos + CHUNK)]
            return
        with open(self.source, "rb") as fh:
            fh.seek(start)
            remaining = end - start
            while remaining > 0:
                block = fh.read(min(CHUNK, remaining))
                if not block:
                    return
                remaining -= len(block)
                yield block


def _sha256_of(source: Path | bytes) -> str:
    if isinstance(source, bytes):
        return hashlib.sha256(source).hexdigest()
    digest = hashlib.sha256()
    with open(source, "rb") as fh:
        while block := fh.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class _State:
    releases: dict[tuple[str, str], Any] = field(default_factory=dict)  # -> _Release, newest added last
    by_path: dict[str, _Asset] = field(default_factory=dict)
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    log: list[LogEntry] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    api_fault: Fault | None = None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return  # the structured log replaces stderr chatter

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _record(self, status: int, body_bytes: int = 0) -> LogEntry:
        """Logged before the body goes out, so a client that has its bytes also finds the entry."""
        state = self.server.state
        entry = LogEntry(
            self.command,
            unquote(self.path),
            status,
            self.headers.get("Range"),
            self.headers.get("If-Range"),
            body_bytes,
            self.path,
        )
        with state.lock:
            state.log.append(entry)
        return entry

    def _simple(
        self, status: int, body: bytes, content_type: str = "application/json", head: bool = False
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self._record(status, 0 if head else len(body))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _take_fault(self, name: str) -> Fault | None:
        state = self.server.state
        with state.lock:
            for fault in state.faults.get(name, []):
                if fault.times is None or fault.times > 0:
                    if fault.times is not None:
                        fault.times -= 1
                    return fault
        return None

    def _release_doc(self, repo: str, release: _Release) -> dict[str, Any]:
        base = f"{self.server.base_url}/{repo}/releases/download/{quote(release.tag, safe='')}"
        return {
            "tag_name": release.tag,
            "draft": release.draft,
            "prerelease": release.prerelease,
            "assets": [
                {
                    "name": a.name,
                    "size": a.size,
                    "digest": a.digest,
                    "browser_download_url": f"{base}/{quote(a.name, safe='')}",
                }
                for a in release.assets
            ],
        }

    def _api(self, doc: Any, head: bool) -> None:
        fault = self.server.state.api_fault
        if fault is None or head:
            self._simple(200, json.dumps(doc).encode(), head=head)
            return
        if fault.kind == "hang":
            self._record(0)
            self.server.state.stopping.wait(fault.seconds)
            self._drop_connection()
            return
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body) if fault.kind == "trickle" else 1 << 40))
        self._record(200)
        self.end_headers()
        try:
            if fault.kind == "trickle":
                for i in range(len(body)):
                    if self.server.state.stopping.wait(fault.seconds):
                        break
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
            else:  # huge: whitespace forever (valid JSON would follow, if anyone waited)
                block = b" " * CHUNK
                while not self.server.state.stopping.is_set():
                    self.wfile.write(block)
        except (BrokenPipeError, ConnectionResetError):
            pass
        self._drop_connection()

    def _serve(self, head: bool) -> None:
        state = self.server.state
        path, _, query = self.path.partition("?")
        path = unquote(path)
        match = re.fullmatch(r"/repos/([^/]+/[^/]+)/releases/tags/(.+)", path)
        if match:
            release = state.releases.get((match.group(1), match.group(2)))
            if release is None or release.draft:
                body = json.dumps(
                    {"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}
                )
                self._simple(404, body.encode(), head=head)
                return
            self._api(self._release_doc(match.group(1), release), head)
            return
        match = re.fullmatch(r"/repos/([^/]+/[^/]+)/releases", path)
        if match:
            params = parse_qs(query)
            per_page = min(100, int(params.get("per_page", ["30"])[0]))
            page = int(params.get("page", ["1"])[0])
            with state.lock:
                mine = [r for (repo, _), r in state.releases.items() if repo == match.group(1)]
            mine.reverse()  # newest first, like GitHub
            chosen = mine[(page - 1) * per_page : page * per_page]
            self._api([self._release_doc(match.group(1), r) for r in chosen], head)
            return
        asset = state.by_path.get(path)
        if asset is None:
            self._simple(404, b"Not Found", "text/plain", head=head)
            return
        self._send_asset(asset, head)

    def _send_asset(self, asset: _Asset, head: bool) -> None:
        fault = None if head else self._take_fault(asset.name)
        if fault and fault.kind == "status":
            self._simple(fault.status, f"injected {fault.status}".encode(), "text/plain")
            return
        size = fault.length if fault and fault.kind == "short" else asset.size
        start, end, status = 0, size, 200
        wanted = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        honour_range = not (fault and fault.kind == "norange")
        if wanted and honour_range and (if_range is None or if_range == asset.etag):
            parsed = _RANGE.match(wanted.strip())
            if parsed:
                start = int(parsed.group(1))
                end = min(size, int(parsed.group(2)) + 1) if parsed.group(2) else size
                if start >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self._record(416)
                    self.end_headers()
                    return
                status = 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.send_header("ETag", asset.etag)
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        entry = self._record(status)
        self.end_headers()
        if head:
            return
        sent = 0
        try:
            for block in asset.read(start, end):
                if (
                    fault
                    and fault.kind == "corrupt"
                    and start + sent <= fault.offset < start + sent + len(block)
                ):
                    pos = fault.offset - start - sent
                    block = block[:pos] + bytes([block[pos] ^ 0xFF]) + block[pos + 1 :]
                if fault and fault.kind == "trickle" and sent + len(block) >= fault.after:
                    self.wfile.write(block[: max(0, fault.after - sent)])
                    pos = start + max(sent, fault.after)
                    for byte in asset.read(pos, end):
                        for i in range(len(byte)):
                            if self.server.state.stopping.wait(fault.seconds):
                                raise BrokenPipeError
                            self.wfile.write(byte[i : i + 1])
                            self.wfile.flush()
                    return
                if fault and fault.kind in ("cut", "stall") and sent + len(block) >= fault.after:
                    head_of_block = block[: max(0, fault.after - sent)]
                    entry.body_bytes = sent + len(head_of_block)
                    self.wfile.write(head_of_block)
                    self.wfile.flush()
                    if fault.kind == "stall":
                        self.server.state.stopping.wait(fault.seconds)
                    self._drop_connection()
                    return
                entry.body_bytes = sent + len(block)  # counted first: the client may finish before we do
                self.wfile.write(block)
                sent += len(block)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _drop_connection(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class LoopbackServer(ThreadingHTTPServer):
    """A test server's HTTP server: a client that goes away mid-answer (the point of many tests) is
    not printed as a traceback, since the command under test may be capturing this process's stderr
    (harness.cli runs it in-process)."""

    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class _Server(LoopbackServer):
    state: _State
    base_url: str


class ReleaseServer:
    """Threaded HTTP server on 127.0.0.1:<free port>; use as a context manager."""

    def __init__(self) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = _State()
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self._server.base_url = self.url
        self._thread: threading.Thread | None = None

    @property
    def api_url(self) -> str:
        return self.url

    @property
    def mirror_url(self) -> str:
        return self.url + "/mirror"

    @property
    def log(self) -> list[LogEntry]:
        with self._server.state.lock:
            return list(self._server.state.log)

    @property
    def api_fault(self) -> Fault | None:
        return self._server.state.api_fault

    @api_fault.setter
    def api_fault(self, fault: Fault | None) -> None:
        self._server.state.api_fault = fault

    def api_requests(self) -> list[LogEntry]:
        return [e for e in self.log if e.path.startswith("/repos/")]

    def add_release(
        self,
        repo: str,
        tag: str,
        assets: Iterable[tuple],
        with_digests: bool = True,
        prerelease: bool = False,
        draft: bool = False,
    ) -> None:
        """assets: (name, path or bytes) or (name, path or bytes, digest-or-None) tuples. Releases
        added later are newer (listed first)."""
        state = self._server.state
        entries = []
        for item in assets:
            name, source = item[0], item[1]
            hexdigest = item[2].split(":", 1)[1] if len(item) > 2 and item[2] else _sha256_of(source)
            size = len(source) if isinstance(source, bytes) else Path(source).stat().st_size
            digest = (f"sha256:{hexdigest}" if with_digests else None) if len(item) < 3 else item[2]
            asset = _Asset(name, source, size, digest, f'"{hexdigest[:32]}"')
            entries.append(asset)
            state.by_path[f"/{repo}/releases/download/{tag}/{name}"] = asset
            state.by_path[f"/mirror/{name}"] = asset
        with state.lock:
            state.releases.pop((repo, tag), None)  # a rebuild under the same tag is the newest again
            state.releases[(repo, tag)] = _Release(tag, entries, prerelease, draft)

    def inject(self, name: str, fault: Fault) -> None:
        with self._server.state.lock:
            self._server.state.faults.setdefault(name, []).append(fault)

    def clear_faults(self) -> None:
        with self._server.state.lock:
            self._server.state.faults.clear()

    def clear_log(self) -> None:
        with self._server.state.lock:
            self._server.state.log.clear()

    def downloads(self, name: str) -> list[LogEntry]:
        """GETs of one asset's bytes (API calls left out)."""
        return [e for e in self.log if e.method == "GET" and e.path.endswith("/" + name)]

    def range_requests(self, name: str) -> list[str | None]:
        return [e.range for e in self.downloads(name)]

    def body_bytes(self, name: str) -> int:
        return sum(e.body_bytes for e in self.downloads(name))

    def start(self) -> ReleaseServer:
        self._thread = serve_in_thread(self._server, "release-server")
        return self

    def stop(self) -> None:
        self._server.state.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        if self._thread:
            self._thread.join(timeout=5)

    def __enter__(self) -> ReleaseServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
