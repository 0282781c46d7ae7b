"""Run rocmdoctor commands in this process under an audit hook; write down every file or process event
whose nearest rocmdoctor frame is not a seam module.

    python io_recorder.py OUT.json COMMANDS.json

COMMANDS.json: a list of argv lists (`["install", "--prefix", ...]`) run in order through the real CLI,
or `{"exec": CODE, "as": MODULE}` to run CODE as if it were module MODULE (how the test proves the
recorder catches a violation). OUT.json: {"events": [...], "by_module": {module: count}, "exits": [...]}.
Audit hooks cannot be removed, so the recorder runs only in a process of its own.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter

# Events that touch a file or another process (CPython's audit table), by prefix.
WATCHED = ("open", "os.", "subprocess.", "shutil.", "fcntl.", "tempfile.", "pty.", "signal.")
# os.* events that are not I/O of a file or a process.
IGNORED = {"os.getenv", "os.putenv", "os.unsetenv", "os.system.argv"}


def nearest_rocmdoctor_module() -> str | None:
    """The module of the innermost rocmdoctor frame; None for an import (the import system reads
    source files on behalf of nobody) or an event outside rocmdoctor entirely."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return None
        name = frame.f_globals.get("__name__", "")
        if name == "rocmdoctor" or name.startswith("rocmdoctor."):
            return name
        frame = frame.f_back
    return None


def main(out_path: str, commands_path: str) -> None:
    with open(commands_path) as fh:
        commands = json.load(fh)
    events: list[dict[str, str]] = []
    by_module: Counter[str] = Counter()
    recording = [False]
    local = threading.local()  # per thread: the hook's own work must not re-enter it

    def hook(event: str, args: tuple) -> None:
        if not recording[0] or getattr(local, "busy", False) or not event.startswith(WATCHED):
            return
        if event in IGNORED:
            return
        local.busy = True
        try:
            module = nearest_rocmdoctor_module()
            if module is not None:
                by_module[module] += 1
                if len(events) < 2000:
                    events.append({"event": event, "module": module, "args": repr(args)[:200]})
        finally:
            local.busy = False

    sys.addaudithook(hook)
    from rocmdoctor.cli import cli

    exits = []
    for command in commands:
        recording[0] = True
        try:
            if isinstance(command, dict):
                exec(compile(command["exec"], command["as"], "exec"), {"__name__": command["as"]})
                exits.append(0)
            else:
                cli.main(args=command, prog_name="rocmdoctor", standalone_mode=True)
                exits.append(0)
        except SystemExit as exc:
            exits.append(exc.code if isinstance(exc.code, int) else 1)
        finally:
            recording[0] = False
    with open(out_path, "w") as fh:
        json.dump({"events": events, "by_module": dict(by_module), "exits": exits}, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
