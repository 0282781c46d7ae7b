"""Test servers in a thread of the test's own process: an aiohttp application on 127.0.0.1 (an ephemeral
port) with its own event loop (the Lemonade stand-in, the context probe's proxy), and a socketserver's
serve loop (the release server, the hub, the hostile answerers)."""

from __future__ import annotations

import asyncio
import contextlib
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web

# socketserver's serve loop checks for shutdown() every poll_interval, 0.5 s by default: each server a
# test stopped cost it up to half a second (34 s over test_hostile_lemonade's 75 tests).
POLL_S = 0.02


def serve_in_thread(server: socketserver.BaseServer, name: str | None = None) -> threading.Thread:
    """Start `server`'s serve loop in a daemon thread; `server.shutdown()` returns within POLL_S."""
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": POLL_S}, name=name, daemon=True
    )
    thread.start()
    return thread


@contextlib.contextmanager
def app_in_thread(make_app: Callable[[], web.Application], what: str) -> Iterator[str]:
    """Yields the base URL; the app is built inside its loop and cleaned up on every exit path."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, Any] = {}

    async def start() -> None:
        runner = web.AppRunner(make_app(), shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        holder["runner"] = runner
        holder["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError(f"{what} did not start")
    try:
        yield f"http://127.0.0.1:{holder['port']}"
    finally:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        deadline = time.monotonic() + 1
        while loop.is_running() and time.monotonic() < deadline:
            time.sleep(0.01)
        loop.close()
