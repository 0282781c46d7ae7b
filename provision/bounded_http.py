"""Read an HTTP body with a byte cap and a total deadline, even from a server that drips it.

`requests`' timeouts bound each socket read, not the whole body: a server sending one byte every few
seconds keeps `iter_content` busy forever. urllib3's `read1` returns whatever one socket read gave, so
the deadline is checked between reads and a drip cannot outlast it.
"""

from __future__ import annotations

import time

CHUNK = 64 << 10


class BodyTooSlow(Exception):
    pass


def read_body(response, limit: int, deadline: float) -> bytes:
    """Up to `limit` bytes of `response` (a streamed requests.Response); BodyTooSlow when `deadline`
    (a time.monotonic() value) passes first. The caller asks for one byte more than it accepts to
    tell a body at the cap from a longer one."""
    raw = response.raw
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        if time.monotonic() > deadline:
            raise BodyTooSlow()
        chunk = raw.read1(min(CHUNK, limit - size), decode_content=True)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
