"""What systemd would run for one instance of a written template unit: its ExecStart= command line
with the specifiers and the instance's EnvironmentFile= variables expanded (systemd.service,
"Command lines"; systemd.unit, "Specifiers"), so a test can start that exact command without systemd.

Only the subset rocmdoctor writes is understood (double quotes, backslash escapes, %%, %i, $$ and
${VAR}); anything else is an error here, never a silently different command.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

WORD = re.compile(r'"((?:[^"\\]|\\.)*)"(?=\s|$)|([^\s"]+)')
EXPANSION = re.compile(r"%%|%i|%.|\$\$|\$\{(\w+)\}|\$")


class UnitExecError(ValueError):
    pass


def exec_start(unit_text: str) -> str:
    lines = [line for line in unit_text.splitlines() if line.startswith("ExecStart=")]
    if len(lines) != 1:
        raise UnitExecError(f"expected one ExecStart= line, found {len(lines)}")
    return lines[0].removeprefix("ExecStart=")


def env_file_vars(text: str) -> dict[str, str]:
    """KEY=VALUE lines, comments and blank lines skipped (the subset rocmdoctor writes)."""
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise UnitExecError(f"environment file line without '=': {line!r}")
        out[key.strip()] = value.strip()
    return out


def _expand(word: str, instance: str, env: Mapping[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "%%":
            return "%"
        if token == "%i":
            return instance
        if token == "$$":
            return "$"
        if match.group(1) is not None:
            if match.group(1) not in env:
                raise UnitExecError(f"${{{match.group(1)}}} is not set by the environment file")
            return env[match.group(1)]
        raise UnitExecError(f"{token!r} in {word!r}: not a form rocmdoctor writes")

    return EXPANSION.sub(one, word)


def instance_argv(unit_text: str, instance: str, env: Mapping[str, str]) -> list[str]:
    """ExecStart='s argv for instance `instance` whose EnvironmentFile= holds `env`."""
    line = exec_start(unit_text)
    argv: list[str] = []
    position = 0
    for match in WORD.finditer(line):
        if line[position : match.start()].strip():
            raise UnitExecError(f"cannot split ExecStart= at {line[position:]!r}")
        position = match.end()
        quoted, bare = match.group(1), match.group(2)
        # ${VAR} gives exactly one argument, as a whole word or inside one (never split on spaces).
        text = bare if bare is not None else re.sub(r"\\(.)", r"\1", quoted)
        argv.append(_expand(text, instance, env))
    if line[position:].strip() or not argv:
        raise UnitExecError(f"cannot split ExecStart= {line!r}")
    if argv[0].startswith(("-", "+", "@", "!", ":")):
        raise UnitExecError(f"ExecStart= prefix {argv[0][:1]!r} is not a form rocmdoctor writes")
    return argv
