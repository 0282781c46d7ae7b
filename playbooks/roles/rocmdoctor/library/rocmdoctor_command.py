#!/usr/bin/python
"""Ansible module: run a rocmdoctor command that changes a host, with Ansible's check and diff modes.

rocmdoctor's changing commands (`unit --write`, `install`, `rollback`, `bundle lock`, `bundle prune`)
all print one JSON envelope with `--json` ({"schema_version", "changed", "msg", "diff" or
"files": [{"path", "changed", "diff"}]}) and take `--check` for a dry run. This module maps them onto
Ansible's contract, so `ansible-playbook site.yml --check --diff` shows what each would change.
"""

from __future__ import annotations

import json

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: rocmdoctor_command
short_description: Run a changing rocmdoctor command with check mode and diffs
description:
  - Runs C(cli + command + [--json] + [--check in check mode] + args) and reports its C(changed),
    C(msg) and diffs as Ansible does. The command's own JSON is returned as C(result).
options:
  cli:
    description: The rocmdoctor executable and its global options (e.g. C(--root)).
    type: list
    elements: str
    required: true
  command:
    description: The subcommand words and options that go before C(--json) (e.g. C([unit, --write])).
    type: list
    elements: str
    required: true
  args:
    description: Further arguments, after rocmdoctor's own (vLLM arguments after C(--) go here, last).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- name: Write the systemd unit
  rocmdoctor_command:
    cli: [/opt/rocmdoctor/venv/bin/rocmdoctor]
    command: [unit, --write]
    args: [--model, /srv/models/qwen, --, --enforce-eager]
"""

RETURN = r"""
result:
  description: The command's JSON envelope.
  type: dict
  returned: success
"""


def diffs(doc: dict) -> list[dict]:
    """Ansible's diff entries (`prepared` text is shown as it is under --diff)."""
    entries = []
    if isinstance(doc.get("diff"), str) and doc["diff"]:
        entries.append({"prepared": doc["diff"]})
    for item in doc.get("files") or []:
        if isinstance(item, dict) and item.get("changed") and item.get("diff"):
            entries.append({"prepared": str(item["diff"])})
    return entries


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cli": {"type": "list", "elements": "str", "required": True},
            "command": {"type": "list", "elements": "str", "required": True},
            "args": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    argv = [
        *params["cli"],
        *params["command"],
        "--json",
        *(["--check"] if module.check_mode else []),
        *params["args"],
    ]
    rc, out, err = module.run_command(argv)
    try:
        doc = json.loads(out) if out.strip() else {}
    except ValueError:
        doc = {}
    if rc != 0 or not isinstance(doc, dict) or "changed" not in doc:
        module.fail_json(
            msg=(doc.get("msg") if isinstance(doc, dict) else None)
            or (err.strip() or out.strip())[-2000:]
            or f"rocmdoctor exited {rc}",
            rc=rc,
            cmd=argv,
            stdout=out[-4000:],
            stderr=err[-4000:],
        )
    result = {"changed": bool(doc["changed"]), "msg": str(doc.get("msg", "")), "result": doc, "cmd": argv}
    if module._diff:
        result["diff"] = diffs(doc)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
