"""The host's shared libraries as its dynamic loader finds them (ld.so(8), "Rules for determining a
shared object's location"): after the loading object's DT_RPATH and the environment's LD_LIBRARY_PATH
(both the qualification's resolver's to walk, since they may name the bundle's own directories) and
its DT_RUNPATH, the loader asks `/etc/ld.so.cache` and then its trusted default directories.

The cache is read as glibc writes it (elf/dl-cache.h, `struct cache_file_new`, "glibc-ld.so.cache"
"1.1"; the string offsets count from that header, elf/dl-cache.c `_dl_cache_verify_ptr`), bounded and
checked field by field: a damaged or hostile cache is a DocumentError naming the file (exit 2), never
a read past its end. A root without a cache gives what `ldconfig` would write from `/etc/ld.so.conf`
(its `include` globs expanded inside the root) and says so. Every path is resolved inside the root by
rootfs.resolve_inside (a bounded hop walk, as a chroot would): no `os.path.realpath`, no link left
for the open to follow.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from rocmdoctor.archive.elf_scan import ElfFacts, qualification_data, scan_elf
from rocmdoctor.documents import DocumentError
from rocmdoctor.rootfs import read_regular, resolve_inside

CACHE = "/etc/ld.so.cache"
CONF = "/etc/ld.so.conf"
CACHE_LIMIT = 16 << 20  # a distribution's cache is tens of KiB (34 KiB for 539 entries on Debian 12)
CONF_LIMIT = 1 << 20
MAX_INCLUDE_DEPTH = 8
MAX_CONF_DIRS = 4096
MAX_NAME = 4096  # PATH_MAX: a longer string in the cache is not a path
MAGIC = b"glibc-ld.so.cache1.1"
OLD_MAGIC = b"ld.so-1.7.0"
# magic and version, nlibs, len_strings, flags, padding, extension_offset, unused[3]
HEADER = struct.Struct("<20sIIB3sI12x")
ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion_unused, hwcap
# sysdeps/generic/ldconfig.h: FLAG_ELF_LIBC6 | FLAG_X8664_LIB64, what a 64-bit x86 process may load
X86_64_LIBC6 = 0x0303
EM_X86_64 = 62


@dataclass
class HostLibrary:
    """A library of the host: the path the loader names (`path`), the file it is (`facts`, whose path
    is relative to the root, links resolved) and how the loader finds it (`how`)."""

    name: str
    path: str
    how: str
    facts: ElfFacts


def parse_cache(data: bytes, source: str = CACHE) -> dict[str, str]:
    """soname -> path of every x86-64 glibc entry of a new-format cache (the first for each name,
    glibc-hwcaps variants aside: the loader prefers those only on CPUs that have them)."""
    if data.startswith(OLD_MAGIC):
        raise DocumentError(source, "the old ld.so-1.7.0 cache format; run `ldconfig` (glibc 2.32 or later)")
    if len(data) < HEADER.size or not data.startswith(MAGIC):
        raise DocumentError(source, "not a glibc-ld.so.cache1.1 file (run `ldconfig` to rebuild it)")
    _, count, strings, _, _, _ = HEADER.unpack_from(data, 0)
    if count > (len(data) - HEADER.size) // ENTRY.size:
        raise DocumentError(source, f"it claims {count} entries, more than its {len(data)} bytes hold")
    found: dict[str, str] = {}
    for index in range(count):
        flags, key, value, _, hwcap = ENTRY.unpack_from(data, HEADER.size + index * ENTRY.size)
        name, path = _string(data, key, source, index), _string(data, value, source, index)
        if flags == X86_64_LIBC6 and hwcap == 0 and name not in found and path.startswith("/"):
            found[name] = path
    return found


def _string(data: bytes, offset: int, source: str, index: int) -> str:
    end = data.find(b"\0", offset, offset + MAX_NAME + 1) if offset < len(data) else -1
    if end < 0:
        raise DocumentError(source, f"entry {index} points at offset {offset}, outside its strings")
    try:
        return data[offset:end].decode()
    except UnicodeDecodeError:
        raise DocumentError(source, f"entry {index} holds a name that is not UTF-8") from None


def _inside(root: str, path: str) -> str | None:
    """The file `path` names under `root` (links resolved inside it), as a path relative to root."""
    resolved = resolve_inside(root, path)
    if resolved is None:
        return None
    return posixpath.relpath(resolved, root.rstrip("/") or "/")


def _list_dir(root: str, directory: str) -> list[str]:
    where = resolve_inside(root, directory)
    try:
        return sorted(os.listdir(where)) if where else []
    except OSError:
        return []


def conf_directories(root: str, conf: str = CONF, depth: int = 0) -> list[str]:
    """The directories ldconfig reads from `conf` (elf/ldconfig.c parse_conf: `include GLOB`, relative
    to the file's directory; `hwcap` lines ignored; `#` comments), in order, each once."""
    if depth > MAX_INCLUDE_DEPTH:
        raise DocumentError(conf, f"includes nest more than {MAX_INCLUDE_DEPTH} deep (an include loop?)")
    where = resolve_inside(root, conf)
    try:
        text = read_regular(where, CONF_LIMIT).decode(errors="replace") if where else ""
    except OSError:
        return []
    out: list[str] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("hwcap "):
            continue
        if line.startswith("include") and line[7:8] in (" ", "\t"):
            for pattern in line[8:].split():
                pattern = posixpath.join(posixpath.dirname(conf), pattern)
                parent, glob = posixpath.split(pattern)
                for name in _list_dir(root, parent):
                    if fnmatch.fnmatchcase(name, glob):
                        out.extend(conf_directories(root, posixpath.join(parent, name), depth + 1))
        else:
            out.append(line.split("=", 1)[0].rstrip("/") or "/")
        if len(out) > MAX_CONF_DIRS:
            raise DocumentError(conf, f"names more than {MAX_CONF_DIRS} directories")
    return list(dict.fromkeys(out))


@dataclass
class HostLibraries:
    """The loader's view of the host at `root` for names no RPATH, LD_LIBRARY_PATH of the bundle or
    RUNPATH resolves: `/etc/ld.so.cache` (or, without one, the ld.so.conf it would be built from),
    then the default directories (bundles/qualification.toml [loader])."""

    root: Path = Path("/")
    _cache: dict[str, str] | None = field(default=None, init=False, repr=False)
    _conf: list[str] | None = field(default=None, init=False, repr=False)
    _found: dict[str, HostLibrary | None] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        root = str(self.root)
        where = resolve_inside(root, CACHE)
        try:
            data = read_regular(where, CACHE_LIMIT) if where else None
        except FileNotFoundError:
            data = None
        except OSError as exc:
            raise DocumentError(CACHE, f"cannot be read ({exc.strerror or exc})") from None
        if data is not None:
            try:
                self._cache = parse_cache(data)
            except DocumentError as exc:
                raise DocumentError(CACHE, f"{exc.why}; as root, `ldconfig` writes it anew") from None
        else:
            self._conf = conf_directories(root)

    @property
    def source(self) -> str:
        """What answered for the host (said in the record)."""
        if self._cache is not None:
            return f"{CACHE} ({len(self._cache)} x86-64 libraries)"
        return f"no {CACHE}: the directories of {CONF}, as ldconfig would build the cache from them"

    def default_directories(self) -> list[str]:
        return list(qualification_data().get("loader", {}).get("default_directories", []))

    def searched(self) -> str:
        return ", ".join([CACHE if self._cache is not None else CONF, *self.default_directories()])

    def in_directory(self, directory: str, name: str, how: str) -> HostLibrary | None:
        """`name` in a host directory when it is a 64-bit x86 ELF file (the loader skips others)."""
        path = posixpath.join(directory, name)
        rel = _inside(str(self.root), path)
        if rel is None or rel.startswith(".."):
            return None
        full = os.path.join(str(self.root), rel)
        try:
            info = os.lstat(full)
            if not stat.S_ISREG(info.st_mode) or not _x86_64(full):
                return None
        except OSError:
            return None
        facts = scan_elf(str(self.root), rel)
        if facts.error is not None:
            return None
        return HostLibrary(name, path, how, facts)

    def find(self, name: str) -> HostLibrary | None:
        """The library the loader maps for DT_NEEDED `name` from the host; None: it finds none."""
        if "/" in name:
            return None
        if name not in self._found:
            self._found[name] = self._find(name)
        return self._found[name]

    def _find(self, name: str) -> HostLibrary | None:
        if self._cache is not None:
            path = self._cache.get(name)
            hit = self.in_directory(posixpath.dirname(path), name, "ld.so.cache") if path else None
            if hit is not None:
                return hit
        for directory in self._conf or []:
            hit = self.in_directory(directory, name, f"ld.so.conf ({directory})")
            if hit is not None:
                return hit
        for directory in self.default_directories():
            hit = self.in_directory(directory, name, "default directory")
            if hit is not None:
                return hit
        return None


def _x86_64(path: str) -> bool:
    """ELFCLASS64, little-endian, e_machine EM_X86_64: what a 64-bit x86 process can map."""
    with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW | os.O_NONBLOCK)) as fh:
        head = fh.read(20)
    return len(head) == 20 and head[:4] == b"\x7fELF" and head[4:6] == b"\x02\x01" and head[18] == EM_X86_64


def package_for(name: str) -> str:
    """Which package provides `name` on Debian/Ubuntu and Fedora (bundles/qualification.toml
    [host_library_packages], each with its source); "" when the data does not know."""
    known = qualification_data().get("host_library_packages", {}).get(name)
    if not isinstance(known, dict):
        return ""
    said = [f"{known[d]} ({d})" for d in ("debian", "ubuntu", "fedora") if isinstance(known.get(d), str)]
    return "; install " + " / ".join(said) if said else ""


_THIS_HOST: list[HostLibraries] = []


def system_library(name: str, allowed_only: bool = True) -> ElfFacts | None:
    """This host's copy of `name` as its loader finds it (HostLibraries at /); with `allowed_only`, only
    a library of the manylinux allowlist (bundles/qualification.toml [system_libraries])."""
    if allowed_only and name not in qualification_data().get("system_libraries", {}).get("names", []):
        return None
    if not _THIS_HOST:
        _THIS_HOST.append(HostLibraries())
    found = _THIS_HOST[0].find(name)
    return found.facts if found else None
