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
import itertools
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# noisy: answers differ between identical requests and another (invisible) client adds one request
# of one token to the counters for each of ours: both are warnings for smoke, a mismatch for bench.
MODES = ("ok", "fail-completions", "cut-stream", "stall", "noisy")
CUT_AFTER_CHUNKS = 3

# Servers that misbehave at the protocol level, each one way a real server, proxy or broken build
# can: answers that never finish, answers without end, answers of the wrong shape. The value says
# what the mode does; tests/cli/test_misbehaving_servers.py holds what the client must make of each.
MISBEHAVIOURS = {
    # never finishes: only a total deadline ends these
    "trickle-models": "/v1/models sends its headers, then one byte every half second",
    "trickle-headers": "/v1/models sends a status line, then one header byte every half second",
    "trickle-completion": "a non-streamed completion trickles its body, one byte every half second",
    "keepalive-stream": "a stream sends blank lines forever and never a chunk",
    "sse-comments": "a stream sends SSE comments forever",
    "no-done": "a stream sends every token and the usage, then stays open without [DONE]",
    # never ends: only a cap on the body ends these
    "endless-models": "/v1/models streams bytes without end, as fast as it can",
    "endless-health": "/health streams bytes without end",
    "endless-metrics": "/metrics streams bytes without end",
    "long-sse-line": "a stream sends one 4 MiB data line",
    "endless-stream": "a stream sends valid chunks without end, never [DONE]",
    # wrong shapes
    "models-list": "/v1/models answers a JSON list",
    "models-null": "/v1/models answers null",
    "choices-string": "completions answer choices as a string",
    "choices-object": "completions answer choices as an object",
    "choice-string": "completions answer choices[0] as a string",
    "message-string": "chat completions answer choices[0].message as a string",
    "usage-list": "completions answer usage as a list",
    "usage-tokens-string": "completions answer usage.completion_tokens as a string",
    "stream-event-list": "every stream event is a JSON list",
    "stream-event-number": "every stream event is a number",
    "tokenize-object": "/tokenize answers tokens as an object",
    "metrics-garbage-later": "/metrics turns unparsable after the first completion",
    "metrics-nan": "vllm:generation_tokens_total is NaN",
    "metrics-inf": "vllm:generation_tokens_total is +Inf",
    "tokens-10x": "every answer carries 10x the max_tokens asked for",
    "tokens-50x": "every answer carries 50x the max_tokens asked for",
    "completion-list": "a non-streamed completion answers []",
    "garbage-status": "a non-streamed completion answers a status line that is not HTTP",
}
TRICKLE_S = 0.5


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
        self.running = 0  # generation requests in flight (vLLM's vllm:num_requests_running gauge)

    def exposition(self, model: str) -> str:
        labels = f'engine="0",model_name="{model}"'
        return "".join(
            [
                "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n",
                "# TYPE vllm:generation_tokens_total counter\n",
                f"vllm:generation_tokens_total{{{labels}}} {float(self.generation_tokens)}\n",
                f"vllm:prompt_tokens_total{{{labels}}} {float(self.prompt_tokens)}\n",
                "# TYPE vllm:num_requests_running gauge\n",
                f"vllm:num_requests_running{{{labels}}} {float(self.running)}\n",
                "# TYPE vllm:request_success_total counter\n",
                (
                    f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{model}"}} '
                    f"{float(self.successes)}\n"
                ),
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

    async def endless(request: web.Request, piece: bytes, delay_s: float = 0.0) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        while True:
            await response.write(piece)
            await asyncio.sleep(delay_s)

    async def health(request: web.Request) -> web.StreamResponse:
        if behaviour.mode == "endless-health":
            return await endless(request, b"ok" * 32768)
        return web.Response(status=200)

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": "0.0.0+fake"})

    async def metrics(request: web.Request) -> web.StreamResponse:
        text = counters.exposition(behaviour.served_name)
        if behaviour.mode == "endless-metrics":
            return await endless(request, b"# HELP vllm:x padding\n" * 4096)
        if behaviour.mode == "metrics-garbage-later" and counters.generation_requests:
            text += 'vllm:broken{model_name="tiny" 12 nonsense\n'
        if behaviour.mode in ("metrics-nan", "metrics-inf"):
            value = "NaN" if behaviour.mode == "metrics-nan" else "+Inf"
            text = re.sub(
                r"^(vllm:generation_tokens_total\S*) \S+$", rf"\1 {value}", text, flags=re.MULTILINE
            )
        return web.Response(text=text, content_type="text/plain")

    async def trickle(request: web.Request, headers: dict[str, str] | None = None) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json", **(headers or {})})
        response.content_length = 1_000_000
        await response.prepare(request)
        while True:
            await response.write(b" ")
            await asyncio.sleep(TRICKLE_S)

    def raw(request: web.Request, data: bytes) -> None:
        """Bytes straight onto the connection, under aiohttp's HTTP writer, then close it."""
        request.transport.write(data)

    async def models(request: web.Request) -> web.StreamResponse:
        if behaviour.mode == "trickle-models":
            return await trickle(request)
        if behaviour.mode == "trickle-headers":
            raw(request, b"HTTP/1.1 200 OK\r\n")
            while True:
                raw(request, b"X")
                await asyncio.sleep(TRICKLE_S)
        if behaviour.mode == "endless-models":
            return await endless(request, b'{"id": "tiny", "object": "model"}, ' * 2048)
        if behaviour.mode in ("models-list", "models-null"):
            return web.json_response(
                [{"id": behaviour.served_name}] if behaviour.mode == "models-list" else None
            )
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
        tokens: object = [10 + i % 300 for i in range(len(words))]
        if behaviour.mode == "tokenize-object":
            tokens = {"ids": tokens}
        return web.json_response(
            {"count": len(words), "max_model_len": 512, "tokens": tokens, "token_strs": None}
        )

    def prompt_len(body: dict) -> int:
        if "messages" in body:
            return sum(len(str(m.get("content", "")).split()) for m in body["messages"]) + 4
        prompt = body.get("prompt", "")
        return len(prompt) if isinstance(prompt, list) else len(str(prompt).split())

    async def generate(request: web.Request) -> web.StreamResponse:
        counters.running += 1
        try:
            return await answer(request)
        finally:
            counters.running -= 1

    async def answer(request: web.Request) -> web.StreamResponse:
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
        tokens *= {"tokens-10x": 10, "tokens-50x": 50}.get(behaviour.mode, 1)
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
            if behaviour.mode == "trickle-completion":
                return await trickle(request)
            if behaviour.mode == "completion-list":
                return web.json_response([])
            if behaviour.mode == "garbage-status":
                raw(request, b"HTTP/1.1 2OO Fine\r\n\r\n")
                request.transport.close()
                return web.Response()
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
            answer = {
                "id": f"cmpl-{number}",
                "object": kind,
                "model": behaviour.served_name,
                "choices": [choice],
                "usage": usage,
            }
            return web.json_response(misshapen(answer, chat))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk_kind = "chat.completion.chunk" if chat else "text_completion"

        async def send(payload: dict | str) -> None:
            if behaviour.mode == "stream-event-list" and isinstance(payload, dict):
                payload = json.dumps([payload])
            if behaviour.mode == "stream-event-number" and isinstance(payload, dict):
                payload = "42"
            data = payload if isinstance(payload, str) else json.dumps(misshapen(payload, chat))
            await response.write(f"data: {data}\n\n".encode())

        if behaviour.mode in ("keepalive-stream", "sse-comments"):
            line = b"\n" if behaviour.mode == "keepalive-stream" else b": keep-alive\n\n"
            while True:
                await response.write(line)
                await asyncio.sleep(0.05)
        if behaviour.mode == "long-sse-line":
            await response.write(b"data: " + b"x" * (4 * 1024 * 1024) + b"\n\n")
        if behaviour.mode == "endless-stream":
            pieces = (f" tok{i}" for i in itertools.count())

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
        if behaviour.mode == "no-done" and (body.get("stream_options") or {}).get("include_usage"):
            await send({"id": f"cmpl-{number}", "object": chunk_kind, "choices": [], "usage": usage})
            await asyncio.sleep(3600)
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

    def misshapen(answer: dict, chat: bool) -> dict:
        """The answer with the field this mode gets wrong."""
        mode = behaviour.mode
        if mode == "choices-string" and answer.get("choices"):
            return {**answer, "choices": "tok0 tok1"}
        if mode == "choices-object" and answer.get("choices"):
            return {**answer, "choices": {"0": answer["choices"][0]}}
        if mode == "choice-string" and answer.get("choices"):
            return {**answer, "choices": ["tok0 tok1"]}
        if mode == "message-string" and chat and "message" in (answer.get("choices") or [{}])[0]:
            return {**answer, "choices": [{**answer["choices"][0], "message": "hello"}]}
        if mode == "usage-list" and answer.get("usage"):
            return {**answer, "usage": list(answer["usage"].values())}
        if mode == "usage-tokens-string" and answer.get("usage"):
            return {**answer, "usage": {**answer["usage"], "completion_tokens": "16"}}
        return answer

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

    # A client that gives up mid-answer is what the misbehaving modes are for, not news.
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)

    runner = web.AppRunner(make_app(behaviour), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # port 0: the kernel's choice
    print(f"PORT {bound}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=MODES + tuple(MISBEHAVIOURS), default="ok")
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


@contextlib.contextmanager
def fake_servers(
    variants: dict[str, tuple[str, ...]], start_timeout: float = 60.0
) -> Iterator[dict[str, RunningFake]]:
    """Several fakes at once (one per name, with these switches), started side by side: a class of
    misbehaviours costs one start-up wait, not one per member."""
    processes = {
        name: subprocess.Popen(
            [sys.executable, "-m", "harness.fake_openai", *args],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
            start_new_session=True,
        )
        for name, args in variants.items()
    }
    try:
        running = {}
        deadline = time.monotonic() + start_timeout
        for name, process in processes.items():
            ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = process.stdout.readline() if ready else ""
            if not line.startswith("PORT "):
                raise RuntimeError(f"fake server {name} did not start (exit {process.poll()}): {line!r}")
            running[name] = RunningFake(f"http://127.0.0.1:{int(line.split()[1])}", process)
        yield running
    finally:
        for process in processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in processes.values():
            process.wait(timeout=10)
            process.stdout.close()


def fake_server_bundle(prefix: Path, *fake_args: str) -> Path:
    """A bundle whose `bin/vllm-server` runs this fake on the port `serve` asks for, so `serve` and
    wait-ready meet a misbehaving server through the real spawn, process group and readiness path.
    The server's pid (its process group) is written to `prefix/server.pid`."""
    server = prefix / "current" / "bin" / "vllm-server"
    server.parent.mkdir(parents=True, exist_ok=True)
    harness_dir = Path(__file__).resolve().parent.parent
    server.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        f"open({str(prefix / 'server.pid')!r}, 'w').write(str(os.getpid()))\n"
        "argv = sys.argv[1:]\n"
        "port = argv[argv.index('--port') + 1]\n"
        "name = argv[argv.index('--served-model-name') + 1] if '--served-model-name' in argv else 'm'\n"
        f"os.chdir({str(harness_dir)!r})\n"
        f"os.execv(sys.executable, [sys.executable, '-m', 'harness.fake_openai', '--port', port,\n"
        f"          '--served-name', name, *{list(fake_args)!r}])\n"
    )
    server.chmod(0o755)
    return prefix


def serve_argv(prefix: Path, log_file: Path, *extra: str) -> list[str]:
    """`rocmdoctor serve` of the bundle under `prefix` (a fake_server_bundle) on a free port."""
    from .engine import free_port

    return [
        sys.executable,
        "-m",
        "rocmdoctor",
        "serve",
        "--prefix",
        str(prefix),
        "--model",
        "m",
        "--gpu-memory-utilization",
        "0.5",
        "--port",
        str(free_port()),
        "--log-file",
        str(log_file),
        *extra,
    ]
