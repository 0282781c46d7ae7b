"""A stand-in for Lemonade Server (lemond): its documented HTTP API over loopback, forwarding inference to
a real vLLM server as lemond forwards to its vLLM child.

Lemonade cannot be installed here; every rule below cites the Lemonade document it comes from, all in
lemonade-sdk/lemonade @ e385039ed33551de7f54cb73194cd08088772c08:
  [API]    docs/api/lemonade.md
  [OPENAI] docs/api/openai.md
  [CONF]   docs/guide/configuration/README.md
  [DEV]    docs/dev/getting-started.md ("Internal Endpoints", "Client-Server Communication")
  [VLLM]   docs/guide/configuration/vllm.md
  [RES]    src/cpp/server/backends/vllm/vllm_arg_resolver.cpp (protected_flags, conflict_key)
  [SRV]    src/cpp/server/backends/vllm/vllm_server.cpp (the vllm-server command line)
  [REF]    docs/dev/backends-reference.md (the vllm recipe's options)

`fault` makes every Lemonade API answer misbehave one way (400, 401, 500, slow, wrong-shape) for the
tests of how rocmdoctor reports it. The stand-in keeps `recipe_options.json` in its state directory as
lemond does [API "Per-model options"], so a test can see whether anything was written.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from harness.app_thread import app_in_thread

GIB = 1 << 30
RENDER = "sys/devices/pci0000:00/0000:65:00.0"
# The report's vLLM refusal (issue 25): "Free memory on device (76.45/96.0 GiB) on startup is less than
# desired GPU memory utilization (0.92, 88.32 GiB)"; the carve-out fixture's 96 GiB is from its captures.
REPORT_FREE = int(76.45 * GIB)
FAULTS = ("ok", "400", "401", "500", "slow", "trickle", "trickle-headers", "wrong-shape")
TRICKLE_S = 0.3
SLOW_S = 5.0
DRIP_S = 60.0  # longer than any client waits that bounds each socket read and not the exchange
# [RES] protected_flags(): Lemonade-managed process arguments, refused in vllm_args.
PROTECTED = {
    "--enable-prefix-caching",
    "--host",
    "--max-model-len",
    "--model",
    "--port",
    "--served-model-name",
}
# [REF] the vllm recipe's options, plus the options every recipe has ([API] GET options example:
# merge_args and the eviction settings).
VLLM_KEYS = {
    "ctx_size",
    "vllm_backend",
    "vllm_args",
    "merge_args",
    "auto_evict",
    "downsize_idle_timeout",
    "evict_idle_timeout",
    "evict_weight_factor",
}
OTHER_RECIPE_KEYS = {
    "llamacpp_backend",
    "llamacpp_args",
    "llamacpp_device",
    "whispercpp_backend",
    "whispercpp_args",
}
# [API] GET options example: the defaults layer (vllm_backend "" per [REF]).
DEFAULTS = {
    "auto_evict": None,
    "ctx_size": -1,
    "downsize_idle_timeout": 60,
    "evict_idle_timeout": 300,
    "evict_weight_factor": 1.0,
    "merge_args": True,
    "vllm_args": "",
    "vllm_backend": "",
}


def make_report_host(dest: Path) -> Path:
    """strix-halo-carveout with the report's free memory: mem_info_vram_used = total - 76.45 GiB."""
    from harness.hosts import fixture_root

    shutil.copytree(fixture_root("strix-halo-carveout"), dest, symlinks=True)
    total = int((dest / RENDER / "mem_info_vram_total").read_text())
    (dest / RENDER / "mem_info_vram_used").write_text(f"{total - REPORT_FREE}\n")
    return dest


def qwen3_8b_cache(cache: Path) -> Path:
    """Qwen/Qwen3-8B in the Hugging Face cache layout: its real config.json (tests/fixtures/model_configs)
    and a header-only safetensors file of its real size (bf16): an exact memory plan, no weights."""
    from conftest import FIXTURES

    repo = cache / "models--Qwen--Qwen3-8B"
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    shutil.copy(FIXTURES / "model_configs/qwen3-8b/config.json", snapshot / "config.json")
    rows = 8_190_735_360 // 4096  # Qwen3-8B: 8.19 B parameters
    header = json.dumps({"w": {"dtype": "BF16", "shape": [rows, 4096], "data_offsets": [0, rows * 4096 * 2]}})
    (snapshot / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode())
    return cache


@dataclass
class Registered:
    checkpoint: str
    recipe: str = "vllm"


@dataclass
class State:
    state_dir: Path
    models: dict[str, Registered]
    api_key: str | None = None
    admin_key: str | None = None
    fault: str = "ok"
    engine_url: str | None = None  # the real vLLM server lemond would have started
    engine_key: str | None = None
    engine_model: str = "tiny"
    engine_pid: int | None = None
    # [CONF] example config.json: global_timeout 600, vllm {args, backend}.
    config: dict[str, Any] = field(
        default_factory=lambda: {
            "global_timeout": 600,
            "port": 13305,
            "vllm": {"args": "", "backend": "auto"},
        }
    )
    backend_state: str = "installed"
    loaded: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"fault {self.fault!r} is not one of {FAULTS}")

    @property
    def options_file(self) -> Path:
        return self.state_dir / "recipe_options.json"

    def saved(self) -> dict[str, dict[str, Any]]:
        if not self.options_file.exists():
            return {}
        return json.loads(self.options_file.read_text())

    def write_saved(self, saved: dict[str, dict[str, Any]]) -> None:
        tmp = self.options_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(saved, indent=2, sort_keys=True))
        tmp.replace(self.options_file)


def _error(status: int, message: str) -> web.Response:
    # [API] "In case of an error, returns an `error` field with details."
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    return header[7:] if header.startswith("Bearer ") else None


def _authorized(state: State, request: web.Request, internal: bool) -> bool:
    """[CONF] "API Key and Security": the admin key defaults to the regular key; regular endpoints accept
    either key when LEMONADE_API_KEY is set and are open otherwise; /internal/* needs the admin key."""
    admin = state.admin_key or state.api_key
    token = _bearer(request)
    if internal:
        return admin is None or token == admin
    if state.api_key is None:
        return True
    return token in {state.api_key, admin}


def _effective(state: State, model: str, saved: dict[str, Any]) -> dict[str, Any]:
    # [API] `effective` is the /v1/load body: defaults, then the saved entry; `pinned` is omitted.
    out = dict(DEFAULTS) | {k: v for k, v in saved.items() if k in VLLM_KEYS}
    out["model_name"] = model
    return out


def _options_doc(state: State, model: str, saved: dict[str, Any]) -> dict[str, Any]:
    effective = _effective(state, model, saved)
    ctx = effective["ctx_size"]
    return {
        "model_name": model,
        "recipe": state.models[model].recipe,
        "saved": saved,
        "effective": effective,
        "defaults": dict(DEFAULTS) | {"model_name": model},
        # [API] "the effective ctx_size, or the automatically computed size when that is -1"
        "resolved_ctx_size": ctx if ctx > 0 else 4096,
    }


def _validate(state: State, model: str, body: dict[str, Any]) -> str | None:
    """[API] POST options: "A 400 reports an unrecognized option name, an option from a different recipe,
    a value of the wrong type, or an invalid ctx_size"; [VLLM]/[RES]: protected flags in vllm_args."""
    for key, value in body.items():
        if key in ("dry_run", "model_name"):
            continue
        if key == "pinned":
            return "pinned is not settable here"  # [API] Note under POST options
        if key in OTHER_RECIPE_KEYS:
            return f"option '{key}' does not belong to the vllm recipe"
        if key not in VLLM_KEYS:
            return f"unrecognized option '{key}'"
        if value is None:
            continue  # [API] null removes the option
        if key == "ctx_size" and (
            isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1)
        ):
            return "ctx_size must be a positive whole number or -1"
        if key in ("vllm_args", "vllm_backend") and not isinstance(value, str):
            return f"{key} must be a string"
        if key == "merge_args" and not isinstance(value, bool):
            return "merge_args must be a boolean"
        if key == "vllm_args":
            for word in value.split():
                flag = word.split("=", 1)[0].replace("_", "-")
                if flag in PROTECTED:
                    return f"vllm_args may not contain {flag}: it is managed by Lemonade"
    return None


def _launch_command(state: State, model: str, options: dict[str, Any], port: int) -> list[str]:
    """[SRV] the vllm-server argv lemond builds: its managed flags, the 4G KV cap unless a memory budget
    flag is given (conflict_key memory_budget [RES]), then the user's vllm_args."""
    user = shlex.split(options.get("vllm_args") or "") + shlex.split(state.config["vllm"].get("args") or "")
    argv = [
        "vllm-server",
        "--model",
        state.models[model].checkpoint,
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
    ]
    argv += [
        "--served-model-name",
        model,
        "--enforce-eager",
        "--max-model-len",
        str(options.get("ctx_size", -1)),
    ]
    argv += ["--enable-prefix-caching"]
    if not any(w.split("=")[0] in ("--gpu-memory-utilization", "--kv-cache-memory-bytes") for w in user):
        argv += ["--kv-cache-memory-bytes", "4G"]
    return argv + user


STATE = web.AppKey("state", State)


@web.middleware
async def faults(request: web.Request, handler: Any) -> web.StreamResponse:
    state = request.app[STATE]
    raw = await request.read()
    try:
        body = json.loads(raw) if raw else None
    except json.JSONDecodeError:
        body = raw.decode(errors="replace")
    state.requests.append(
        {
            "method": request.method,
            "path": request.path,
            "body": body,
            "auth": request.headers.get("Authorization"),
        }
    )
    inference = request.path.endswith(("/chat/completions", "/completions"))
    if state.fault != "ok" and not inference:
        if state.fault == "slow":
            await asyncio.sleep(SLOW_S)
        elif state.fault == "trickle":  # headers at once, then a body that never ends in time
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            for _ in range(int(SLOW_S / TRICKLE_S)):
                await response.write(b" ")
                await asyncio.sleep(TRICKLE_S)
            await response.write(b"{}")
            return response
        elif state.fault == "trickle-headers":  # a status line, then a header a byte at a time, for a minute
            transport = request.transport
            assert transport is not None
            transport.write(b"HTTP/1.1 200 OK\r\n")
            for byte in b"X-Drip: " + b"." * int(DRIP_S / TRICKLE_S):
                if transport.is_closing():
                    break
                transport.write(bytes([byte]))
                await asyncio.sleep(TRICKLE_S)
            transport.close()
            return web.Response()
        elif state.fault == "400":
            return _error(400, "bad request")
        elif state.fault == "401":
            return _error(401, "Invalid or missing API key")
        elif state.fault == "500":
            return _error(500, "internal error: backend crashed")
        elif state.fault == "wrong-shape":
            return web.json_response(["not", "an", "object"])
    internal = request.path.startswith("/internal/")
    if not _authorized(state, request, internal):
        return _error(401, "Invalid or missing API key")  # [CONF] the key gates
    return await handler(request)


def make_app(state: State) -> web.Application:
    app = web.Application(middlewares=[faults])
    app[STATE] = state

    async def health(request: web.Request) -> web.Response:
        # [API] GET /v1/health: status, version, all_models_loaded[] with backend_url.
        loaded = list(state.loaded.values())
        return web.json_response(
            {
                "status": "ok",
                "version": "10.0.0-standin",
                "model_loaded": loaded[-1]["model_name"] if loaded else None,
                "all_models_loaded": loaded,
            }
        )

    async def models(request: web.Request) -> web.Response:
        # [OPENAI] GET /v1/models: OpenAI list with checkpoint and recipe.
        data = [
            {
                "id": mid,
                "object": "model",
                "owned_by": "lemonade",
                "checkpoint": m.checkpoint,
                "recipe": m.recipe,
                "downloaded": True,
            }
            for mid, m in state.models.items()
        ]
        return web.json_response({"object": "list", "data": data})

    def _model(request: web.Request) -> str | None:
        model = request.match_info["model"]
        return model if model in state.models else None

    async def get_options(request: web.Request) -> web.Response:
        model = _model(request)
        if model is None:
            return _error(404, "model not found")
        return web.json_response(_options_doc(state, model, state.saved().get(model, {})))

    async def post_options(request: web.Request) -> web.Response:
        model = _model(request)
        if model is None:
            return _error(404, "model not found")
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error(400, "invalid JSON")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        problem = _validate(state, model, body)
        if problem:
            return _error(400, problem)  # [API] "nothing from that request is saved"
        all_saved = state.saved()
        before = dict(all_saved.get(model, {}))
        after = dict(before)
        for key, value in body.items():  # [API] merges; null removes; model_name is ignored
            if key in ("dry_run", "model_name"):
                continue
            if value is None:
                after.pop(key, None)
            else:
                after[key] = value
        if body.get("dry_run") is True:
            # [API] dry_run: effective/resolved describe the result; saved keeps reporting the disk.
            doc = _options_doc(state, model, after)
            doc["saved"] = before
            return web.json_response(doc)
        all_saved[model] = after
        state.write_saved(all_saved)
        return web.json_response(_options_doc(state, model, after))

    async def delete_options(request: web.Request) -> web.Response:
        model = _model(request)
        if model is None:
            return _error(404, "model not found")
        all_saved = state.saved()
        all_saved.pop(model, None)
        state.write_saved(all_saved)
        return web.json_response(_options_doc(state, model, {}))

    async def system_info(request: web.Request) -> web.Response:
        # [API] GET /v1/system-info: recipes.<recipe>.backends.<backend>.state/version.
        rocm = {
            "devices": ["amd_gpu"],
            "state": state.backend_state,
            "message": "",
            "action": "",
            "version": "vllm0.20.1-rocm7.12.0-gfx1151",
        }
        if state.backend_state != "installed":
            rocm |= {
                "message": "Backend is supported but not installed.",
                "action": "lemonade backends install vllm:rocm",
            }
        return web.json_response(
            {"recipes": {"vllm": {"default_backend": "rocm", "backends": {"rocm": rocm}}}}
        )

    async def install(request: web.Request) -> web.Response:
        body = await request.json()
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("recipe"), str)
            or not isinstance(body.get("backend"), str)
        ):
            return _error(400, "recipe and backend are required")  # [API] POST /v1/install parameters
        state.backend_state = "installed"
        return web.json_response({"status": "success", "recipe": body["recipe"], "backend": body["backend"]})

    async def load(request: web.Request) -> web.Response:
        body = await request.json()
        model = body.get("model_name") if isinstance(body, dict) else None
        if model not in state.models:
            return _error(404, "model not found")
        options = _effective(state, model, state.saved().get(model, {}))
        port = int((state.engine_url or "http://127.0.0.1:1").rsplit(":", 1)[1])
        state.loaded[model] = {
            "model_name": model,
            "checkpoint": state.models[model].checkpoint,
            "recipe": state.models[model].recipe,
            "type": "llm",
            "device": "gpu",
            "pid": state.engine_pid or 0,
            "launch_command": _launch_command(state, model, options, port),
            "recipe_options": {k: options[k] for k in ("ctx_size", "vllm_args", "vllm_backend")},
            "backend_url": f"{state.engine_url}/v1",  # [API]/[VLLM] the private vLLM port
        }
        return web.json_response({"status": "success", "message": f"Loaded model: {model}"})

    async def internal_config(request: web.Request) -> web.Response:
        return web.json_response(state.config)  # [DEV] GET /internal/config

    async def internal_set(request: web.Request) -> web.Response:
        body = await request.json()  # [DEV] POST /internal/set: validated, then applied atomically
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        timeout = body.get("global_timeout")
        if "global_timeout" in body and (
            isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1
        ):
            return _error(400, "global_timeout must be a positive integer")
        state.config.update(body)
        return web.json_response({"status": "success", "updated": body})

    async def forward(request: web.Request) -> web.StreamResponse:
        """[VLLM] "Lemonade forwards requests to the vLLM child process": same path, same body; the child
        serves under the Lemonade name ([SRV] --served-model-name), here the engine's own name instead."""
        body = await request.json()
        if not isinstance(body, dict) or body.get("model") not in state.models:
            return _error(404, "model not found")
        if state.engine_url is None:
            return _error(500, "no backend")
        body = dict(body, model=state.engine_model)
        headers = {"Authorization": f"Bearer {state.engine_key}"} if state.engine_key else {}
        path = "/v1/" + request.path.split("/v1/", 1)[1]
        async with (
            aiohttp.ClientSession() as session,
            session.post(state.engine_url + path, json=body, headers=headers) as upstream,
        ):
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    # [DEV] "Client-Server Communication": the same routes under /api/v1 and /v1.
    for prefix in ("/api/v1", "/v1"):
        app.router.add_get(f"{prefix}/health", health)
        app.router.add_get(f"{prefix}/models", models)
        app.router.add_get(prefix + "/models/{model}/options", get_options)
        app.router.add_post(prefix + "/models/{model}/options", post_options)
        app.router.add_delete(prefix + "/models/{model}/options", delete_options)
        app.router.add_get(f"{prefix}/system-info", system_info)
        app.router.add_post(f"{prefix}/install", install)
        app.router.add_post(f"{prefix}/load", load)
        app.router.add_post(f"{prefix}/chat/completions", forward)
        app.router.add_post(f"{prefix}/completions", forward)
    app.router.add_get("/internal/config", internal_config)
    app.router.add_post("/internal/set", internal_set)
    return app


@dataclass
class Running:
    url: str
    state: State

    def posted_bodies(self) -> list[Any]:
        return [r["body"] for r in self.state.requests if r["method"] == "POST"]


@contextlib.contextmanager
def lemonade_server(state: State) -> Iterator[Running]:
    """The stand-in on 127.0.0.1 (an ephemeral port), in a thread of this process with its own loop."""
    with app_in_thread(lambda: make_app(state), "the Lemonade stand-in") as url:
        yield Running(url, state)
