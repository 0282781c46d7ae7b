"""Commands are thin and typed (issue 33): no click command function over 60 lines (logic goes down to
provision/ or facts/, rendering beside it), and no `**opts: Any` in commands/: no command takes `**`
and no helper takes `**opts` (options reach a command as typed parameters or one frozen option group:
`option_groups.option_group`, `server_options.server_group`).

ALLOWED lists what remains, each with its reason; a new one fails, and so does an entry that no longer
matches (remove it), so the list can only shrink."""

from __future__ import annotations

import ast

from conftest import REPO

COMMANDS = REPO / "src" / "rocmdoctor" / "commands"
MAX_LINES = 60
ALLOWED_LONG: dict[tuple[str, str], str] = {}


def _is_command(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A click command or group function (decorated with `.command(...)`/`.group(...)`)."""
    return any(".command" in ast.unparse(d) or ".group" in ast.unparse(d) for d in node.decorator_list)


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def long_commands(source: str, name: str) -> dict[tuple[str, str], int]:
    """Command functions of `source` over MAX_LINES lines (signature, docstring and body)."""
    found = {}
    for node in _functions(ast.parse(source)):
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if _is_command(node) and length > MAX_LINES:
            found[(name, node.name)] = length
    return found


def options_dicts(source: str, name: str) -> set[tuple[str, str]]:
    """Click command functions of `source` that take `**anything`, and any function taking `**opts`:
    options handed over as a dict instead of typed parameters or one option group."""
    found = set()
    for node in _functions(ast.parse(source)):
        kwarg = node.args.kwarg
        if kwarg is not None and (_is_command(node) or kwarg.arg in ("opts", "options")):
            found.add((name, f"{node.name}(**{kwarg.arg})"))
    return found


def _scan(scanner):
    found: dict = {}
    for path in sorted(COMMANDS.glob("*.py")):
        result = scanner(path.read_text(encoding="utf-8"), path.name)
        found.update(result if isinstance(result, dict) else dict.fromkeys(result))
    return found


def test_no_command_function_is_over_60_lines():
    found = _scan(long_commands)
    new = {k: n for k, n in found.items() if k not in ALLOWED_LONG}
    assert not new, f"move logic down (provision/, facts/) and rendering beside it: {new}"
    gone = set(ALLOWED_LONG) - set(found)
    assert not gone, f"no longer over {MAX_LINES} lines: remove from ALLOWED_LONG {sorted(gone)}"


def test_no_command_takes_its_options_as_a_dict():
    found = set(_scan(options_dicts))
    assert not found, (
        f"take typed parameters or an option group (option_groups, server_group): {sorted(found)}"
    )


def test_the_scans_see_what_they_forbid():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    sample = f"@cli.command()\ndef long_one(**opts: Any):\n{body}\n\ndef helper(**opts):\n{body}\n"
    assert long_commands(sample, "s.py") == {("s.py", "long_one"): MAX_LINES + 1}  # helpers may be long
    assert options_dicts(sample, "s.py") == {("s.py", "long_one(**opts)"), ("s.py", "helper(**opts)")}
    assert not options_dicts("def emit(event, **data: Any):\n    pass\n", "s.py")  # an event's JSON fields


# Command modules (a module of commands/ that declares a click command) import no other command module:
# what two commands share lives in a helper module (common, server_setup, instances_setup, bundle_setup,
# smoke_options, check_context, model_input, ...) or below commands/. The one import left registers two
# commands under a group; the others are in modules of other helpers this round, to move the same way.
COMMAND_IMPORTS_ALLOWED: dict[tuple[str, str], str] = {
    ("bundle", "install"): "`bundle install|rollback`: the group registers the two commands (the one import)",
}


def command_imports() -> set[tuple[str, str]]:
    trees = {p.stem: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(COMMANDS.glob("*.py"))}
    commands = {name for name, tree in trees.items() if any(_is_command(n) for n in _functions(tree))}
    found = set()
    for name in commands:
        for node in ast.walk(trees[name]):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rocmdoctor.commands."):
                other = (node.module or "").split(".")[2]
                if other in commands and other != name:
                    found.add((name, other))
    return found


def test_command_modules_do_not_import_each_other():
    found = command_imports()
    assert not found - set(COMMAND_IMPORTS_ALLOWED), (
        f"move what both use into a helper module or below commands/: {sorted(found - set(COMMAND_IMPORTS_ALLOWED))}"
    )
    assert not set(COMMAND_IMPORTS_ALLOWED) - found, (
        f"gone: remove {sorted(set(COMMAND_IMPORTS_ALLOWED) - found)}"
    )
    mine = [k for k, why in COMMAND_IMPORTS_ALLOWED.items() if "helper's module" not in why]
    assert len(mine) <= 1, "at most one import from a command module into another"
