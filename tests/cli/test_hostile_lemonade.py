"""`rocmdoctor lemonade` against a hostile Lemonade over loopback: a server that echoes the admin key back
(as its version, in an error), answers with documents built to break a parser (deep nesting,
5,000-digit integers, bytes that are not UTF-8), or drips its status line and headers. Every
subcommand, with and without --json: exit 2 with a clear message or a normal result, the key and the
password of --url's userinfo never printed, and every exchange ends within its deadline.

The server speaks HTTP/1.1 over a real socket (http.server); the shapes of its valid answers are
Lemonade's documented ones (lemonade-sdk/lemonade @ e385039ed33551de7f54cb73194cd08088772c08,
docs/api/lemonade.md: /api/v1/health `version` and `all_models_loaded`, /api/v1/models `data`,
/api/v1/system-info `recipes.vllm.backends.rocm.state|version`; docs/dev/getting-started.md
"Internal Endpoints": /internal/config).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.app_thread import serve_in_thread
from harness.lemonade_server import make_report_host
from rocmdoctor.cli import cli

ADMIN_KEY = "lem-admin-Hx82kQ0vZ7pL"
PASSWORD = "userinfo-Pa55-w0rd-9Q"
SUBCOMMANDS = [("check",), ("apply", "--check"), ("install-backend", "--check"), ("install-backend",)]


def valid_answers(echo: str) -> dict[str, bytes]:
    return {
        "/api/v1/health": json.dumps({"status": "ok", "version": echo, "all_models_loaded": []}).encode(),
        "/internal/config": json.dumps({"global_timeout": 1200, "echo": echo}).encode(),
        # a vllm model named like the echo: its options URL (404 here) quotes it in apply's error
        "/api/v1/models": json.dumps({"data": [{"id": echo, "recipe": "vllm"}]}).encode(),
        "/api/v1/system-info": json.dumps(
            {"recipes": {"vllm": {"backends": {"rocm": {"state": echo, "version": echo}}}}}
        ).encode(),
        "/api/v1/install": json.dumps({"status": "success", "echo": echo}).encode(),
    }


@contextlib.contextmanager
def hostile_lemonade(answers: dict[str, bytes], drip: str | None = None) -> Iterator[str]:
    """A server on loopback answering each path with `answers[path]` (200, application/json). `drip`
    names a path whose status line and headers come one byte every 0.2 s for a minute."""
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            path = self.path.split("?", 1)[0]
            if path == drip:
                for byte in b"HTTP/1.1 200 OK\r\nX-Drip: " + b"." * 300:
                    if stop.is_set():
                        return
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.2)
                return
            body = answers.get(path, b'{"error": "no such endpoint"}')
            self.send_response(200 if path in answers else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    serve_in_thread(server)
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> Path:
    return make_report_host(tmp_path_factory.mktemp("hostile-lemonade") / "host")


def run(host: Path, url: str, *args: str, key_file: Path | None = None):
    env = {"LEMONADE_ADMIN_API_KEY": "" if key_file else ADMIN_KEY, "LEMONADE_API_KEY": ""}
    env["ROCMDOCTOR_LEMONADE_URL"] = ""
    extra = ["--admin-key-file", str(key_file)] if key_file else []
    return CliRunner().invoke(cli, ["--root", str(host), "lemonade", *args, "--url", url, *extra], env=env)


def printed(result) -> str:
    return result.stdout + result.stderr


@pytest.mark.parametrize("as_json", [False, True], ids=["people", "json"])
@pytest.mark.parametrize("sub", SUBCOMMANDS, ids=" ".join)
@pytest.mark.parametrize("key_from", ["env", "file"])
def test_the_admin_key_a_server_echoes_is_never_printed(host, tmp_path, sub, as_json, key_from):
    key_file = None
    if key_from == "file":
        key_file = tmp_path / "admin.key"
        key_file.write_text(ADMIN_KEY + "\n")
        key_file.chmod(0o600)
    with hostile_lemonade(valid_answers(ADMIN_KEY)) as address:
        result = run(host, f"http://{address}", *sub, *(["--json"] if as_json else []), key_file=key_file)
    out = printed(result)
    assert result.exit_code in (0, 1, 2) and "internal error" not in out, out
    assert ADMIN_KEY not in out and "***" in out, out
    if as_json:
        json.loads(result.stdout)  # still a JSON document


@pytest.mark.parametrize("as_json", [False, True], ids=["people", "json"])
@pytest.mark.parametrize("sub", SUBCOMMANDS, ids=" ".join)
def test_the_password_of_the_urls_userinfo_is_never_printed(host, sub, as_json):
    with hostile_lemonade(valid_answers("10.1.0")) as address:
        result = run(host, f"http://admin:{PASSWORD}@{address}", *sub, *(["--json"] if as_json else []))
    out = printed(result)
    assert result.exit_code in (0, 1, 2) and "internal error" not in out, out
    assert PASSWORD not in out, out
    if sub[0] != "install-backend":  # check and apply print the server's URL: without its password
        assert f"***@{address}" in out, out


def test_a_password_in_an_unreachable_url_is_never_printed(host):
    for args in (("check",), ("check", "--json"), ("install-backend",)):
        result = run(host, f"http://admin:{PASSWORD}@127.0.0.1:9", *args)
        assert result.exit_code == 2 and PASSWORD not in printed(result), printed(result)


HOSTILE = {
    "deep-array": b"[" * 200_000 + b"]" * 200_000,
    "deep-object": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "huge-int": b'{"global_timeout": ' + b"9" * 5000 + b', "data": [], "recipes": {}}',
    "out-of-range-float": b'{"global_timeout": 1e999, "data": []}',
    "not-utf8": b'{"status": "\xff\xfe", "data": []}',
    "lone-surrogate": b'{"version": "\\udc80", "data": [], "all_models_loaded": []}',
}


@pytest.mark.parametrize("as_json", [False, True], ids=["people", "json"])
@pytest.mark.parametrize("sub", SUBCOMMANDS, ids=" ".join)
@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_a_hostile_answer_is_a_clear_exit_2(host, sub, as_json, attack):
    answers = {path: HOSTILE[attack] for path in valid_answers("")}
    with hostile_lemonade(answers) as address:
        result = run(host, f"http://{address}", *sub, *(["--json"] if as_json else []))
    out = printed(result)
    assert result.exit_code == 2, out
    assert "internal error" not in out and "Traceback" not in out, out
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    assert "9" * 100 not in out
    if as_json:
        assert json.loads(result.stdout)["ok"] is False


def test_a_huge_timeout_in_lemonades_config_is_bounded(host):
    """global_timeout near 2**63 (a 64-bit integer msgspec accepts) reaches no OverflowError."""
    answers = valid_answers("10.1.0")
    answers["/internal/config"] = json.dumps({"global_timeout": 2**63 - 1}).encode()
    answers["/api/v1/models"] = b'{"data": []}'
    with hostile_lemonade(answers) as address:
        result = run(host, f"http://{address}", "check", "--json")
    assert result.exit_code in (0, 1), printed(result)
    findings = {f["id"]: f for f in json.loads(result.stdout)["findings"]}
    assert findings["lemonade.timeout"]["status"] == "pass"


def test_every_credential_the_one_client_sends_is_redacted_when_echoed():
    """The one HTTP client learns each credential it sends (a Bearer token, a key header, URL userinfo):
    a server that echoes the request back is printed with *** wherever the answer goes."""
    from rocmdoctor.provision import bounded_http
    from rocmdoctor.sensitive import redact_known

    class Echo(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"headers": dict(self.headers), "path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    serve_in_thread(server)
    token, key, password = "bearer-Tok3n-echo-9f2", "xapikey-K3y-echo-77", "pw-Echo-5521x"
    base = f"127.0.0.1:{server.server_address[1]}/v1/models"
    try:
        answers = [
            bounded_http.get(
                url, deadline=bounded_http.Deadline(10), limit=1 << 16, headers=headers
            ).body.decode()
            for url, headers in (
                (f"http://{base}", {"Authorization": f"Bearer {token}", "X-Api-Key": key}),
                (f"http://user:{password}@{base}", {}),  # sent as Authorization: Basic base64(user:pw)
            )
        ]
    finally:
        server.shutdown()
        server.server_close()
    assert token in answers[0] and key in answers[0] and "Basic " in answers[1]  # the server echoed them
    for echoed in answers:
        shown = redact_known(echoed)
        assert token not in shown and key not in shown and password not in shown, shown
        assert "Basic ***" in shown or "Bearer ***" in shown, shown
