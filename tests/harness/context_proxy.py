"""A server that is right on short prompts and wrong past a length: a real engine behind a faulty proxy.

The proxy speaks vLLM's OpenAI API over loopback and forwards every request to a real vLLM engine,
unchanged, except:

- `shorten_past=L`: a completion whose prompt (token ids) is longer than L tokens and asks for
  `prompt_logprobs` (the prefill path) is scored from a shortened context: the engine scores the
  last `keep` tokens only, and those log-probabilities replace the real ones for the tail. That is
  the fault class of lemonade-sdk/lemonade#3610: attention that is right below a length and wrong
  above it, on one path.
- `shorten_past=L` and a needle prompt: the engine's random weights cannot retrieve anything, so the
  proxy stands in for a capable instruct model there (one cannot run on two CPU cores): it answers
  the code word when the sentence stating it lies inside the context it attends to (all of it up to
  L tokens, the last `keep` past L), and the engine's own answer otherwise.
- `degenerate=True`: every completion's text is its first token repeated (ids and text), as a
  kernel that emits one token forever does (lemonade-sdk/llamacpp-rocm PR #97's gibberish class).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from harness.app_thread import app_in_thread

NEEDLE = re.compile(r"the secret code word is (\w+)\.")
QUESTION = "what is the secret code word?"


@dataclass
class Fault:
    shorten_past: int | None = None
    keep: int | None = None  # default: half of shorten_past
    degenerate: bool = False
    shortened: list[int] = field(default_factory=list)  # prompt lengths answered from a short context

    @property
    def kept(self) -> int:
        assert self.shorten_past is not None
        return self.keep or self.shorten_past // 2


def _passthrough_headers(request: web.Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}


def make_app(engine_url: str, fault: Fault) -> web.Application:
    session: dict[str, aiohttp.ClientSession] = {}

    async def engine(method: str, path: str, headers: dict[str, str], body: Any = None) -> tuple[int, Any]:
        if "s" not in session:
            session["s"] = aiohttp.ClientSession()
        async with session["s"].request(method, engine_url + path, json=body, headers=headers) as response:
            if response.content_type == "application/json":
                return response.status, await response.json()
            return response.status, await response.read()

    async def detokenize(ids: list[int], headers: dict[str, str], model: str) -> str:
        _, document = await engine("POST", "/detokenize", headers, {"model": model, "tokens": ids})
        return document["prompt"]

    async def completions(request: web.Request) -> web.StreamResponse:
        headers = _passthrough_headers(request)
        body = await request.json()
        prompt = body.get("prompt")
        status, answer = await engine("POST", "/v1/completions", headers, body)
        if status != 200 or not isinstance(prompt, list):
            return web.json_response(answer, status=status)
        choice = answer["choices"][0]
        past = fault.shorten_past is not None and len(prompt) > fault.shorten_past
        if past and body.get("prompt_logprobs"):
            fault.shortened.append(len(prompt))
            short = {**body, "prompt": prompt[-fault.kept :]}
            _, shortened = await engine("POST", "/v1/completions", headers, short)
            tail = shortened["choices"][0]["prompt_logprobs"]
            # the first entry of a prompt is None (nothing before it): keep the real one there
            choice["prompt_logprobs"][-len(tail) + 1 :] = tail[1:]
        elif fault.shorten_past is not None and not body.get("prompt_logprobs"):
            text = await detokenize(prompt, headers, body["model"])
            if QUESTION in text and (match := NEEDLE.search(text)):
                seen = await detokenize(prompt[-fault.kept :], headers, body["model"]) if past else text
                if NEEDLE.search(seen):
                    choice["text"] = f" {match.group(1)}."
        if fault.degenerate and choice.get("token_ids"):
            first = choice["token_ids"][0]
            one = await detokenize([first], headers, body["model"])
            choice["token_ids"] = [first] * len(choice["token_ids"])
            choice["text"] = one * len(choice["token_ids"])
            choice["logprobs"] = None
        return web.json_response(answer)

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.method == "POST" else None
        status, answer = await engine(request.method, request.path, _passthrough_headers(request), body)
        if isinstance(answer, bytes):
            return web.Response(body=answer, status=status)
        return web.json_response(answer, status=status)

    async def close(_app: web.Application) -> None:
        if "s" in session:
            await session["s"].close()

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    for path in ("/health", "/v1/models", "/version", "/metrics"):
        app.router.add_get(path, forward)
    for path in ("/tokenize", "/detokenize", "/v1/chat/completions"):
        app.router.add_post(path, forward)
    app.on_cleanup.append(close)
    return app


@contextlib.contextmanager
def context_proxy(engine_url: str, fault: Fault) -> Iterator[str]:
    """The proxy on 127.0.0.1 (an ephemeral port), in a thread of this process with its own loop."""
    with app_in_thread(lambda: make_app(engine_url, fault), "the context proxy") as url:
        yield url
