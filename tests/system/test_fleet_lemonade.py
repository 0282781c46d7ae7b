"""The role's Lemonade phase run by the real ansible-playbook (local connection) against the Lemonade
stand-in forwarding to the real vLLM engine: backend installed through Lemonade's API, the options saved
once (check mode saves nothing, a second run changes nothing), and a smoke test through Lemonade."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.fleet import ANSIBLE_PLAYBOOK, PLAYBOOKS, REPO
from harness.lemonade_server import Registered, State, lemonade_server, make_report_host, qwen3_8b_cache

pytestmark = [pytest.mark.timeout(900)]

ADMIN_KEY = "lemonade-admin-Zq7xV2kP9sW4"
MODEL = "user.Qwen3-8B-vLLM"
PLAY = """
- name: Lemonade phase of the rocmdoctor role
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Run the role's Lemonade tasks
      ansible.builtin.include_role:
        name: rocmdoctor
        tasks_from: lemonade
"""


def play(tmp_path: Path, extra: dict, *flags: str) -> tuple[int, str]:
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAY)
    (tmp_path / "vars.json").write_text(json.dumps(extra))
    done = subprocess.run(
        [
            str(ANSIBLE_PLAYBOOK),
            "-i",
            "localhost,",
            "-c",
            "local",
            str(playbook),
            "-e",
            f"@{tmp_path / 'vars.json'}",
        ]
        + list(flags),
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **os.environ,
            "ANSIBLE_ROLES_PATH": str(PLAYBOOKS / "roles"),
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
            "ANSIBLE_LOCALHOST_WARNING": "0",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
        },
    )
    return done.returncode, done.stdout + done.stderr


def test_role_tunes_and_smokes_a_model_through_lemonade(vllm_engine, tmp_path: Path):
    host = make_report_host(tmp_path / "host")
    cache = qwen3_8b_cache(tmp_path / "hub")
    key_file = tmp_path / "lemonade-admin.key"
    key_file.write_text(ADMIN_KEY + "\n")
    key_file.chmod(0o600)
    state_dir = tmp_path / "lemonade-state"
    state_dir.mkdir()
    state = State(
        state_dir,
        {MODEL: Registered("Qwen/Qwen3-8B")},
        admin_key=ADMIN_KEY,
        backend_state="installable",
        engine_url=vllm_engine.base_url,
        engine_key=vllm_engine.api_key,
        engine_model=vllm_engine.model,
        engine_pid=vllm_engine.pid,
    )
    with lemonade_server(state) as server:
        variables = {
            "rocmdoctor_venv": str(REPO / ".venv"),
            "rocmdoctor_root": str(host),
            "rocmdoctor_lemonade": "instead",
            "rocmdoctor_lemonade_url": server.url,
            "rocmdoctor_lemonade_admin_key_file": str(key_file),
            "rocmdoctor_lemonade_hf_cache": str(cache),
        }
        rc_check, out_check = play(tmp_path, variables, "--check", "--diff")
        saved_after_check, backend_after_check = state.saved(), state.backend_state
        rc_first, out_first = play(tmp_path, variables, "--diff")
        rc_again, out_again = play(tmp_path, variables)

    assert rc_check == 0, out_check
    assert saved_after_check == {} and backend_after_check == "installable"
    assert '+  "vllm_args": "--gpu-memory-utilization 0.78 --max-num-seqs 10"' in out_check
    assert rc_first == 0, out_first
    assert state.saved()[MODEL] == {
        "ctx_size": 40960,
        "vllm_args": "--gpu-memory-utilization 0.78 --max-num-seqs 10",
    }
    assert state.backend_state == "installed"
    assert "the model serves through Lemonade" in out_first
    assert rc_again == 0 and "changed=0" in out_again, out_again
    assert ADMIN_KEY not in out_check + out_first + out_again
