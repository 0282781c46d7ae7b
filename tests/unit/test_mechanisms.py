"""The single mechanisms cannot be bypassed: an AST guard over every module of the package.

- Parsing a document (JSON, TOML, YAML, msgpack, pickle) happens in `documents.py`, the bounded typed
  reader (size cap, depth guard, 64-bit integers), and nowhere else.
- Opening a network connection happens in `provision/bounded_http.py`, the one HTTP client (one total
  deadline over connect, status line, each header and the body), and nowhere else.
- Signalling a process happens in `host_processes.py` (identity through a pidfd, the group of a program
  it started), and nowhere else.

Each exception below is a module, with the reason it cannot use the mechanism. A new bypass fails with
file:line and the mechanism to use instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

ROOTS = {
    "src/rocmdoctor": REPO / "src" / "rocmdoctor",
    "checks": REPO / "checks",
    "provision": REPO / "provision",
}

# Standalone scripts shipped into the bundle's libexec: they run on the bundle's own Python as a unit's
# ExecStartPre/ExecStartPost/ExecStart and cannot import rocmdoctor (tests/cli/test_provision_io.py).
STANDALONE = {
    "provision/server/wait_ready.py": "ExecStartPost on the bundle's own Python; cannot import rocmdoctor",
    "provision/server/stop_leftovers.py": "ExecStartPre on the bundle's own Python; cannot import rocmdoctor",
    "provision/server/vllm_serve.py": "a worker's ExecStart on the bundle's own Python; cannot import rocmdoctor",
}

PARSE_ALLOWED = {
    "src/rocmdoctor/documents.py": "the bounded typed reader itself",
    # rocmdoctor's own packaged data (importlib.resources), written and reviewed with the code: not foreign
    "src/rocmdoctor/report.py": "reads the package's own JSON schemas (schema/*.json)",
    "checks/facts.py": "reads the package's own checks/data/gpu_kinds.json",
    "checks/host_rules.py": "reads the package's own checks/data/host_rules.json",
    "src/rocmdoctor/archive/elf_scan.py": "reads the package's own bundles/qualification.toml",
    "src/rocmdoctor/vllm/log_signatures.py": "reads the package's own vllm/data/log_signatures.json",
    **STANDALONE,
}
NETWORK_ALLOWED = {
    "provision/bounded_http.py": "the one HTTP client itself",
    # Streaming with concurrency: smoke and bench keep up to N requests in flight on one event loop and
    # read server-sent events; every read there has its own deadline (openai_client._Progress).
    "provision/verify/openai_client.py": "asyncio streaming client of smoke and bench (SSE, concurrency)",
    # Downloads of many GiB: the status line and headers arrive through bounded_http.open_stream (its
    # deadline); the body is read with a stall timeout per read and a minimum throughput, and a
    # requests.Session per thread keeps the connections of parallel ranges.
    "provision/bundle/download.py": "multi-GiB streamed downloads over bounded_http.open_stream",
    # The cluster's reachability probe: one TCP connect with a timeout, closed at once, nothing sent or read.
    "src/rocmdoctor/host_sockets.py": "a bare TCP connect that sends and reads nothing (port reachability)",
    **STANDALONE,
}
SIGNAL_ALLOWED = {
    "src/rocmdoctor/host_processes.py": "the one process module itself",
    # Host.run's child is started in its own session and not yet reaped when it is killed: its PID (and
    # group id) cannot name another process before the wait, so no identity check is needed.
    "src/rocmdoctor/host.py": "kills the session of the child Host.run started and has not reaped",
    "src/rocmdoctor/archive/tar_pipe.py": "kills the tar child it started (Popen.kill) before reaping it",
    **STANDALONE,
}

PARSE_CALLS = {
    "json.loads",
    "json.load",
    "json.JSONDecoder",
    "json.decoder.JSONDecoder",
    "tomllib.loads",
    "tomllib.load",
    "tomli.loads",
    "tomli.load",
    "msgspec.json.decode",
    "msgspec.json.Decoder",
    "msgspec.toml.decode",
    "msgspec.yaml.decode",
    "msgspec.msgpack.decode",
    "msgspec.msgpack.Decoder",
    "yaml.load",
    "yaml.safe_load",
    "yaml.full_load",
    "yaml.unsafe_load",
    "pickle.loads",
    "pickle.load",
    "marshal.loads",
}
NETWORK_MODULES = (
    "requests",
    "aiohttp",
    "httpx",
    "urllib3",
    "http.client",
    "urllib.request",
    "websockets",
    "ftplib",
)
NETWORK_CALLS = {"socket.create_connection", "asyncio.open_connection", "asyncio.open_unix_connection"}
SIGNAL_CALLS = {"os.kill", "os.killpg", "signal.pidfd_send_signal", "signal.pthread_kill"}
SIGNAL_METHODS = {"send_signal", "terminate", "kill"}

PARSE = "parses a document; use documents.decode / load_value / load_toml (the bounded reader)"
NETWORK = "opens a connection; use provision/bounded_http.request / get (the one HTTP client)"
SIGNAL = "signals a process; use host_processes (stop_pids, ProcessGroup.stop)"


def _imports(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted name it stands for (`import json as j`, `from json import loads`)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.AST, names: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(names.get(node.id, node.id))
        return ".".join(reversed(parts))
    return None


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0


def violations(source: str, filename: str) -> list[str]:
    """Each bypass in `source`, as `file:line: what; use instead`, for the rules that do not exempt it."""
    tree = ast.parse(source, filename=filename)
    names = _imports(tree)
    uses_socket = any(v == "socket" or v.startswith("socket.") for v in names.values())
    found: list[tuple[str, int, str]] = []

    def bad(rule: str, node: ast.AST, what: str) -> None:
        found.append((rule, getattr(node, "lineno", 0), what))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                if node.level == 0
                else []
            )
            for module in modules:
                if any(module == m or module.startswith(m + ".") for m in NETWORK_MODULES):
                    bad("network", node, f"imports {module}: {NETWORK}")
                    break
        elif isinstance(node, ast.Call):
            dotted = _dotted(node.func, names)
            if dotted in PARSE_CALLS:
                bad("parse", node, f"calls {dotted}(): {PARSE}")
            elif dotted in NETWORK_CALLS:
                bad("network", node, f"calls {dotted}(): {NETWORK}")
            elif dotted in SIGNAL_CALLS:
                # os.kill(pid, 0) asks whether a PID exists; it delivers nothing
                if not (dotted == "os.kill" and len(node.args) == 2 and _is_zero(node.args[1])):
                    bad("signal", node, f"calls {dotted}(): {SIGNAL}")
            elif isinstance(node.func, ast.Attribute):
                attr = node.func.attr
                if attr == "json" and not node.args and not node.keywords:
                    bad("parse", node, f"calls .json() on an answer: {PARSE}")
                elif attr in SIGNAL_METHODS and not (attr == "kill" and dotted and dotted.startswith("os.")):
                    bad("signal", node, f"calls .{attr}(): {SIGNAL}")
                elif attr in ("connect", "connect_ex") and uses_socket:
                    bad("network", node, f"calls .{attr}() on a socket: {NETWORK}")
    allowed = {"parse": PARSE_ALLOWED, "network": NETWORK_ALLOWED, "signal": SIGNAL_ALLOWED}
    return [
        f"{filename}:{line}: {what}" for rule, line, what in sorted(found) if filename not in allowed[rule]
    ]


def sources() -> list[str]:
    return sorted(
        f"{prefix}/{path.relative_to(root)}" for prefix, root in ROOTS.items() for path in root.rglob("*.py")
    )


@pytest.mark.parametrize("name", sources())
def test_no_module_bypasses_the_mechanisms(name: str):
    found = violations((REPO / name).read_text(encoding="utf-8"), name)
    assert not found, "\n".join(found)


def test_every_exception_names_a_module_that_exists():
    every = set(sources())
    for table in (PARSE_ALLOWED, NETWORK_ALLOWED, SIGNAL_ALLOWED):
        assert set(table) <= every, set(table) - every


@pytest.mark.parametrize(
    ("snippet", "needle"),
    [
        ("import json\njson.loads(b)\n", "x.py:2: calls json.loads(): parses a document"),
        ("import json as j\nj.load(f)\n", "calls json.load()"),
        ("from json import loads\nloads(b)\n", "calls json.loads()"),
        ("import tomllib\ntomllib.loads(t)\n", "calls tomllib.loads()"),
        ("import msgspec\nmsgspec.json.decode(b)\n", "calls msgspec.json.decode()"),
        ("answer = session.get(u)\nanswer.json()\n", "calls .json() on an answer"),
        ("import requests\n", "imports requests: opens a connection"),
        ("def f():\n    import http.client\n", "x.py:2: imports http.client"),
        ("from urllib.request import urlopen\n", "imports urllib.request"),
        ("import aiohttp\n", "imports aiohttp"),
        ("import socket\nsocket.create_connection((h, p))\n", "calls socket.create_connection()"),
        ("import socket\ns = socket.socket()\ns.connect((h, p))\n", "calls .connect() on a socket"),
        ("import os\nos.kill(pid, 15)\n", "calls os.kill(): signals a process"),
        ("import os\nos.killpg(pgid, sig)\n", "calls os.killpg()"),
        ("from os import kill\nkill(pid, 9)\n", "calls os.kill()"),
        ("import signal\nsignal.pidfd_send_signal(fd, 9)\n", "calls signal.pidfd_send_signal()"),
        ("psutil.Process(pid).terminate()\n", "calls .terminate()"),
        ("proc.send_signal(9)\n", "calls .send_signal()"),
    ],
)
def test_the_guard_catches_each_kind_of_bypass(snippet: str, needle: str):
    found = violations(snippet, "x.py")
    assert any(needle in line for line in found), found


def test_the_guard_passes_what_is_no_bypass():
    clean = (
        "import json, os, socket\n"
        "json.dumps({})\n"
        "os.kill(pid, 0)\n"
        "s = socket.socket()\n"
        "s.bind(('127.0.0.1', 0))\n"
        "from urllib.parse import quote\n"
        "from rocmdoctor import documents\n"
        "documents.load_value(b, 'x', 10)\n"
    )
    assert violations(clean, "x.py") == []


def test_the_exceptions_hold_only_for_their_own_rule():
    # bounded_http may open connections but not parse; host_processes may signal but not connect
    assert violations("import json\njson.loads(b)\n", "provision/bounded_http.py")
    assert violations("import requests\n", "src/rocmdoctor/host_processes.py")
    assert not violations("import requests\n", "provision/bounded_http.py")


def test_the_scan_covers_every_package_folder():
    names = sources()
    assert any(n.startswith("checks/") for n in names)
    assert any(n.startswith("provision/server/") for n in names)
    assert any(n.startswith("src/rocmdoctor/commands/") for n in names)
    assert Path(REPO / "src/rocmdoctor/documents.py").is_file()
