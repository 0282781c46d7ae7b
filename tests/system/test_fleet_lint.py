"""The playbooks pass `ansible-lint --profile production` and ansible-playbook's syntax check."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from harness.fleet import ANSIBLE_PLAYBOOK, PLAYBOOKS, REPO


def test_playbooks_pass_ansible_lint_production_profile():
    lint = ANSIBLE_PLAYBOOK.parent / "ansible-lint"
    done = subprocess.run(
        [str(lint), "--profile", "production", "--offline", "playbooks/"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Profile 'production' was required, and it passed" in done.stdout + done.stderr


def test_site_yml_passes_the_syntax_check():
    done = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "--syntax-check", "-i", "localhost,", "site.yml"],
        cwd=PLAYBOOKS,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def validate_only(tmp_path, layout: str) -> subprocess.CompletedProcess:
    """site.yml against this machine in check mode with a tag no task has: only the role's argument
    validation and its `always` probes run, and a host without rocmdoctor ends there (nothing written)."""
    inventory = tmp_path / "inventory.json"
    inventory.write_text(
        json.dumps(
            {
                "all": {
                    "children": {
                        "rocmdoctor_hosts": {
                            "hosts": {
                                "localhost": {
                                    "ansible_connection": "local",
                                    "ansible_python_interpreter": sys.executable,
                                }
                            }
                        }
                    }
                }
            }
        )
    )
    return subprocess.run(
        [
            str(ANSIBLE_PLAYBOOK),
            "-i",
            str(inventory),
            "site.yml",
            "--check",
            "--tags",
            "argument-validation-only",
            "-e",
            json.dumps({"rocmdoctor_prefix": str(tmp_path / "prefix"), "rocmdoctor_instances": layout}),
        ],
        cwd=PLAYBOOKS,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"), "ANSIBLE_NOCOLOR": "1"},
    )


def test_the_role_refuses_an_unknown_instance_layout(tmp_path):
    bad = validate_only(tmp_path, "per-node")
    assert bad.returncode != 0
    assert "rocmdoctor_instances" in bad.stdout and "per-node" in bad.stdout, bad.stdout[-3000:]
    assert "per-gpu" in bad.stdout  # the message lists what is accepted
    good = validate_only(tmp_path, "per-gpu")
    assert good.returncode == 0, good.stdout[-3000:]
    assert not (tmp_path / "prefix").exists()
