"""An OpenAI-compatible server that speaks vLLM's protocol over a real socket, and can misbehave.

It stands in for the failures a healthy-looking vLLM can show, which the real engine cannot be made
to produce on demand: completions failing while /health is 200, another served name, a stream cut
before `[DONE]`, a process that dies mid-run, a required API key, a stall. Well-behaved, it streams
as fast as it can (the client-overhead benchmark). It runs in its own process (`FakeServer`), so it
can really die; `python -m harness.fake_openai --help` lists the switches.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# noisy: answers differ between identical requests and another (invisible) client adds one request
# of one token to the counters for each of ours: both are warnings for smoke, a mismatch for bench.
MODES = ("ok", "fail-completions", "cut-stream", "stall", "noisy")
CUT_AFTER_CHUNKS = 3


@dataclass
class Behaviour:
    mode: str = "ok"
    served_name: str = "tiny"
    api_key: str | None = None
    die_after: int | None = None  # exit the process inside generation request number N (1-based)
    token_delay_s: float = 0.0


class Counters:
    def __init__(self) -> None:
        self.generation_requests = 0
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.successes = 0

    def exposition(self, model: str) -> str:
        labels = f'engine="0",model_name="{model}"'
        return "".join(
            [
                "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n",
                "# TYPE vllm:generation_tokens_total counter\n",
                f"vllm:generation_tokens_total{{{labels}}} {float(self.generation_tokens)}\n",
                f"vllm:prompt_tokens_total{{{labels}}} {float(self.prompt_tokens)}\n",
                "# TYPE vllm:request_success_total counter\n",
                f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{model}"}} '
                f"{float(self.successes)}\n",
                f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="{model}"}} 0.0\n',
            ]
        )


def make_app(behaviour: Behaviour):
    from aiohttp import web

    counters = Counters()

    def error(status: int, message: str, kind: str) -> web.Response:
        return web.json_response(
            {"error": {"message": message, "type": kind, "param": None, "code": status}}, status=status
        )

    @web.middleware
    async def authenticate(request: web.Request, handler):
        # vLLM guards only these prefixes; /health, /metrics, /version, /tokenize stay open.
        guarded = behaviour.api_key and request.path.startswith(("/v1", "/v2", "/inference"))
        if guarded and request.headers.get("Authorization") != f"Bearer {behaviour.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": "0.0.0+fake"})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=counters.exposition(behaviour.served_name), content_type="text/plain")

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": behaviour.served_name,
                        "object": "model",
                        "owned_by": "vllm",
                        "root": "/models/fake",
                        "max_model_len": 512,
                    }
                ],
            }
        )

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        words = str(body.get("prompt", "")).split()
        return web.json_response(
            {
                "count": len(words),
                "max_model_len": 512,
                "tokens": [10 + i % 300 for i in range(len(words))],
                "token_strs": None,
            }
        )

    def prompt_len(body: dict) -> int:
        if "messages" in body:
            return sum(len(str(m.get("content", "")).split()) for m in body["messages"]) + 4
        prompt = body.get("prompt", "")
        return len(prompt) if isinstance(prompt, list) else len(str(prompt).split())

    async def generate(request: web.Request) -> web.StreamResponse:
        chat = request.path.endswith("/chat/completions")
        body = await request.json()
        if body.get("model") != behaviour.served_name:
            return error(
                404,
                f"The model `{body.get('model')}` does not exist. Valid aliases: {behaviour.served_name}.",
                "NotFoundError",
            )
        counters.generation_requests += 1
        number = counters.generation_requests
        if behaviour.mode == "fail-completions":
            return error(
                500,
                "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                "InternalServerError",
            )
        if behaviour.mode == "stall" and not body.get("stream"):
            await asyncio.sleep(3600)
        tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        salt = f"-{number}" if behaviour.mode == "noisy" else ""
        pieces = [f" tok{i}{salt}" for i in range(tokens)]
        usage = {
            "prompt_tokens": prompt_len(body),
            "completion_tokens": tokens,
            "total_tokens": prompt_len(body) + tokens,
        }
        kind = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            if behaviour.die_after == number:
                os._exit(3)
            account(usage)
            choice = (
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(pieces)},
                    "finish_reason": "length",
                }
                if chat
                else {"index": 0, "text": "".join(pieces), "finish_reason": "length"}
            )
            return web.json_response(
                {
                    "id": f"cmpl-{number}",
                    "object": kind,
                    "model": behaviour.served_name,
                    "choices": [choice],
                    "usage": usage,
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk_kind = "chat.completion.chunk" if chat else "text_completion"

        async def send(payload: dict | str) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            await response.write(f"data: {data}\n\n".encode())

        def choice(text: str, finish: str | None) -> dict:
            if chat:
                return {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            return {"index": 0, "text": text, "finish_reason": finish}

        if chat:
            await send(
                {
                    "id": f"chatcmpl-{number}",
                    "object": chunk_kind,
                    "model": behaviour.served_name,
                    "choices": [
                        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                    ],
                }
            )
        for i, piece in enumerate(pieces):
            if i == CUT_AFTER_CHUNKS and behaviour.mode == "cut-stream":
                await response.write_eof()
                return response
            if i == CUT_AFTER_CHUNKS and behaviour.die_after == number:
                os._exit(3)
            if i == 1 and behaviour.mode == "stall":
                await asyncio.sleep(3600)
            if behaviour.token_delay_s:
                await asyncio.sleep(behaviour.token_delay_s)
            await send(
                {
                    "id": f"cmpl-{number}",
                    "object": chunk_kind,
                    "model": behaviour.served_name,
                    "choices": [choice(piece, "length" if i == tokens - 1 else None)],
                }
            )
        account(usage)
        if (body.get("stream_options") or {}).get("include_usage"):
            await send(
                {
                    "id": f"cmpl-{number}",
                    "object": chunk_kind,
                    "model": behaviour.served_name,
                    "choices": [],
                    "usage": usage,
                }
            )
        await send("[DONE]")
        await response.write_eof()
        return response

    def account(usage: dict) -> None:
        other_client = 1 if behaviour.mode == "noisy" else 0
        counters.generation_tokens += usage["completion_tokens"] + other_client
        counters.prompt_tokens += usage["prompt_tokens"]
        counters.successes += 1 + other_client

    app = web.Application(middlewares=[authenticate])
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    return app


async def serve(behaviour: Behaviour, port: int) -> None:
    from aiohttp import web

    runner = web.AppRunner(make_app(behaviour), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # port 0: the kernel's choice
    print(f"PORT {bound}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=MODES, default="ok")
    parser.add_argument("--served-name", default="tiny")
    parser.add_argument("--api-key")
    parser.add_argument("--die-after", type=int, help="exit inside generation request number N")
    parser.add_argument("--token-delay", type=float, default=0.0, help="seconds between streamed tokens")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    behaviour = Behaviour(args.mode, args.served_name, args.api_key, args.die_after, args.token_delay)
    asyncio.run(serve(behaviour, args.port))


@dataclass(frozen=True)
class RunningFake:
    base_url: str
    process: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.process.pid


@contextlib.contextmanager
def fake_server(*args: str, start_timeout: float = 20.0) -> Iterator[RunningFake]:
    """Run the fake in its own process group with these command-line switches; stop it on exit."""
    process = subprocess.Popen(
        [sys.executable, "-m", "harness.fake_openai", *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        start_new_session=True,
    )
    try:
        ready, _, _ = select.select([process.stdout], [], [], start_timeout)
        line = process.stdout.readline() if ready else ""
        if not line.startswith("PORT "):
            raise RuntimeError(
                f"fake server did not start within {start_timeout:g} s (exit {process.poll()}): {line!r}"
            )
        yield RunningFake(f"http://127.0.0.1:{int(line.split()[1])}", process)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        process.stdout.close()


if __name__ == "__main__":
    main()
