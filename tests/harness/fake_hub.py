"""A loopback Hugging Face Hub for the endpoints `rocmdoctor plan` uses, over real sockets.

- `GET /api/models/{org}/{name}/revision/{rev}`: `{"id", "sha", "siblings": [{"rfilename"}]}`
- `GET /{org}/{name}/resolve/{rev}/{file}`: the file; large files (*.safetensors) redirect with 302 to
  `/cdn/...` first, as the real Hub redirects to its CDN; `Range: bytes=a-b` answers 206.

It counts the body bytes it sends per file, so a test can prove that only headers left the server.
Modes: "ok", "gated" (401 without the right token, 403 with a wrong one), "no-range" (ignores Range,
answers 200 with the whole file), "drip" (sends safetensors bodies one byte every 0.5 s).
"""

from __future__ import annotations

import json
import re
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

from harness.app_thread import serve_in_thread
from harness.release_server import LoopbackServer

GOOD_TOKEN = "hf_loopback_good_token"


def safetensors_bytes(
    tensors: dict[str, tuple[str, list[int]]], dtype_bytes: dict[str, int] | None = None
) -> bytes:
    """A valid safetensors file: {name: (dtype, shape)} with deterministic filler data."""
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1, "U8": 1, "F8_E4M3": 1, "I64": 8, **(dtype_bytes or {})}
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)  # safetensors pads the header to 8 bytes
    return struct.pack("<Q", len(blob)) + blob + bytes(i % 251 for i in range(offset))


class FakeHub:
    def __init__(self, files: dict[str, dict[str, bytes]], mode: str = "ok") -> None:
        self.files = files  # model id -> {filename: content}
        self.mode = mode
        self.sent: Counter[str] = Counter()
        self.requests: list[tuple[str, str | None]] = []
        self.server = LoopbackServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def send_body(
                self,
                status: int,
                body: bytes,
                filename: str | None = None,
                extra: dict[str, str] | None = None,
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                for key, value in (extra or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                try:
                    if hub.mode == "drip" and filename and filename.endswith(".safetensors"):
                        for i in range(len(body)):
                            self.wfile.write(body[i : i + 1])
                            self.wfile.flush()
                            hub.sent[filename] += 1
                            time.sleep(0.5)
                        return
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    return
                if filename:
                    hub.sent[filename] += len(body)

            def authorised(self) -> bool:
                if hub.mode != "gated":
                    return True
                auth = self.headers.get("Authorization")
                if auth is None:
                    self.send_body(
                        401, b'{"error":"Access to model is restricted. You must be authenticated."}'
                    )
                    return False
                if auth != f"Bearer {GOOD_TOKEN}":
                    self.send_body(403, b'{"error":"Access to gated repo denied."}')
                    return False
                return True

            def do_GET(self) -> None:
                hub.requests.append((self.path, self.headers.get("Range")))
                if not self.authorised():
                    return
                listing = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", self.path)
                if listing:
                    model = hub.files.get(listing[1])
                    if model is None:
                        return self.send_body(404, b'{"error":"Repository not found"}')
                    siblings = [{"rfilename": name} for name in sorted(model)]
                    return self.send_body(
                        200, json.dumps({"id": listing[1], "sha": "0" * 40, "siblings": siblings}).encode()
                    )
                resolve = re.fullmatch(r"/(cdn/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self.path)
                if not resolve:
                    return self.send_body(404, b"not found")
                model = hub.files.get(resolve[2])
                if model is None or resolve[4] not in model:
                    return self.send_body(404, b'{"error":"Entry not found"}')
                filename = resolve[4]
                if filename.endswith(".safetensors") and not resolve[1]:
                    return self.send_body(
                        302, b"", extra={"Location": f"/cdn/{resolve[2]}/resolve/{resolve[3]}/{filename}"}
                    )
                content = model[filename]
                wanted = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
                if wanted and hub.mode != "no-range":
                    start, end = int(wanted[1]), min(int(wanted[2]), len(content) - 1)
                    return self.send_body(
                        206,
                        content[start : end + 1],
                        filename,
                        {"Content-Range": f"bytes {start}-{end}/{len(content)}"},
                    )
                return self.send_body(200, content, filename)

        return Handler

    def __enter__(self) -> FakeHub:
        self.thread = serve_in_thread(self.server)
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.thread:
            self.thread.join(timeout=5)


@contextmanager
def fake_hub(files: dict[str, dict[str, bytes]], mode: str = "ok") -> Iterator[FakeHub]:
    with FakeHub(files, mode) as hub:
        yield hub
