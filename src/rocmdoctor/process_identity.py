"""Whether a process is a vLLM server, judged by its identity, never by a substring of its command line.

Every part comes from the kernel's own record of the process (/proc/PID, read through the read seam
`Host`, so a captured root is judged by the same rule):

- its executable (/proc/PID/exe: the file the kernel runs) is a Python interpreter, and the
  interpreter's command line, parsed as Python parses its own options, runs a module of
  `vllm.entrypoints` (`python -m vllm.entrypoints.openai.api_server`) or vLLM's console script (how
  the kernel runs `vllm serve`: `bin/python3 bin/vllm serve`, the script being pip's generated
  `from vllm.entrypoints.cli.main import main`, read from the file itself);
- or it is a Python interpreter titled `VLLM::...` by setproctitle (EngineCore, Worker) and either a
  descendant of such an interpreter, or in the control group of a vLLM unit rocmdoctor writes, or with
  vLLM's own compiled extension (`vllm/_C*.so`) mapped (/proc/PID/maps): an EngineCore whose API server
  was SIGKILLed has PID 1 as its parent and keeps the GPU's memory (vllm#55510), and the code it runs
  is the only thing that still says what it is. A title alone (`exec -a VLLM::EngineCore sleep`) is not;
- its user (real uid) and its start time (/proc/PID/stat field 22, clock ticks since boot) pin it: a PID
  that names another process later has another start time, and host_processes signals only through a
  pidfd held from the judgement on.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass

from rocmdoctor.host import Host
from rocmdoctor.textnum import is_decimal

PROC_READS = (
    "/proc/[0-9]*/exe",
    "/proc/[0-9]*/cmdline",
    "/proc/[0-9]*/stat",
    "/proc/[0-9]*/status",
    "/proc/[0-9]*/cgroup",
    "/proc/[0-9]*/cwd",
    "/proc/[0-9]*/maps",
)
# CPython's executables: python, python3, python3.12, python3.13t (free-threaded), python3.12d (debug).
PYTHON_EXE = re.compile(r"python(\d+(\.\d+)?[dt]?)?")
# Options of CPython's command line that take the next word as their value (python(1)).
PYTHON_VALUE_OPTIONS = frozenset("WX")
PYTHON_LONG_VALUE_OPTIONS = frozenset({"--check-hash-based-pycs"})
ENTRY_PACKAGE = ("vllm", "entrypoints")
# pip's generated console script for vLLM's `vllm` entry point (vllm's pyproject: vllm.entrypoints.cli.main:main).
CONSOLE_IMPORT = re.compile(r"from vllm\.entrypoints(\.\w+)+ import main")
TITLE_PREFIX = "VLLM::"
# The units rocmdoctor writes whose control group holds a vLLM server (unit.py, instances, cluster).
UNIT_NAME = re.compile(r"vllm(@[^/]+|-head|-worker)?\.service")
DELETED = " (deleted)"
SCRIPT_LIMIT = 4096
MAPS_LIMIT = 8 * 1024 * 1024
ENVIRON_LIMIT = 256 * 1024


@dataclass(frozen=True)
class ProcessFacts:
    """What the kernel says about one process (fields it could not read are empty)."""

    pid: int
    exe: str  # /proc/PID/exe's text, " (deleted)" removed
    argv: tuple[str, ...]
    ppid: int | None
    uid: int | None
    start: int | None  # clock ticks after boot
    cgroup: tuple[str, ...]  # the paths of /proc/PID/cgroup
    title: str  # argv[0] as setproctitle leaves it

    @property
    def python(self) -> bool:
        return bool(self.exe) and PYTHON_EXE.fullmatch(posixpath.basename(self.exe)) is not None

    @property
    def unit(self) -> str | None:
        """The vLLM unit whose control group holds it (the group's own name or a parent's)."""
        for path in self.cgroup:
            for part in path.split("/"):
                if UNIT_NAME.fullmatch(part):
                    return part
        return None

    def label(self) -> str:
        name = (
            self.title.split(" ")[0] if self.title.startswith(TITLE_PREFIX) else posixpath.basename(self.exe)
        )
        return f"{self.pid} ({name or '?'})"


def _argv(host: Host, pid: int) -> tuple[str, ...]:
    raw = host.read_text(f"/proc/{pid}/cmdline", limit=65536)
    if not raw.ok:
        return ()
    return tuple(raw.value.rstrip("\x00").split("\x00"))


def _stat(host: Host, pid: int) -> tuple[int | None, int | None]:
    """(ppid, start time) from /proc/PID/stat; the command name in parentheses may hold anything, so
    the fields are counted after its last ')'."""
    raw = host.read_text(f"/proc/{pid}/stat", limit=4096)
    if not raw.ok or ")" not in raw.value:
        return None, None
    fields = raw.value.rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): ppid is field 4, starttime field 22.
    ppid = int(fields[1]) if len(fields) > 1 and is_decimal(fields[1]) else None
    start = int(fields[19]) if len(fields) > 19 and is_decimal(fields[19]) else None
    return ppid, start


def _uid(host: Host, pid: int) -> int | None:
    raw = host.read_text(f"/proc/{pid}/status", limit=16384)
    if not raw.ok:
        return None
    for line in raw.value.splitlines():
        if line.startswith("Uid:"):
            words = line[4:].split()
            return int(words[0]) if words and is_decimal(words[0]) else None
    return None


def read_facts(host: Host, pid: int) -> ProcessFacts | None:
    """The process's facts, or None when it is gone (or this user cannot see it at all)."""
    ppid, start = _stat(host, pid)
    argv = _argv(host, pid)
    if start is None and not argv:
        return None
    exe = host.readlink(f"/proc/{pid}/exe")
    cgroup = host.read_text(f"/proc/{pid}/cgroup", limit=16384)
    paths = (
        tuple(line.split(":", 2)[2] for line in cgroup.value.splitlines() if line.count(":") >= 2)
        if cgroup.ok
        else ()
    )
    exe_text = exe.value.removesuffix(DELETED) if exe.ok else ""
    return ProcessFacts(pid, exe_text, argv, ppid, _uid(host, pid), start, paths, argv[0] if argv else "")


def python_entry(argv: tuple[str, ...]) -> tuple[str, str] | None:
    """What a Python interpreter's command line runs, parsed as CPython parses it: ("module", NAME),
    ("command", CODE), ("script", PATH) or ("stdin", "-"); None for an interactive interpreter."""
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if word == "-" or not word.startswith("-"):
            break
        if word.startswith("--"):
            i += 2 if word in PYTHON_LONG_VALUE_OPTIONS else 1
            continue
        for j in range(1, len(word)):
            letter = word[j]
            if letter in "cm":
                value = word[j + 1 :] or (argv[i + 1] if i + 1 < len(argv) else "")
                return ("module" if letter == "m" else "command", value)
            if letter in PYTHON_VALUE_OPTIONS:
                i += 0 if word[j + 1 :] else 1
                break
        i += 1
    if i >= len(argv):
        return None
    return ("stdin", "-") if argv[i] == "-" else ("script", argv[i])


def _console_script(host: Host, facts: ProcessFacts, path: str) -> bool:
    """`path` is vLLM's console script: named `vllm`, and the file says it runs vLLM's entry point."""
    if posixpath.basename(path) != "vllm":
        return False
    if not path.startswith("/"):
        cwd = host.readlink(f"/proc/{facts.pid}/cwd")
        if not cwd.ok or not cwd.value.startswith("/"):
            return False
        path = posixpath.join(cwd.value, path)
    text = host.read_text(path, limit=SCRIPT_LIMIT)
    return text.ok and any(CONSOLE_IMPORT.fullmatch(line.strip()) for line in text.value.splitlines())


def entry_point(host: Host, facts: ProcessFacts) -> str | None:
    """Why this process is a vLLM server's interpreter (None when it is not)."""
    if not facts.python:
        return None
    entry = python_entry(facts.argv)
    if entry is None:
        return None
    kind, value = entry
    if kind == "module" and tuple(value.split(".")[:2]) == ENTRY_PACKAGE:
        return f"{posixpath.basename(facts.exe)} -m {value}"
    if kind == "script" and _console_script(host, facts, value):
        return f"{posixpath.basename(facts.exe)} running vLLM's console script {value}"
    return None


def _maps_vllm_extension(host: Host, pid: int) -> str | None:
    raw = host.read_text(f"/proc/{pid}/maps", limit=MAPS_LIMIT)
    if not raw.ok:
        return None
    for line in raw.value.splitlines():
        words = line.split(None, 5)
        if len(words) < 6:
            continue
        path = words[5].removesuffix(DELETED)
        directory, name = posixpath.split(path)
        if posixpath.basename(directory) == "vllm" and name.startswith("_C") and name.endswith(".so"):
            return path
    return None


def vllm_reason(host: Host, facts: ProcessFacts, table: Mapping[int, ProcessFacts]) -> str | None:
    """Why `facts` names a vLLM server process (None when its identity does not say so). `table`: the
    facts of the other processes, for the parent chain."""
    entry = entry_point(host, facts)
    if entry is not None:
        return entry
    if not facts.python or not facts.title.startswith(TITLE_PREFIX):
        return None
    title = facts.title.split(" ")[0]
    unit = facts.unit
    if unit is not None:
        return f"{title} in {unit}'s control group"
    seen = {facts.pid}
    parent = table.get(facts.ppid) if facts.ppid is not None else None
    while parent is not None and parent.pid not in seen and parent.pid > 1:
        seen.add(parent.pid)
        if entry_point(host, parent) is not None:
            return f"{title} under {parent.label()}"
        parent = table.get(parent.ppid) if parent.ppid is not None else None
    mapped = _maps_vllm_extension(host, facts.pid)
    if mapped is not None:
        return f"{title} with vLLM's extension {mapped} loaded"
    return None


def process_table(host: Host, skip: frozenset[int] = frozenset()) -> dict[int, ProcessFacts]:
    """The facts of every process this user can see (but those in `skip`)."""
    table = {}
    own = os.getpid() if host.is_live else None
    for pid in host.pids():
        if pid in skip or pid == own:
            continue
        facts = read_facts(host, pid)
        if facts is not None:
            table[pid] = facts
    return table


def _under(path: str, roots: tuple[str, ...]) -> str | None:
    """The root of `roots` that `path` is (or is inside), by whole components."""
    for root in roots:
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return root
    return None


def processes_using(
    host: Host, trees: Mapping[str, tuple[str, ...]], variables: tuple[str, ...]
) -> dict[str, list[str]]:
    """Which live processes use each tree: tree name -> labels of processes with a file of it open or
    mapped, their working directory in it, or one of `variables` in their environment naming it.
    `trees` gives each tree's paths (as written, and as the kernel names it)."""
    used: dict[str, list[str]] = {}
    own = os.getpid() if host.is_live else None
    for pid in host.pids():
        if pid == own:
            continue
        found: set[str] = set()
        paths: list[str] = []
        cwd = host.readlink(f"/proc/{pid}/cwd")
        if cwd.ok:
            paths.append(cwd.value)
        for fd in host.listdir(f"/proc/{pid}/fd"):
            target = host.readlink(f"/proc/{pid}/fd/{fd}")
            if target.ok and target.value.startswith("/"):
                paths.append(target.value.removesuffix(DELETED))
        maps = host.read_text(f"/proc/{pid}/maps", limit=MAPS_LIMIT)
        if maps.ok:
            paths += [
                w[5].removesuffix(DELETED)
                for w in (ln.split(None, 5) for ln in maps.value.splitlines())
                if len(w) == 6
            ]
        environ = host.read_text(f"/proc/{pid}/environ", limit=ENVIRON_LIMIT)
        if environ.ok:
            for entry in environ.value.split("\x00"):
                name, _, value = entry.partition("=")
                if name in variables:
                    paths.append(value)
        for tree, roots in trees.items():
            if any(_under(path, roots) for path in paths):
                found.add(tree)
        if found:
            facts = read_facts(host, pid)
            label = facts.label() if facts is not None else str(pid)
            for tree in found:
                used.setdefault(tree, []).append(label)
    return used
