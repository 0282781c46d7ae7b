#!/usr/bin/python
"""Ansible module: run a rocmdoctor command that changes a host, with Ansible's check and diff modes.

rocmdoctor's changing commands (`unit --write`, `instances --write`, `install`, `rollback`, `bundle lock`,
`bundle prune`, `lemonade apply`) all print one JSON envelope with `--json` (rocmdoctor's
schema/change.schema.json: {"schema_version", "changed", "check", "msg", "diff"}, the diff a unified
text or a `{before, after}` state) and take `--check` for a dry run. The module reads only that. This module maps them onto
Ansible's contract, so `ansible-playbook site.yml --check --diff` shows what each would change.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: rocmdoctor_command
short_description: Run a changing rocmdoctor command with check mode and diffs
description:
  - Runs C(cli + command + [--json] + [--check in check mode] + args) and reports its C(changed),
    C(msg) and diffs as Ansible does. The command's own JSON is returned as C(result).
  - The module's own flags always go before a C(--) in C(command) or C(args): after it they would be
    the vLLM server's arguments, and a dry run would write for real.
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
  stage:
    description:
      - Small files (name to text) written into a private temporary directory on the host for this one
        run and passed as C(stage_option DIR) before C(args); removed afterwards, whatever happened.
      - For a dry run against what would be delivered (e.g. the bundle pins, C(--bundles-dir)) before
        it is on the host.
    type: dict
    default: {}
  stage_option:
    description: The option that names the staged directory (required with C(stage)).
    type: str
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


def _state_text(state: object) -> str:
    """One `key: value` line per field, so Ansible's diff shows which field changed."""
    if isinstance(state, dict):
        return "".join(f"{key}: {json.dumps(value)}\n" for key, value in sorted(state.items()))
    return json.dumps(state) + "\n"


def diffs(doc: dict) -> list[dict]:
    """Ansible's diff entries (`prepared` text is shown as it is under --diff; a `{before, after}`
    state, as `install` and `rollback` report, is diffed by Ansible itself)."""
    entries = []
    diff = doc.get("diff")
    if isinstance(diff, str) and diff:
        entries.append({"prepared": diff})
    elif isinstance(diff, dict) and "before" in diff and "after" in diff and doc.get("changed"):
        entries.append(
            {
                "before_header": "before",
                "after_header": "after",
                "before": _state_text(diff["before"]),
                "after": _state_text(diff["after"]),
            }
        )
    return entries


def stage_files(module: AnsibleModule, files: dict) -> str:
    """A private directory (mode 0700) holding `files`; names are plain file names, nothing else."""
    folder = tempfile.mkdtemp(prefix="rocmdoctor-stage-")
    try:
        for name, text in files.items():
            if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
                raise ValueError(f"stage: {name!r} is not a plain file name")
            with open(os.path.join(folder, name), "x", encoding="utf-8") as handle:
                # A JSON file's text may reach us parsed (templating can turn it into a dict).
                handle.write(text if isinstance(text, str) else json.dumps(text, indent=2) + "\n")
    except (OSError, ValueError) as exc:
        shutil.rmtree(folder, ignore_errors=True)
        module.fail_json(msg=f"could not stage the files for the run: {exc}")
    return folder


def split_at_separator(words: list[str]) -> tuple[list[str], list[str]]:
    """rocmdoctor's own words, and from the first `--` on, the vLLM server's (which rocmdoctor passes
    through untouched: `--check` there would not be seen as a dry run)."""
    if "--" in words:
        cut = words.index("--")
        return words[:cut], words[cut:]
    return words, []


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cli": {"type": "list", "elements": "str", "required": True},
            "command": {"type": "list", "elements": "str", "required": True},
            "args": {"type": "list", "elements": "str", "default": []},
            "stage": {"type": "dict", "default": {}},
            "stage_option": {"type": "str"},
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["stage"] and not params["stage_option"]:
        module.fail_json(msg="stage needs stage_option (the option that names the staged directory)")
    staged = stage_files(module, params["stage"]) if params["stage"] else None
    try:
        own, passed_through = split_at_separator([*params["command"], *params["args"]])
        argv = [
            *params["cli"],
            *own[: len(params["command"])],
            "--json",
            *(["--check"] if module.check_mode else []),
            *([params["stage_option"], staged] if staged else []),
            *own[len(params["command"]) :],
            *passed_through,
        ]
        rc, out, err = module.run_command(argv)
    finally:
        if staged:
            shutil.rmtree(staged, ignore_errors=True)
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
