"""The server commands (`unit`, `serve`, `instances`) declare each shared option once
(commands/server_options.py): the same flag, type and checks wherever it appears."""

from __future__ import annotations

import click
import pytest

from rocmdoctor.commands.instances import instances
from rocmdoctor.commands.serve import serve, unit
from rocmdoctor.commands.server_options import OPTIONS

COMMANDS = {"unit": unit, "serve": serve, "instances": instances}
# serve's --timeout is a foreground wait (fractions allowed), not systemd's whole seconds.
OWN_TYPE = {("serve", "timeout_s")}


def options_of(command: click.Command) -> dict[str, click.Option]:
    return {p.name: p for p in command.params if isinstance(p, click.Option) and p.name}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_shared_option_is_the_declared_one(name):
    declared = {decls[-1].lstrip("-").replace("-", "_"): (decls, kw) for decls, kw in OPTIONS.values()}
    params = options_of(COMMANDS[name])
    shared = set(declared) & set(params)
    assert {"model", "host", "port", "api_key_file", "vllm_args", "as_json"} <= shared
    for dest in shared:
        decls, keywords = declared[dest]
        option = params[dest]
        assert decls[0] in option.opts, (name, dest)
        if "type" in keywords and (name, dest) not in OWN_TYPE:
            assert option.type is keywords["type"], (name, dest)
        assert option.callback is keywords.get("callback"), (name, dest)


def test_every_server_command_takes_prefix_and_the_key_file_rule():
    for name, command in COMMANDS.items():
        params = options_of(command)
        assert params["prefix"].envvar == "ROCMDOCTOR_PREFIX", name
        assert params["api_key_file"].callback is OPTIONS["api_key_file"][1]["callback"], name
