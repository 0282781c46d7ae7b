"""The playbooks pass `ansible-lint --profile production` and ansible-playbook's syntax check."""

from __future__ import annotations

import subprocess

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
