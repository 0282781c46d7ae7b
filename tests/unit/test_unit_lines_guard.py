"""Only the one unit writer renders systemd unit lines (issue 35: "outside the one unit writer renders a
systemd line"). Every foreign value that reaches a unit goes through `provision/server/unit_syntax.py`
(quoting, `%`/`$` escaping, no control characters, no line added); a module that builds a unit's text
itself (a string holding a section header or a `Directive=` line, or an f-string that starts one)
would bypass it, which is how `cluster unit --socket-ifname` once wrote an extra `ExecStartPre=`.

Reading a unit (`line.startswith("ExecStart=")`, a regex over a written unit) is not rendering: a
constant that is only a directive's name with its `=` and nothing after it, or a regex, is not flagged.
"""

from __future__ import annotations

import ast
import re

from conftest import REPO

WRITER = "provision/server/unit_syntax.py"
# What remains, with its reason: a new piece of unit text fails, and so does an entry that no longer
# matches (remove it), so the list can only shrink.
ALLOWED: dict[str, tuple[int, str]] = {}
SECTION = re.compile(r"^\[(Unit|Service|Install|Timer|Socket|Path|Slice)\]$", re.M)
# Directives rocmdoctor's units use, and those that change what runs or with which privileges.
DIRECTIVE = re.compile(
    r"^(Exec(Start|StartPre|StartPost|Stop|StopPost|Reload|Condition)|Environment|EnvironmentFile|User|Group"
    r"|SupplementaryGroups|WorkingDirectory|RootDirectory|Ambient\w+|Capability\w+|Read\w*Paths|Bind\w*Paths"
    r"|LD_PRELOAD|PrivateTmp|ProtectSystem|ProtectHome|NoNewPrivileges|SystemCallFilter|IPAddress(Allow|Deny)"
    r"|Restart|Description|After|Wants|Requires|WantedBy|OnCalendar|OnUnitActiveSec|Unit)=",
    re.M,
)


def _sources() -> list[str]:
    paths = [
        *REPO.glob("src/rocmdoctor/**/*.py"),
        *REPO.glob("checks/**/*.py"),
        *REPO.glob("provision/**/*.py"),
    ]
    return sorted(str(p.relative_to(REPO)) for p in paths)


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _rendered(value: str, starts_fstring: bool) -> bool:
    """A piece of unit text: a section header, a directive with a value, or (the first piece of an
    f-string) a directive whose value the f-string fills in."""
    if SECTION.search(value):
        return True
    for match in DIRECTIVE.finditer(value):
        rest = value[match.end() :].split("\n", 1)[0]
        if rest or "\n" in value[match.end() :] or starts_fstring:
            return True
    return False


def _regexes(tree: ast.AST) -> set[int]:
    """Constants handed to the re module: patterns that read units, not unit text."""
    found = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "re"
        ):
            for arg in node.args:
                for part in ast.walk(arg):
                    if isinstance(part, ast.Constant):
                        found.add(id(part))
    return found


def unit_lines(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    skip = _docstrings(tree) | _regexes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and id(node) not in skip:
            parts = [p for p in node.values if isinstance(p, ast.Constant) and isinstance(p.value, str)]
            skip.update(id(p) for p in parts)
            text = "".join(p.value for p in parts)
            first = node.values[0] if node.values else None
            starts = isinstance(first, ast.Constant) and isinstance(first.value, str)
            if _rendered(text, starts and DIRECTIVE.match(str(first.value)) is not None):
                found.append((node.lineno, text[:60]))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skip
            and _rendered(node.value, False)
        ):
            found.append((node.lineno, node.value[:60]))
    return found


def test_only_the_unit_writer_renders_unit_lines():
    bypasses, counts = [], {}
    for name in _sources():
        if name == WRITER:
            continue
        found = unit_lines((REPO / name).read_text())
        counts[name] = len(found)
        if len(found) > ALLOWED.get(name, (0, ""))[0]:
            bypasses += [f"{name}:{line}: {text!r}" for line, text in found]
    assert not bypasses, "render unit text through provision/server/unit_syntax.py: " + "; ".join(bypasses)
    stale = {name: (n, counts.get(name, 0)) for name, (n, _) in ALLOWED.items() if counts.get(name, 0) != n}
    assert not stale, f"fewer pieces of unit text than allowed (shrink ALLOWED): {stale}"


def test_the_guard_sees_each_form_of_unit_text():
    assert unit_lines('x = "[Service]\\nUser=vllm\\n"')
    assert unit_lines('x = f"ExecStartPre={cmd}"')
    assert unit_lines('x = "Environment=LD_PRELOAD=/tmp/x.so"')
    assert unit_lines('x = "# a comment\\n" f"Environment={pairs}\\n"')
    # reading a unit is not rendering one
    assert not unit_lines('ok = line.startswith("ExecStart=")')
    assert not unit_lines('pattern = re.compile(r"^ExecStartPost=.*")')
    assert not unit_lines('def f():\n    """Writes ExecStart= and Environment=x lines."""\n')
