"""The one writer of systemd unit syntax: every value that reaches a unit rocmdoctor writes goes through
a function here for its kind, then `render` fills the template.

The rules (systemd.syntax(7), systemd.service(5) "Command lines", systemd.exec(5) "Environment=",
systemd.unit(5) "Specifiers"):
- a line ends at a newline (and a carriage return); a line ending in a backslash continues on the next,
  so no value holds a control character (NUL, CR, LF, tab...) and none ends in a backslash;
- `%` starts a specifier in almost every setting, including Environment=, ExecStart= and Description=:
  a literal percent is `%%`;
- ExecStart= splits on whitespace, unquotes "..." and '...' with C escapes, and expands `$NAME` and
  `${NAME}`: a word with anything but plain characters is double-quoted with `\\` and `\"` escaped, and a
  literal dollar is `$$`; a lone `;` separates commands in old versions, so it is quoted too;
- Environment= splits on whitespace and unquotes with C escapes, with no `$` expansion: an assignment
  with anything but plain characters is written `"NAME=value"` with `\\` and `\"` escaped;
- a setting that takes one path or a list of paths (EnvironmentFile=, ReadWritePaths=, WorkingDirectory=)
  splits lists on whitespace and takes quotes as quotes: such a path is refused when it holds whitespace,
  quotes or a backslash.
`render` checks the result: every placeholder filled, and exactly the template's lines (a value can
never add a line or a setting).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# What needs quoting: whitespace splits words, quotes and backslashes are syntax, `;` separates commands.
NEEDS_QUOTES = re.compile(r"[\s\"'\\;]")
PLAIN_NAME = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Lists of paths split on whitespace; quotes and backslashes are syntax there.
PATH_SYNTAX = re.compile(r"[\s\"'\\]")
PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
# rocmdoctor's own references and specifiers, the only text written without quoting: ${NAME}, %n, %i.
VERBATIM = re.compile(r"\$\{[A-Z_][A-Z0-9_]*\}|%[ni]")
# A network interface as Linux names it (net/core/dev.c dev_valid_name: under IFNAMSIZ=16 bytes, not
# "." or "..", no "/", ":" or whitespace), restricted to the characters interface names use; Gloo and
# NCCL take a comma-separated list, NCCL with a "^" (exclude) or "=" (exact) before it.
IFNAME = re.compile(r"[A-Za-z0-9_.@+-]{1,15}")


class UnitError(ValueError):
    """A choice the unit cannot be written with; the message says what to do."""


@dataclass(frozen=True)
class Field:
    """Text already in unit syntax (made only by the functions of this module)."""

    text: str


@dataclass(frozen=True)
class Verbatim:
    """rocmdoctor's own systemd syntax in a command line: `${NAME}` or a specifier (`%n`, `%i`)."""

    text: str

    def __post_init__(self) -> None:
        if not VERBATIM.fullmatch(self.text):
            raise UnitError(f"{self.text!r} is not a reference or specifier rocmdoctor writes")


def _no_control(value: str, what: str) -> None:
    if CONTROL.search(value):
        raise UnitError(
            f"{what} {value!r}: control characters (newline, carriage return, tab, NUL) cannot go into a unit file"
        )


def exec_word(word: str) -> str:
    """One argv word for ExecStart= and its kin."""
    _no_control(word, "a command-line word")
    escaped = word.replace("%", "%%").replace("$", "$$")
    if escaped and not NEEDS_QUOTES.search(escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def command_line(argv: list[str | Verbatim]) -> str:
    """A whole ExecStart= value: each word quoted, references and specifiers as they are."""
    return " ".join(w.text if isinstance(w, Verbatim) else exec_word(w) for w in argv)


def command(argv: list[str | Verbatim]) -> Field:
    return Field(command_line(argv))


def assignment(name: str, value: str) -> str:
    """One NAME=value of Environment=."""
    if not ENV_NAME.fullmatch(name):
        raise UnitError(
            f"environment variable name {name!r}: letters, digits and _ only, not starting with a digit"
        )
    _no_control(value, f"the value of {name}")
    text = f"{name}={value.replace('%', '%%')}"
    if not NEEDS_QUOTES.search(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def environment(settings: Mapping[str, str]) -> Field:
    return Field(" ".join(assignment(name, value) for name, value in settings.items()))


def comment(value: str, what: str) -> Field:
    """The rest of a `#` comment line: anything but a control character (a newline would end it)."""
    _no_control(value, what)
    return Field(value)


# A drop-in that replaces the unit's command: the empty ExecStart= resets the list the unit set
# (systemd.service(5), "ExecStart="), the second sets the new one.
EXEC_START_DROPIN = """\
# {{header}}
# {{why}}
[Service]
ExecStart=
ExecStart={{command}}
"""


def exec_start_dropin(header: str, why: str, argv: list[str | Verbatim]) -> str:
    fields = {
        "header": comment(header, "the header"),
        "why": comment(why, "the reason"),
        "command": command(argv),
    }
    return render(EXEC_START_DROPIN, fields, "the ExecStart= drop-in")


def text(value: str, what: str) -> Field:
    """A free-text setting (Description=): the rest of the line, `%` escaped."""
    _no_control(value, what)
    if value.endswith("\\"):
        raise UnitError(f"{what} {value!r}: a trailing backslash would join the next line of the unit")
    return Field(value.replace("%", "%%"))


def path(value: str, what: str, specifiers: bool = False) -> Field:
    """An absolute path for a path setting; `specifiers`: rocmdoctor's own `%i` in it is kept."""
    _no_control(value, what)
    if not value.startswith("/"):
        raise UnitError(f"{what} {value!r}: give an absolute path")
    if PATH_SYNTAX.search(value):
        raise UnitError(
            f"{what} {value!r}: whitespace, quotes and backslashes cannot go into a unit's path setting"
        )
    if specifiers:
        kept = value.split("%i")
        return Field("%i".join(part.replace("%", "%%") for part in kept))
    return Field(value.replace("%", "%%"))


def number(value: int) -> Field:
    return Field(str(int(value)))


def name(value: str, what: str) -> Field:
    """A unit name, account or other identifier rocmdoctor validated already: plain characters only."""
    if not PLAIN_NAME.fullmatch(value):
        raise UnitError(f"{what} {value!r}: only letters, digits and _@+=:,./- can go here")
    return Field(value)


def ifname_problem(value: str) -> str | None:
    """Why `value` is not an interface name (or Gloo/NCCL list of them); None when it is."""
    words = value.split(",")
    for word in words:
        bare = word[1:] if word[:1] in ("^", "=") and word is words[0] else word
        if not IFNAME.fullmatch(bare) or bare in (".", ".."):
            return (
                f"{word!r} is not a network interface name (1-15 of letters, digits and _.@+-; "
                "a comma-separated list, optionally starting with ^ or =, as NCCL_SOCKET_IFNAME takes)"
            )
    return None


def render(template: str, fields: Mapping[str, Field], source: str = "the unit template") -> str:
    """The template with each {{placeholder}} replaced; only Fields, every one used, no line added."""
    missing = set(PLACEHOLDER.findall(template)) - set(fields)
    if missing:
        raise UnitError(f"{source}: no value for {', '.join(sorted(missing))}")
    for key, field_ in fields.items():
        if not isinstance(field_, Field):
            raise TypeError(f"{key}: unit values go through provision.server.unit_syntax")
        _no_control(field_.text, key)
    out = PLACEHOLDER.sub(lambda m: fields[m.group(1)].text, template)
    if out.count("\n") != template.count("\n"):
        raise UnitError(f"{source}: a value changed the unit's lines")
    return out


def instance_of(text: str, target: Field, env_file: Field, source: str) -> str:
    """A single server's rendered unit as an instance of `target` (vllm@.service under vllm.target):
    PartOf= the target after [Unit] (stopping or restarting the target reaches every instance), its
    optional EnvironmentFile= required (an instance without its file is not in the layout: fail, never
    start with an empty ${...}), WantedBy= the target. Each line is found exactly once or refused."""
    edits = [
        ("[Unit]\n", f"[Unit]\nPartOf={target.text}\n"),
        (f"EnvironmentFile=-{env_file.text}\n", f"EnvironmentFile={env_file.text}\n"),
        ("WantedBy=multi-user.target\n", f"WantedBy={target.text}\n"),
    ]
    for old, new in edits:
        if text.count(old) != 1:
            raise UnitError(
                f"{source} changed: {old.strip()!r} not found once; update unit_syntax.instance_of"
            )
        text = text.replace(old, new)
    return text
