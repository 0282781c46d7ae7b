"""What the ELF files of an extracted bundle need and provide, read without running any of them.

For each ELF file: its type, SONAME, DT_NEEDED, RPATH/RUNPATH, the dynamic symbols it defines (with
their GNU symbol versions) and the undefined, non-weak ones it needs (with the version and the file
the version is needed from), and the GPU code objects it embeds (a `.hip_fatbin` section of clang
offload bundles). Files that are code objects themselves (an AMDGPU ELF, a standalone offload bundle)
are recorded with their GPU targets.

pyelftools reads the ELF structure (headers, section table, dynamic tags, the version sections);
the fixed-size dynamic symbol table itself is decoded in bulk with `struct.iter_unpack` from the
section's bytes, because pyelftools' per-symbol parsing costs about 30 µs a symbol and libtorch's
libraries export hundreds of thousands. Only the headers, the dynamic sections and the offload-bundle
headers are read: a multi-gigabyte library costs a few hundred kilobytes of reads.

The tree is rocmdoctor's own extraction (provisioning's tree, like tar_extract's): read directly.
"""

from __future__ import annotations

import concurrent.futures
import io
import mmap
import os
import stat
import struct
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.enums import ENUM_SH_TYPE_AMD64
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection
from elftools.elf.structs import ELFStructs

ELF_MAGIC = b"\x7fELF"
# clang's offload bundle (clang/docs/ClangOffloadBundler.rst, "Bundled Code Object Layout"): the magic,
# a u64 entry count, then per entry u64 offset, u64 size, u64 id length and the id, all little-endian;
# offsets count from the magic. The compressed form starts with "CCOB" (same document, "Compression").
BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"
EM_AMDGPU = 224
FATBIN_SECTION = ".hip_fatbin"
# Files that are never ELF: not opened at all (a real bundle holds tens of thousands of them).
TEXT_SUFFIXES = frozenset(
    [
        ".py",
        ".pyc",
        ".pyi",
        ".pyx",
        ".pxd",
        ".h",
        ".hpp",
        ".hh",
        ".cuh",
        ".inc",
        ".def",
        ".txt",
        ".md",
        ".rst",
        ".json",
        ".yaml",
        ".yml",
        ".toml",
        ".cfg",
        ".ini",
        ".cmake",
        ".typed",
        ".html",
        ".css",
        ".js",
        ".csv",
        ".pem",
        ".jinja",
        ".j2",
        ".tmpl",
        ".pth",
        ".cpp",
        ".cc",
        ".c",
        ".cu",
        ".hip",
        ".sh",
        ".bat",
        ".in",
        ".mod",
        ".dat",
        ".npz",
        ".pkl",
        ".pt",
        ".safetensors",
        ".gguf",
        ".tar",
        ".gz",
        ".zip",
        ".whl",
        ".jpg",
        ".png",
        ".svg",
        ".ttf",
        ".license",
        ".LICENSE",
    ]
)
MAX_BUNDLE_ENTRIES = 4096
MAX_ENTRY_ID = 4096
SCAN_WINDOW = 1 << 16  # how far past one offload bundle the next one's magic is looked for (padding)
PARALLEL_FROM = 64
MAX_TABLE = 1 << 30  # no dynamic symbol or string table is larger
# Dynamic symbols read per file. The largest real table seen: libtriton.so in the vLLM 0.32 CPU
# environment, 3.3 MB of .dynsym (about 138,000 symbols); a larger count is a hostile or broken file
# (a sparse 1 GiB .dynsym once took qualification to 3.1 GB), recorded as unreadable, never read.
MAX_SYMBOLS = 1 << 22
MAX_NAME = 1 << 16  # a string of a table longer than this is cut (real C++ symbol names: a few KiB)
MAX_VERSIONS = 1 << 16
DT_NULL, DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH = (
    0,
    1,
    14,
    15,
    29,
)  # gABI dynamic tags  # fewer ELF files than this are read in-process


@dataclass
class ElfFacts:
    path: str  # relative to the scanned root
    machine: int
    elf_type: str  # ET_DYN, ET_EXEC, ET_REL
    soname: str | None = None
    needed: list[str] = field(default_factory=list)
    rpath: list[str] = field(default_factory=list)
    runpath: list[str] = field(default_factory=list)
    # name -> versions it is defined under ("" unversioned; a trailing "!" marks a hidden version)
    defined: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # (name, version or "", the library the version is needed from or "")
    undefined: list[tuple[str, str, str]] = field(default_factory=list)
    gpu_targets: list[str] = field(default_factory=list)  # from .hip_fatbin or the file itself
    fatbin: bool = False  # carries a .hip_fatbin section
    compressed_bundles: int = 0  # offload bundles whose targets need zstd to read
    error: str | None = None


@dataclass
class TreeScan:
    root: Path
    elfs: dict[str, ElfFacts]  # relative path -> facts (x86 ELF files and AMDGPU code objects)
    code_objects: dict[str, list[str]]  # standalone code-object files -> their targets
    links: dict[str, str]  # relative symlink path -> its target as written
    files_seen: int = 0
    elf_bytes: int = 0


@lru_cache(maxsize=1)
def qualification_data() -> dict[str, Any]:
    """bundles/qualification.toml: the system-library allowlist and the AMDGPU machine table."""
    text = resources.files("rocmdoctor.bundles").joinpath("qualification.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


@lru_cache(maxsize=1)
def amdgpu_machines() -> dict[int, str]:
    table = qualification_data().get("amdgpu_mach", {})
    return {int(k, 16): v for k, v in table.items() if k.startswith("0x")}


def target_processor(entry_id: str) -> str | None:
    """The GPU of an offload entry id such as `hipv4-amdgcn-amd-amdhsa--gfx1151` or
    `hip-amdgcn-amd-amdhsa-gfx90a:sramecc+:xnack-` (features after ':'); None for a host entry
    (`host-x86_64-unknown-linux-gnu-`)."""
    if "amdgcn" not in entry_id:
        return None
    tail = entry_id.split("amdhsa", 1)[-1] if "amdhsa" in entry_id else entry_id.rsplit("-", 1)[-1]
    return tail.lstrip("-").split(":", 1)[0] or None


def read_bundle_targets(fh: BinaryIO, start: int, limit: int) -> tuple[list[str], int, int]:
    """The targets of the offload bundles laid one after another from `start` (up to `limit`):
    (targets, bundles read, compressed bundles seen). Reads only the headers."""
    targets: list[str] = []
    found = compressed = 0
    pos = start
    while pos < limit:
        fh.seek(pos)
        head = fh.read(32)
        if head.startswith(BUNDLE_MAGIC) and len(head) >= 32:
            (count,) = struct.unpack_from("<Q", head, 24)
            if count > MAX_BUNDLE_ENTRIES:
                break
            end = 32
            for _ in range(count):
                fields = fh.read(24)
                if len(fields) < 24:
                    return targets, found, compressed
                offset, size, id_len = struct.unpack("<QQQ", fields)
                if id_len > MAX_ENTRY_ID:
                    return targets, found, compressed
                entry = fh.read(id_len).decode("ascii", "replace")
                gpu = target_processor(entry)
                if gpu:
                    targets.append(gpu)
                end = max(end, offset + size)
            found += 1
            pos += max(end, 32)
        elif head.startswith(COMPRESSED_MAGIC) and len(head) >= 16:
            # version 2+ carries the total size (u32 at 8 for v2, u64 for v3) so the walk can go on
            version, _method = struct.unpack_from("<HH", head, 4)
            compressed += 1
            found += 1
            if version == 2:
                (total,) = struct.unpack_from("<I", head, 8)
            elif version >= 3:
                (total,) = struct.unpack_from("<Q", head, 8)
            else:
                break
            pos += max(total, 16)
        else:
            # alignment padding between bundles: look for the next magic a little further on
            fh.seek(pos)
            window = fh.read(min(SCAN_WINDOW, limit - pos))
            hits = [i for i in (window.find(BUNDLE_MAGIC), window.find(COMPRESSED_MAGIC)) if i > 0]
            if not hits:
                break
            pos += min(hits)
    return targets, found, compressed


def _strings(table: memoryview, offset: int) -> str:
    """The NUL-terminated string at `offset` of a mapped string table (never past MAX_NAME)."""
    if offset >= len(table):
        return ""
    chunk = bytes(table[offset : offset + MAX_NAME])
    end = chunk.find(b"\0")
    return chunk[: end if end >= 0 else len(chunk)].decode("utf-8", "replace")


def _version_names(sections: _Sections) -> tuple[dict[int, str], dict[int, tuple[str, str]]]:
    """versym index -> defined version name; versym index -> (needed version name, file)."""
    if sections.bulk is not None:
        return _version_names_bulk(sections)
    defs: dict[int, str] = {}
    needs: dict[int, tuple[str, str]] = {}
    for section in sections.of_type("SHT_GNU_verdef", "SHT_GNU_verneed"):
        if isinstance(section, GNUVerDefSection):
            for verdef, auxiliaries in section.iter_versions():
                names = [aux.name for aux in auxiliaries]
                if names and not verdef["vd_flags"] & 1:  # VER_FLG_BASE names the file, not a version
                    defs[verdef["vd_ndx"]] = names[0]
        elif isinstance(section, GNUVerNeedSection):
            for verneed, auxiliaries in section.iter_versions():
                for aux in auxiliaries:
                    needs[aux["vna_other"]] = (aux.name, verneed.name or "")
    return defs, needs


def _version_names_bulk(sections: _Sections) -> tuple[dict[int, str], dict[int, tuple[str, str]]]:
    """The same from an x86-64 file, its Elf64_Verdef/Verdaux and Elf64_Verneed/Vernaux records (the
    GNU symbol versioning layout, linked by their vd_next/vn_next offsets) decoded directly; pyelftools
    parses each record with construct, about a fifth of a small library's cost."""
    defs: dict[int, str] = {}
    needs: dict[int, tuple[str, str]] = {}
    for index in sections.indexes("SHT_GNU_verdef"):
        raw, count = sections.view(index), sections.headers[index]["sh_info"]
        strings = sections.view(sections.headers[index]["sh_link"])
        pos = 0
        for _ in range(min(count, MAX_VERSIONS)):
            if pos + 20 > len(raw):
                break
            _, flags, ndx, aux_count, _, aux, nxt = struct.unpack_from("<HHHHIII", raw, pos)
            if aux_count and not flags & 1 and pos + aux + 8 <= len(raw):  # VER_FLG_BASE: the file
                defs[ndx] = _strings(strings, struct.unpack_from("<I", raw, pos + aux)[0])
            if not nxt:
                break
            pos += nxt
    for index in sections.indexes("SHT_GNU_verneed"):
        raw, count = sections.view(index), sections.headers[index]["sh_info"]
        strings = sections.view(sections.headers[index]["sh_link"])
        pos = 0
        for _ in range(min(count, MAX_VERSIONS)):
            if pos + 16 > len(raw):
                break
            _, aux_count, file_name, aux, nxt = struct.unpack_from("<HHIII", raw, pos)
            library = _strings(strings, file_name)
            at = pos + aux
            for _ in range(min(aux_count, MAX_VERSIONS)):
                if at + 16 > len(raw):
                    break
                _, _, other, name, aux_next = struct.unpack_from("<IHHII", raw, at)
                needs[other] = (_strings(strings, name), library)
                if not aux_next:
                    break
                at += aux_next
            if not nxt:
                break
            pos += nxt
    return defs, needs


def _symbols(elf: ELFFile, facts: ElfFacts, sections: _Sections) -> None:
    """The dynamic symbols, read in place from the file's mapping (no copy of a table is made, and pages
    are touched only where an entry or a name is), at most MAX_SYMBOLS of them."""
    found = sections.indexes("SHT_DYNSYM")
    if not found:
        return
    dynsym = sections.headers[found[0]]
    little = elf.little_endian
    if elf.elfclass == 64:
        fmt, width = ("<" if little else ">") + "IBBHQQ", 24
    else:
        fmt, width = ("<" if little else ">") + "IIIBBH", 16
    count = min(dynsym["sh_size"], MAX_TABLE) // width
    if count > MAX_SYMBOLS:
        raise ValueError(
            f"its dynamic symbol table claims {count} symbols, more than any real library has "
            f"(read up to {MAX_SYMBOLS})"
        )
    strtab = sections.view(dynsym["sh_link"])
    raw = sections.view(found[0])
    raw = raw[: len(raw) - len(raw) % width]
    versym_index = sections.indexes("SHT_GNU_versym")
    versyms = sections.view(versym_index[0]) if versym_index else memoryview(b"")
    half = ("<" if little else ">") + "H"
    defs, needs = _version_names(sections)
    defined: dict[str, list[str]] = {}
    for index, entry in enumerate(struct.iter_unpack(fmt, raw)):
        if index == 0:
            continue
        if elf.elfclass == 64:
            name_off, info, _other, shndx = entry[0], entry[1], entry[2], entry[3]
        else:
            name_off, info, shndx = entry[0], entry[3], entry[5]
        binding = info >> 4
        if binding == 0:  # STB_LOCAL
            continue
        name = _strings(strtab, name_off)
        if not name:
            continue
        versym = struct.unpack_from(half, versyms, 2 * index)[0] if 2 * index + 2 <= len(versyms) else 1
        hidden, vindex = bool(versym & 0x8000), versym & 0x7FFF
        if shndx == 0:  # SHN_UNDEF
            if binding == 2:  # STB_WEAK: may stay unresolved
                continue
            version, source = needs.get(vindex, ("", ""))
            facts.undefined.append((name, version, source))
        else:
            version = defs.get(vindex, "")
            defined.setdefault(name, []).append(version + ("!" if hidden and version else ""))
    facts.defined = {name: tuple(v) for name, v in defined.items()}


@lru_cache(maxsize=64)
def _structs(little_endian: bool, elfclass: int, advanced: tuple[Any, ...] | None) -> ELFStructs:
    structs = ELFStructs(little_endian=little_endian, elfclass=elfclass)
    structs.create_basic_structs()
    if advanced is not None:
        structs.create_advanced_structs(*advanced)
    return structs


class _ELF(ELFFile):
    """ELFFile whose construct structs are built once per (byte order, class, type, machine, OS ABI):
    pyelftools builds them for every file, about 1.5 ms each, the largest cost of a small library.
    Mirrors ELFFile.__init__ of pyelftools 0.31-0.33 (the version pyproject.toml allows)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.stream.seek(0, io.SEEK_END)
        self.stream_len = self.stream.tell()
        self._identify_file()
        self.structs = _structs(self.little_endian, self.elfclass, None)
        self.header = self._parse_elf_header()
        advanced = (self["e_type"], self["e_machine"], self["e_ident"]["EI_OSABI"])
        self.structs = _structs(self.little_endian, self.elfclass, advanced)
        self.stream.seek(0)
        self.e_ident_raw = self.stream.read(16)
        self.stream_loader = None


@lru_cache(maxsize=1)
def _section_types() -> dict[int, str]:
    """sh_type number -> pyelftools' name (SHT_DYNAMIC, ...), as its parser names them for x86-64."""
    return {number: name for name, number in ENUM_SH_TYPE_AMD64.items() if name != "_default_"}


def _dynamic_tags(elf: ELFFile, sections: _Sections, index: int, facts: ElfFacts) -> bool:
    """DT_NEEDED, DT_SONAME, DT_RPATH and DT_RUNPATH of an x86-64 file, its Elf64_Dyn entries decoded
    in one pass (pyelftools' iter_tags costs about 30 µs a tag); False for other files."""
    if not (elf.little_endian and elf.elfclass == 64 and elf["e_machine"] == "EM_X86_64"):
        return False
    raw = sections.view(index)
    strings = sections.view(sections.headers[index]["sh_link"])
    for tag, value in struct.iter_unpack("<qQ", raw[: len(raw) // 16 * 16]):
        if tag == DT_NULL:
            break
        if tag == DT_NEEDED:
            facts.needed.append(_strings(strings, value))
        elif tag == DT_SONAME:
            facts.soname = _strings(strings, value)
        elif tag == DT_RPATH:
            facts.rpath += [p for p in _strings(strings, value).split(":") if p]
        elif tag == DT_RUNPATH:
            facts.runpath += [p for p in _strings(strings, value).split(":") if p]
    return True


class _Sections:
    """The section table, headers parsed once; Section objects made only for the sections used."""

    def __init__(self, elf: ELFFile) -> None:
        self.elf = elf
        count = elf.num_sections()
        self.bulk = self._bulk(elf, count)
        self.headers: list[Any] = self.bulk or [elf._get_section_header(i) for i in range(count)]
        self._made: dict[int, Any] = {}
        self._map: mmap.mmap | None = None

    @staticmethod
    def _bulk(elf: ELFFile, count: int) -> list[Any] | None:
        """An x86-64 file's section headers decoded in one pass (Elf64_Shdr: the gABI's 64-byte
        layout) into the fields pyelftools' own parser gives, about 40 times faster than one
        construct parse per header; None for any other file (pyelftools parses those)."""
        if not (elf.little_endian and elf.elfclass == 64 and elf["e_machine"] == "EM_X86_64"):
            return None
        if elf["e_shentsize"] != 64 or count == 0:
            return None
        elf.stream.seek(elf["e_shoff"])
        raw = elf.stream.read(64 * count)
        if len(raw) != 64 * count:
            return None
        types = _section_types()
        return [
            dict(
                sh_name=name,
                sh_type=types.get(kind, kind),
                sh_flags=flags,
                sh_addr=addr,
                sh_offset=offset,
                sh_size=size,
                sh_link=link,
                sh_info=info,
                sh_addralign=align,
                sh_entsize=entsize,
            )
            for name, kind, flags, addr, offset, size, link, info, align, entsize in struct.iter_unpack(
                "<IIQQQQIIQQ", raw
            )
        ]

    def get(self, index: int) -> Any:
        if index not in self._made:
            self._made[index] = self.elf._make_section(self.headers[index])
        return self._made[index]

    def of_type(self, *types: str) -> list[Any]:
        return [self.get(i) for i, h in enumerate(self.headers) if h["sh_type"] in types]

    def indexes(self, kind: str) -> list[int]:
        return [i for i, h in enumerate(self.headers) if h["sh_type"] == kind]

    def view(self, index: int) -> memoryview:
        """A section's bytes in place, from a read-only mapping of the file (nothing read until used;
        a hole in a sparse file costs no memory); empty for SHT_NOBITS or past the end of the file."""
        if not 0 <= index < len(self.headers) or self.headers[index]["sh_type"] == "SHT_NOBITS":
            return memoryview(b"")
        if self._map is None:
            self._map = mmap.mmap(self.elf.stream.fileno(), 0, access=mmap.ACCESS_READ)
        header = self.headers[index]
        start = min(header["sh_offset"], len(self._map))
        return memoryview(self._map)[start : start + min(header["sh_size"], MAX_TABLE)]


def scan_elf(root: str, rel: str) -> ElfFacts:
    """The facts of one ELF file; a file pyelftools cannot read is recorded with its error."""
    path = os.path.join(root, rel)
    with open(path, "rb") as fh:
        try:
            elf = _ELF(fh)
            facts = ElfFacts(rel, elf["e_machine"] if isinstance(elf["e_machine"], int) else 0, elf["e_type"])
            if elf["e_machine"] in ("EM_AMDGPU", EM_AMDGPU):
                facts.machine = EM_AMDGPU
                gpu = amdgpu_machines().get(elf["e_flags"] & 0xFF)
                facts.gpu_targets = [gpu or f"unknown EF_AMDGPU_MACH 0x{elf['e_flags'] & 0xFF:03x}"]
                return facts
            sections = _Sections(elf)
            for index in sections.indexes("SHT_DYNAMIC"):
                if _dynamic_tags(elf, sections, index, facts):
                    continue
                section = sections.get(index)
                if isinstance(section, DynamicSection):
                    for tag in section.iter_tags():
                        # pyelftools sets the string of a string-valued tag as an attribute named
                        # after it (needed, soname, rpath, runpath)
                        kind = tag.entry.d_tag
                        if kind == "DT_NEEDED":
                            facts.needed.append(getattr(tag, "needed"))  # noqa: B009
                        elif kind == "DT_SONAME":
                            facts.soname = getattr(tag, "soname")  # noqa: B009
                        elif kind == "DT_RPATH":
                            facts.rpath += [p for p in getattr(tag, "rpath").split(":") if p]  # noqa: B009
                        elif kind == "DT_RUNPATH":
                            facts.runpath += [p for p in getattr(tag, "runpath").split(":") if p]  # noqa: B009
            names = sections.view(elf["e_shstrndx"])
            for header in sections.headers:
                if (
                    header["sh_type"] == "SHT_PROGBITS"
                    and _strings(names, header["sh_name"]) == FATBIN_SECTION
                ):
                    facts.fatbin = True
                    start = header["sh_offset"]
                    found = read_bundle_targets(fh, start, start + header["sh_size"])
                    facts.gpu_targets, facts.compressed_bundles = found[0], found[2]
            _symbols(elf, facts, sections)
        except (ELFError, struct.error, ValueError, KeyError, AssertionError, OSError) as exc:
            return ElfFacts(rel, 0, "?", error=f"not a readable ELF file ({exc})")
    return facts


def _scan_many(root: str, rels: list[str]) -> list[ElfFacts]:
    return [scan_elf(root, rel) for rel in rels]


def _walk(root: Path) -> tuple[list[tuple[str, int]], dict[str, list[str]], dict[str, str], int]:
    """(ELF candidates with their size, standalone offload bundles, symlinks, files seen)."""
    elfs: list[tuple[str, int]] = []
    bundles: dict[str, list[str]] = {}
    links: dict[str, str] = {}
    seen = 0
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(root / rel_dir if rel_dir else root) as entries:
            for entry in entries:
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                if entry.is_symlink():
                    links[rel] = os.readlink(entry.path)
                    continue
                if entry.is_dir(follow_symlinks=False):
                    stack.append(rel)
                    continue
                seen += 1
                if os.path.splitext(entry.name)[1] in TEXT_SUFFIXES:
                    continue
                info = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(info.st_mode) or info.st_size < 32:
                    continue
                with open(entry.path, "rb") as fh:
                    head = fh.read(24)
                    if head.startswith(ELF_MAGIC):
                        elfs.append((rel, info.st_size))
                    elif head.startswith(BUNDLE_MAGIC) or head.startswith(COMPRESSED_MAGIC):
                        found, _, compressed = read_bundle_targets(fh, 0, info.st_size)
                        if found or compressed:
                            bundles[rel] = found
    return elfs, bundles, links, seen


def scan_tree(root: Path, workers: int | None = None) -> TreeScan:
    """Every ELF file and code object under `root` (links not followed), read in parallel processes
    when there are many."""
    root = Path(root)
    candidates, bundles, links, seen = _walk(root)
    rels = [rel for rel, _ in sorted(candidates, key=lambda c: -c[1])]  # big ones first: even load
    workers = workers or os.cpu_count() or 1
    results: list[ElfFacts] = []
    if len(rels) < PARALLEL_FROM or workers == 1:
        results = _scan_many(str(root), rels)
    else:
        chunks = [rels[i :: workers * 4] for i in range(workers * 4)]
        import multiprocessing

        context = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            for part in pool.map(_scan_many, [str(root)] * len(chunks), chunks):
                results.extend(part)
    scan = TreeScan(root, {}, bundles, links, seen, sum(size for _, size in candidates))
    for facts in results:
        if facts.machine == EM_AMDGPU:
            scan.code_objects[facts.path] = facts.gpu_targets
        else:
            scan.elfs[facts.path] = facts
    return scan
