"""Lemonade Server's documented HTTP API, bounded and shape-checked (lemonade-sdk/lemonade @
e385039ed33551de7f54cb73194cd08088772c08: docs/api/lemonade.md, docs/dev/getting-started.md "Internal
Endpoints" and "Client-Server Communication", docs/guide/configuration/README.md "API Key and Security").

Every answer is read with a byte cap and one total deadline; every failure is a LemonadeError whose
message says what to do and never carries the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rocmdoctor.documents import DocumentError, load_value
from rocmdoctor.provision import bounded_http
from rocmdoctor.provision.server.lemonade_args import ProtectedFlagError, refuse_protected

DEFAULT_PORT = 13305  # docs/guide/configuration/README.md, `port`
CONFIG_FILES = ("/var/lib/lemonade/config.json",)  # the packaged service's StateDirectory (same doc)
START_HINT = "start it: `sudo systemctl start lemond` (packaged service), or run `lemond` in a terminal"
API = "/api/v1"
VLLM_RECIPE = "vllm"
MAX_BODY_BYTES = 4 << 20
MAX_ERROR_TEXT = 300
MAX_REQUEST_S = 24 * 3600.0


class LemonadeError(RuntimeError):
    """Lemonade could not be reached or answered wrongly; the message says what to do."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # unreachable, auth, rejected, server, timeout, shape


def _scrub(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


@dataclass
class Lemonade:
    """One Lemonade server. `key` is sent as a Bearer token and never appears in a message."""

    base_url: str
    key: str | None = None
    timeout_s: float = 30.0
    session: Any = None

    def _session(self) -> Any:
        if self.session is None:
            self.session = bounded_http.new_session()
        return self.session

    def request(self, method: str, path: str, body: Any = None, timeout_s: float | None = None) -> Any:
        """The JSON answer of a 2xx; LemonadeError for anything else, within `timeout_s` in all."""
        # a deadline comes from the user or from Lemonade's own config (global_timeout): never past a day,
        # so a 64-bit number from a server cannot overflow a thread's or a socket's timeout
        limit = min(timeout_s or self.timeout_s, MAX_REQUEST_S)
        url = self.base_url + path
        headers = {"Accept-Encoding": "identity"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        try:
            answer = bounded_http.request(
                method,
                url,
                deadline=bounded_http.Deadline(limit),
                limit=MAX_BODY_BYTES,
                headers=headers,
                json_body=body,
                session=self._session(),
                read_s=limit,
            )
        except (bounded_http.HttpTimeout, bounded_http.HttpNoAnswer):
            raise LemonadeError(
                "timeout",
                f"{method} {url}: no complete answer within {limit:g} s; if lemond is busy (loading a model), "
                "raise --timeout",
            ) from None
        except bounded_http.HttpUnreachable:
            raise LemonadeError("unreachable", f"nothing answers at {self.base_url}; {START_HINT}") from None
        except bounded_http.HttpError as exc:
            raise LemonadeError("unreachable", _scrub(f"{method} {url}: {exc}", self.key)) from None
        raw, status = answer.body, answer.status
        if len(raw) > MAX_BODY_BYTES:
            raise LemonadeError("shape", f"{method} {url}: the answer is larger than {MAX_BODY_BYTES} bytes")
        if status >= 400:
            raise self._http_error(method, url, status, raw)
        try:
            return load_value(raw, f"{method} {url}", MAX_BODY_BYTES)
        except DocumentError as exc:
            raise LemonadeError(
                "shape",
                _scrub(
                    f"{exc.source}: the answer is {exc.why}; is {self.base_url} Lemonade Server?", self.key
                ),
            ) from None

    def _http_error(self, method: str, url: str, status: int, raw: bytes) -> LemonadeError:
        said = _error_text(raw)
        said = f": {_scrub(said, self.key)}" if said else ""
        if status in (401, 403):
            return LemonadeError(
                "auth",
                f"{method} {url} answered {status}{said}: the key is missing or wrong; give the admin key "
                "with --admin-key-file FILE or LEMONADE_ADMIN_API_KEY (the key lemond was started with)",
            )
        if status == 400:
            return LemonadeError("rejected", f"{method} {url}: Lemonade rejected the request (400){said}")
        if status == 404:
            return LemonadeError(
                "rejected",
                f"{method} {url} answered 404{said}: no such model or endpoint; `lemonade list` shows the "
                "models, and this endpoint needs a Lemonade with the options API (upgrade it)",
            )
        return LemonadeError(
            "server", f"{method} {url} answered {status}{said}: read lemond's log (`journalctl -u lemond`)"
        )

    # The documented endpoints, each shape-checked.
    def health(self) -> dict[str, Any]:
        doc = _object(self.request("GET", f"{API}/health"), "GET /api/v1/health")
        loaded = doc.get("all_models_loaded", [])
        if not isinstance(loaded, list) or not all(isinstance(m, dict) for m in loaded):
            raise LemonadeError("shape", "GET /api/v1/health: all_models_loaded is not a list of objects")
        return doc

    def config(self) -> dict[str, Any]:
        return _object(self.request("GET", "/internal/config"), "GET /internal/config")

    def set_config(self, body: dict[str, Any]) -> dict[str, Any]:
        return _object(self.request("POST", "/internal/set", body), "POST /internal/set")

    def system_info(self) -> dict[str, Any]:
        return _object(self.request("GET", f"{API}/system-info"), "GET /api/v1/system-info")

    def models(self) -> list[dict[str, Any]]:
        doc = _object(self.request("GET", f"{API}/models?show_all=true"), "GET /api/v1/models")
        data = doc.get("data")
        if not isinstance(data, list) or not all(
            isinstance(m, dict) and isinstance(m.get("id"), str) for m in data
        ):
            raise LemonadeError("shape", "GET /api/v1/models: `data` is not a list of models with an id")
        return data

    def options(self, model: str) -> dict[str, Any]:
        return _options_doc(self.request("GET", _options_path(model)), model)

    def save_options(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._post_options(model, dict(body))

    def validate_options(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        """Lemonade's own dry run of a save (`dry_run: true`): validated and resolved, nothing saved."""
        return self._post_options(model, {**body, "dry_run": True})

    def _post_options(self, model: str, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            refuse_protected(payload)
        except ProtectedFlagError as exc:
            raise LemonadeError("rejected", str(exc)) from None
        return _options_doc(self.request("POST", _options_path(model), payload), model)

    def install(self, recipe: str, backend: str, timeout_s: float) -> dict[str, Any]:
        body = {"recipe": recipe, "backend": backend, "stream": False}
        return _object(self.request("POST", f"{API}/install", body, timeout_s), "POST /api/v1/install")

    def load(self, model: str, timeout_s: float) -> dict[str, Any]:
        return _object(
            self.request("POST", f"{API}/load", {"model_name": model}, timeout_s), "POST /api/v1/load"
        )


def _options_path(model: str) -> str:
    from urllib.parse import quote

    return f"{API}/models/{quote(model, safe='')}/options"


def _error_text(raw: bytes) -> str:
    try:
        doc = load_value(raw, "error", MAX_BODY_BYTES)
    except DocumentError:
        text = raw.decode("utf-8", errors="replace")
    else:
        error = doc.get("error", doc) if isinstance(doc, dict) else doc
        if isinstance(error, dict):
            error = error.get("message", error)
        text = error if isinstance(error, str) else json.dumps(error)
    text = " ".join(text.split())
    return text[:MAX_ERROR_TEXT] + ("..." if len(text) > MAX_ERROR_TEXT else "")


def _object(doc: Any, what: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise LemonadeError("shape", f"{what}: the answer is not a JSON object; is this Lemonade Server?")
    return doc


def _options_doc(doc: Any, model: str) -> dict[str, Any]:
    what = f"options of {model}"
    doc = _object(doc, what)
    for key in ("saved", "effective"):
        if not isinstance(doc.get(key), dict):
            raise LemonadeError(
                "shape", f"{what}: `{key}` is not an object; this Lemonade has no options API"
            )
    if not isinstance(doc.get("recipe", ""), str):
        raise LemonadeError("shape", f"{what}: `recipe` is not a string")
    return doc
