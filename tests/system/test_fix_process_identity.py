"""`rocmdoctor fix` stops an orphaned vLLM server only when the process's identity says it is one
(rocmdoctor.process_identity), and only through the pidfd held since it was judged.

Everything runs in a PID namespace of its own (tests/harness/orphan_ns.py as its PID 1): every process
the test starts there has PID 1 as its parent, as an orphan has, and dies with the namespace. The
decoys are real programs (tail, sh and pgrep, python scripts, `exec -a`); the orphans are real vLLM API
servers from the engine venv (`python -m vllm.entrypoints.openai.api_server` and the `vllm` console
script), judged and stopped while they load."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO
from harness.engine import free_port, make_tiny_model, require_vllm_python
from harness.hosts import fixture_root

pytestmark = [pytest.mark.timeout(600)]

DRIVER = REPO / "tests" / "harness" / "orphan_ns.py"
FIXTURE = fixture_root("strix-halo-default-ttm")


def in_namespace(tmp_path, *args: str) -> dict:
    out = tmp_path / "result.json"
    python = require_vllm_python()
    model = make_tiny_model(tmp_path / "model")
    argv = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(DRIVER)]
    argv += [args[0], str(out), str(python), str(model), str(free_port()), *args[1:]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0 and out.exists(), done.stderr[-3000:]
    return json.loads(out.read_text())


def test_fix_stops_real_vllm_orphans_and_never_a_decoy(tmp_path):
    fix = [
        sys.executable,
        "-m",
        "rocmdoctor",
        "--root",
        str(FIXTURE),
        "fix",
        "--target",
        "/",
        "--only",
        "orphans",
    ]
    result = in_namespace(tmp_path, "fix", "--", *fix)
    decoys = {name: d["pid"] for name, d in result["decoys"].items()}
    engines = {name: e["pid"] for name, e in result["engines"].items()}

    check = result["check"]
    assert check["rc"] == 0 and check["out"] is not None, check
    (item,) = check["out"]["items"]
    assert sorted(item["pids"]) == sorted(engines.values()), (item, decoys)
    assert "-m vllm.entrypoints.openai.api_server" in item["title"]
    assert "console script" in item["title"]

    applied = result["yes"]
    assert applied["rc"] == 0 and applied["out"] is not None, applied
    (item,) = applied["out"]["items"]
    assert sorted(item["pids"]) == sorted(engines.values())
    for pid in engines.values():
        assert f"{pid} terminated" in item["result"] or f"{pid} killed" in item["result"], item["result"]
    assert not any(e["alive"] for e in result["engines"].values()), result["engines"]
    # No decoy was signalled: each is still running (a SIGTERM would have ended every one of them).
    assert all(d["alive"] for d in result["decoys"].values()), result["decoys"]
    assert not set(decoys.values()) & set(item["pids"])


def test_a_reused_pid_is_never_signalled(tmp_path):
    result = in_namespace(tmp_path, "reuse")
    for newcomer in ("sleep", "vllm"):
        case = result[newcomer]
        # The PID was really reused, and the held process was the first server.
        assert case["first"] == case["second"] and case["judged"] == [case["first"]], case
        assert case["ended"] == {str(case["first"]): "gone; not signalled: its PID now names another process"}
        # Even a newcomer that is itself a vLLM server is another process (another start time): untouched.
        assert case["second_alive"], case
