"""The boot configuration files, parsed and edited as the tools that read them do. Pure: text in, text out.

Text is handled as `str` decoded with `surrogateescape` (`decode`/`encode` here), so bytes that are not
UTF-8 survive an edit unchanged and never raise.

- `/etc/default/grub` and `/etc/default/grub.d/*.cfg` are POSIX shell that `grub-mkconfig` sources with
  `/bin/sh` (GRUB manual, "Simple configuration handling": "sourced by a shell script, and so must be
  valid POSIX shell input"). `assignments` reads the plain `NAME=value` statements (also `export NAME=...`,
  indented ones, quoted, unquoted or escaped values, values over several lines), `evaluate` runs them in
  order as sh would (the last assignment wins, `$NAME`/`${NAME}` expand to earlier values), and
  `set_value` rewrites one assignment's value and nothing else. What this reader does not model (command
  substitution, `${NAME:-...}`, a statement that is not an assignment) makes a value unknown, never guessed.
- systemd-boot / kernel-install: `/etc/kernel/cmdline` is the whole command line on one logical line
  (kernel-install(8): "If /etc/kernel/cmdline ... exists, it is used"); a Boot Loader Specification entry
  (`/boot/loader/entries/*.conf`, uapi-group.org BLS, Type #1) is `key value` lines; its `options` lines
  together are the command line.
- modprobe.d(5) (kmod): `options MODULE PARAM=VALUE ...` lines, `\\` continues a line, `#` starts a comment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Characters that end an unquoted shell word.
WORD_END = " \t\n;&|<>()"
# What makes a value impossible to evaluate here without running a shell.
UNMODELLED = ("`", "$(")


def decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="surrogateescape")


def encode(text: str) -> bytes:
    return text.encode("utf-8", errors="surrogateescape")


@dataclass(frozen=True)
class Assignment:
    name: str
    start: int  # offset of the value's first character (just after `=`)
    end: int  # offset just after the value
    raw: str  # the value as written (quotes included)


@dataclass(frozen=True)
class ShellFile:
    assignments: tuple[Assignment, ...]
    commands: tuple[str, ...]  # first words of statements that are not plain assignments (`if`, `.`, ...)
    error: str = ""  # an unterminated quote: sh itself would refuse the file


def _word_end(text: str, i: int) -> tuple[int, str]:
    """The end of the shell word starting at i (quotes and escapes followed); an error for an open quote."""
    n = len(text)
    while i < n and text[i] not in WORD_END:
        ch = text[i]
        if ch == "\\":
            i += 2
        elif ch == "'":
            close = text.find("'", i + 1)
            if close < 0:
                return n, "unterminated single quote"
            i = close + 1
        elif ch == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            if i >= n:
                return n, "unterminated double quote"
            i += 1
        elif ch == "$" and text.startswith("$(", i):
            depth, i = 1, i + 2
            while i < n and depth:
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
        elif ch == "`":
            close = text.find("`", i + 1)
            if close < 0:
                return n, "unterminated backquote"
            i = close + 1
        else:
            i += 1
    return min(i, n), ""


def parse(text: str) -> ShellFile:
    """The statements of a shell file that only assigns variables (what /etc/default/grub is)."""
    found: list[Assignment] = []
    commands: list[str] = []
    i, n = 0, len(text)
    at_statement = True
    while i < n:
        ch = text[i]
        if ch in " \t":
            i += 1
            continue
        if ch in "\n;":
            at_statement, i = True, i + 1
            continue
        if ch == "#":
            eol = text.find("\n", i)
            i = n if eol < 0 else eol
            continue
        end, error = _word_end(text, i)
        if error:
            return ShellFile(tuple(found), tuple(commands), f"{error} at offset {i}")
        if end == i:  # an operator character: not an assignment-only file
            commands.append(ch)
            i += 1
            at_statement = False
            continue
        word = text[i:end]
        match = NAME.match(word)
        if at_statement and word == "export":
            i = end
            continue  # `export NAME=value`: the assignments that follow are still assignments
        if at_statement and match and word[match.end() : match.end() + 1] == "=":
            start = i + match.end() + 1
            found.append(Assignment(match.group(0), start, end, text[start:end]))
            i = end
            continue
        if at_statement:
            commands.append(word[:40])
        at_statement = False
        i = end
    return ShellFile(tuple(found), tuple(commands))


def value_of(raw: str, env: dict[str, str | None]) -> str | None:
    """A value as sh assigns it (no field splitting in an assignment); None when this reader cannot tell."""
    if any(mark in raw for mark in UNMODELLED):
        return None
    out: list[str] = []
    i, n = 0, len(raw)
    quoted = False
    while i < n:
        ch = raw[i]
        if ch == "'" and not quoted:
            close = raw.index("'", i + 1)
            out.append(raw[i + 1 : close])
            i = close + 1
        elif ch == '"':
            quoted, i = not quoted, i + 1
        elif ch == "\\":
            nxt = raw[i + 1 : i + 2]
            if nxt == "\n":
                pass  # a line continuation disappears
            elif quoted and nxt not in ('"', "\\", "$", "`"):
                out.append("\\" + nxt)
            else:
                out.append(nxt)
            i += 2
        elif ch == "$" and re.match(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?[-+]", raw[i:]):
            # ${NAME:+word} ${NAME:-word} (and without the colon): ROCm's amd_cwsr.cfg appends with one
            close = raw.find("}", i)
            if close < 0 or "{" in raw[i + 2 : close]:
                return None
            inner = raw[i + 2 : close]
            named = NAME.match(inner)
            if named is None:
                return None
            name = named.group(0)
            op = inner[len(name) :]
            colon = op.startswith(":")
            sign, word = op[1 if colon else 0], op[2 if colon else 1 :]
            value = env.get(name)
            if name in env and value is None:
                return None
            is_set = name in env and (not colon or bool(value))
            if sign == "+":
                expanded = value_of(word, env) if is_set else ""
            else:
                expanded = value if is_set else value_of(word, env)
            if expanded is None:
                return None
            out.append(expanded)
            i = close + 1
        elif ch == "$":
            match = re.match(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))", raw[i:])
            if match is None:
                if raw[i + 1 : i + 2] and raw[i + 1] in "{0123456789$#?@*!-":
                    return None  # ${NAME:-...}, $1, $$: not modelled
                out.append("$")
                i += 1
                continue
            name = match.group(1) or match.group(2)
            value = env.get(name, "")
            if value is None:
                return None
            out.append(value)
            i += match.end()
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def evaluate(files: list[tuple[str, str]], names: tuple[str, ...]) -> dict[str, tuple[str | None, str]]:
    """Each of `names` after sourcing `files` (path, text) in order: (value or None when unknown, where set).

    A name never assigned is ("", ""), as in sh. A file that is not plain assignments, or a quote left
    open, leaves every name it could touch unknown."""
    env: dict[str, str | None] = {}
    where: dict[str, str] = {}
    for path, text in files:
        shell = parse(text)
        for assignment in shell.assignments:
            env[assignment.name] = value_of(assignment.raw, env)
            where[assignment.name] = path
        if shell.error or shell.commands:
            for name in names:
                if name in env or shell.error:
                    env[name] = None
                    where[name] = path
    return {name: (env.get(name, ""), where.get(name, "")) for name in names}


def quote(value: str) -> str:
    """`value` as one shell word: double quotes, escaping what is special inside them."""
    return '"' + re.sub(r'(["\\$`])', r"\\\1", value) + '"'


def set_value(text: str, assignment: Assignment, value: str) -> str:
    """The file with this assignment's value replaced (every other byte kept). A value in single quotes
    stays in single quotes when it can."""
    if assignment.raw.startswith("'") and assignment.raw.endswith("'") and "'" not in value:
        written = f"'{value}'"
    else:
        written = quote(value)
    return text[: assignment.start] + written + text[assignment.end :]


def append_assignment(text: str, name: str, value: str) -> str:
    sep = "" if not text or text.endswith("\n") else "\n"
    return f"{text}{sep}{name}={quote(value)}\n"


# -- the kernel command line ------------------------------------------------------------------------


def cmdline_words(text: str) -> list[str]:
    """The words of a kernel command line; double quotes group a value with spaces (the kernel's rule)."""
    return [m.group(0) for m in re.finditer(r'(?:"[^"]*"|[^\s"])+', text)]


def param_name(word: str) -> str:
    """`ttm.pages_limit=1` -> `ttm.pages_limit`; dashes and underscores are the same in a parameter name
    (the kernel's parameq)."""
    return word.split("=", 1)[0].replace("-", "_")


def param_value(words: list[str], name: str) -> str | None:
    """The value the last `name=` on the line gives (the last one wins, as the kernel and kmod apply them)."""
    key = name.replace("-", "_")
    found = None
    for word in words:
        if param_name(word) == key:
            found = word.split("=", 1)[1] if "=" in word else ""
    return found


def edit_words(words: list[str], add: tuple[str, ...], remove: tuple[str, ...]) -> list[str]:
    """Remove every parameter named in `remove`; a parameter of `add` already on the line takes the new
    value where its last occurrence stands (earlier ones go); the others are added at the end."""
    gone = {param_name(r) for r in remove}
    out = [w for w in words if param_name(w) not in gone]
    for word in add:
        name = param_name(word)
        places = [i for i, w in enumerate(out) if param_name(w) == name]
        if not places:
            out.append(word)
            continue
        out[places[-1]] = word
        out = [w for i, w in enumerate(out) if i not in places[:-1]]
    return out


def edit_line(line: str, add: tuple[str, ...], remove: tuple[str, ...]) -> str:
    """A command line with the edit, keeping the user's spacing when nothing of theirs goes."""
    words = cmdline_words(line)
    edited = edit_words(words, add, remove)
    if edited == words:
        return line
    if edited[: len(words)] == words:
        body = line.rstrip()
        extra = " ".join(edited[len(words) :])
        return f"{body} {extra}" if body else extra
    return " ".join(edited)


# -- BLS entries and kernel-install -------------------------------------------------------------------


def bls_options(text: str) -> str:
    """An entry's command line: its `options` lines joined (BLS: "may appear more than once")."""
    parts = [
        ln.strip()[len("options") :].strip()
        for ln in text.splitlines()
        if ln.strip().split()[:1] == ["options"]
    ]
    return " ".join(p for p in parts if p)


def bls_edit(text: str, add: tuple[str, ...], remove: tuple[str, ...]) -> str:
    """The entry with its command line edited: each `options` line loses what is removed; what is added
    goes on the last one (or a new `options` line). Other lines stay byte for byte."""
    lines = text.splitlines(keepends=True)
    option_rows = [i for i, ln in enumerate(lines) if ln.strip().split()[:1] == ["options"]]
    present = cmdline_words(bls_options(text))
    missing = tuple(a for a in add if a not in present)
    replaced = {param_name(a) for a in missing}
    for i in option_rows:
        line = lines[i]
        ending = line[len(line.rstrip("\r\n")) :]
        body = line.rstrip("\r\n")
        head, _, rest = body.partition("options")
        edited = edit_line(rest.strip(), (), (*remove, *replaced))
        edited = edit_line(edited, missing, ()) if i == option_rows[-1] else edited
        lines[i] = f"{head}options {edited}{ending}" if edited != rest.strip() else line
    if missing and not option_rows:
        sep = "" if not text or text.endswith("\n") else "\n"
        return f"{text}{sep}options {' '.join(missing)}\n"
    return "".join(lines)


def kernel_cmdline_file(text: str) -> str:
    """kernel-install's /etc/kernel/cmdline: its lines joined by spaces, `#` lines left out (kernel-install
    reads it with `read -r -d ''` and drops comment lines in systemd >= 251)."""
    return " ".join(ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))


# -- modprobe.d -----------------------------------------------------------------------------------


def module_name(name: str) -> str:
    """kmod treats dashes and underscores in module names as the same (modprobe.d(5))."""
    return name.replace("-", "_")


def modprobe_options(text: str, module: str) -> list[str]:
    """The `options` words for `module` in one modprobe.d file, in order (continuations joined)."""
    joined = re.sub(r"\\\n", " ", text)
    found: list[str] = []
    for line in joined.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) >= 2 and words[0] == "options" and module_name(words[1]) == module_name(module):
            found.extend(words[2:])
    return found


GRUB_VARS = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")


def grub_edit(
    files: list[tuple[str, str]], add: tuple[str, ...], remove: tuple[str, ...]
) -> tuple[dict[str, str], str]:
    """The GRUB files (path, text; /etc/default/grub first, then grub.d in the order sourced) with the
    command line edited where grub-mkconfig reads it: each variable's last assignment. Added parameters go
    on GRUB_CMDLINE_LINUX_DEFAULT (an earlier value of theirs leaves GRUB_CMDLINE_LINUX); removed ones leave
    both. Returns ({path: new text} for the files that change, "") or ({}, why it cannot be done)."""
    texts = dict(files)
    order = [path for path, _ in files]
    for path in order:
        shell = parse(texts[path])
        if shell.error:
            return (
                {},
                f"{path} is not valid shell ({shell.error}): update-grub would fail on it; fix it first",
            )
    first = evaluate(files, GRUB_VARS)
    line = cmdline_words(" ".join(v or "" for v, _ in first.values()))
    add = tuple(
        a for a in add if param_value(line, param_name(a)) != (a.split("=", 1)[1] if "=" in a else "")
    )
    for var in GRUB_VARS:
        value, where = evaluate([(p, texts[p]) for p in order], GRUB_VARS)[var]
        adding = add if var == "GRUB_CMDLINE_LINUX_DEFAULT" else ()
        dropping = remove if adding else (*remove, *(param_name(a) for a in add))
        if value is None:
            return {}, (
                f"{var} in {where} is set by shell this reader does not evaluate (a command or an expansion): "
                "edit it by hand"
            )
        edited = edit_line(value, adding, dropping)
        if edited == value:
            continue
        if not where:
            texts[order[0]] = append_assignment(texts[order[0]], var, edited)
            continue
        last = [a for a in parse(texts[where]).assignments if a.name == var][-1]
        texts[where] = set_value(texts[where], last, edited)
    return {p: texts[p] for p in order if texts[p] != dict(files)[p]}, ""
