"""The real-engine harness itself: the tiny model, the process-group stop, the shared server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from harness.engine import group_members, make_tiny_model, stop_group


def test_tiny_model_vocabulary_matches_its_tokenizer(tmp_path):
    model = make_tiny_model(tmp_path / "m", head_dim=16)
    config = json.loads((model / "config.json").read_text())
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    ids = set(tokenizer["model"]["vocab"].values()) | {t["id"] for t in tokenizer["added_tokens"]}
    assert config["head_dim"] == 16
    assert config["vocab_size"] == len(ids) == max(ids) + 1
    assert "<|im_start|>" in (model / "chat_template.jinja").read_text()


def test_stop_group_kills_children_that_ignore_sigterm():
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            f"subprocess.Popen([sys.executable, '-c', {stubborn!r}]); time.sleep(300)",
        ],
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while len(group_members(parent.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(group_members(parent.pid)) == 2
    stop_group(parent, parent.pid, grace_s=0.5)
    assert group_members(parent.pid) == []


def test_shared_engine_serves_its_name_and_guards_v1(vllm_engine):
    with urllib.request.urlopen(f"{vllm_engine.base_url}/health", timeout=10) as response:
        assert response.status == 200
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{vllm_engine.base_url}/v1/models", timeout=10)
    assert denied.value.code == 401
    request = urllib.request.Request(
        f"{vllm_engine.base_url}/v1/models", headers={"Authorization": f"Bearer {vllm_engine.api_key}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert [m["id"] for m in json.load(response)["data"]] == [vllm_engine.model]
