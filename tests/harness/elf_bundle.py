"""Real ELF files built with gcc for the qualification tests, and the bundle trees that carry them.

    built = build_elves(tmp)                     # compiles once into tmp
    files = qualify_files(built, "good")         # relpath -> (bytes, mode) for harness.bundles

The libraries: `libprovide.so.1` exports provided_a and versioned_fn@@PROV_1.0; the Python extension
`vllm/_C.abi3.so` (a real abi3 module: `import vllm._C` works) needs both, finds libprovide through
RUNPATH $ORIGIN/../torch/lib, and calls a weak `maybe_missing` nobody defines (fine). The bad
variants are linked against a libprovide that has what the shipped one lacks (the upstream ABI breaks):
`needs_c` needs provided_c, `needs_v2` needs versioned_fn@PROV_2.0, `ghost` needs libghost.so.1.

The offload bundle is clang's documented layout (clang/docs/ClangOffloadBundler.rst, "Bundled Code
Object Layout"): "__CLANG_OFFLOAD_BUNDLE__", a u64 entry count, then per entry u64 offset, u64 size,
u64 id length and the id, little-endian; it goes into a `.hip_fatbin` section with objcopy, as hipcc
leaves it in a host object.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import sysconfig
from pathlib import Path

SP = "lib/python3.13/site-packages"
EXT = f"{SP}/vllm/_C.abi3.so"
TORCH_LIB = f"{SP}/torch/lib"
CLANG = f"{SP}/_rocm_sdk_core/lib/llvm/bin/clang"
HOST_ENTRY = "host-x86_64-unknown-linux-gnu-"

PROVIDE_C = """
int provided_a(void) { return 1; }
int versioned_fn(void) { return 2; }
"""
PROVIDE_C_EXTRA = PROVIDE_C + "int provided_c(void) { return 3; }\n"
VERSION_SCRIPTS = {
    "1.0": "PROV_1.0 { global: provided_a; provided_c; versioned_fn; local: *; };\n",
    # versioned_fn moves to PROV_2.0: what links against this needs versioned_fn@PROV_2.0
    "2.0": "PROV_1.0 { global: provided_a; provided_c; local: *; };\nPROV_2.0 { global: versioned_fn; } PROV_1.0;\n",
}
EXTENSION_C = """
#define Py_LIMITED_API 0x03080000
#include <Python.h>
int provided_a(void);
int versioned_fn(void);
__attribute__((weak)) int maybe_missing(void);
%(extra_decl)s
static PyObject *answer(PyObject *self, PyObject *args) {
    int weak = maybe_missing ? maybe_missing() : 0;
    return PyLong_FromLong(provided_a() + versioned_fn() + weak %(extra_call)s);
}
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
"""


def offload_bundle(entries: list[tuple[str, bytes]]) -> bytes:
    """A clang offload bundle of (entry id, code object) pairs, by the documented layout."""
    header_size = 24 + 8 + sum(24 + len(entry_id) for entry_id, _ in entries)
    offset = header_size
    header = bytearray(b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", len(entries)))
    body = bytearray()
    for entry_id, blob in entries:
        header += struct.pack("<QQQ", offset if blob else 0, len(blob), len(entry_id)) + entry_id.encode()
        body += blob
        offset += len(blob)
    return bytes(header + body)


def amdgpu_code_object(mach: int) -> bytes:
    """The 64-byte ELF header of an AMDGPU code object (EM_AMDGPU 224, OSABI AMDGPU_HSA 64, ABI v5),
    e_flags = EF_AMDGPU_MACH; enough for the target to be read from it."""
    ident = b"\x7fELF" + bytes([2, 1, 1, 64, 3]) + bytes(7)
    return ident + struct.pack("<HHIQQQIHHHHHH", 3, 224, 1, 0, 0, 0, mach, 64, 0, 0, 64, 0, 0)


def fatbin_for(gfx_list: list[str]) -> bytes:
    machs = {"gfx1100": 0x41, "gfx1101": 0x46, "gfx1151": 0x4A}
    entries = [(HOST_ENTRY, b"")]
    entries += [(f"hipv4-amdgcn-amd-amdhsa--{gfx}", amdgpu_code_object(machs[gfx])) for gfx in gfx_list]
    return offload_bundle(entries)


def _run(*argv: str, cwd: Path) -> None:
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True)


def _shared(out: Path, source: str, name: str, *flags: str) -> Path:
    src = out / f"{name}.c"
    src.write_text(source)
    target = out / name
    _run("gcc", "-shared", "-fPIC", "-O1", "-o", str(target), str(src), *flags, cwd=out)
    return target


def build_elves(out: Path) -> dict[str, bytes]:
    """Compile every variant into `out`; returns name -> the file's bytes."""
    out.mkdir(parents=True, exist_ok=True)
    include = sysconfig.get_paths()["include"]
    built: dict[str, Path] = {}
    for version, source, name in (
        ("1.0", PROVIDE_C, "libprovide.so.1"),
        ("1.0", PROVIDE_C_EXTRA, "link_c/libprovide.so.1"),
        ("2.0", PROVIDE_C, "link_v2/libprovide.so.1"),
    ):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        script = out / f"{name}.map"
        script.write_text(VERSION_SCRIPTS[version])
        built[name] = _shared(
            out, source, name, "-Wl,-soname,libprovide.so.1", f"-Wl,--version-script={script}"
        )
    (out / "ghost").mkdir(exist_ok=True)
    _shared(out, "int ghost(void) { return 4; }\n", "ghost/libghost.so.1", "-Wl,-soname,libghost.so.1")
    link = ["-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN/../torch/lib", f"-I{include}"]
    variants = {
        "ext_good": ("libprovide.so.1", "", ""),
        "ext_needs_c": ("link_c/libprovide.so.1", "int provided_c(void);", "+ provided_c()"),
        "ext_needs_v2": ("link_v2/libprovide.so.1", "", ""),
        "ext_ghost": ("libprovide.so.1", "int ghost(void);", "+ ghost()"),
    }
    for name, (provider, decl, call) in variants.items():
        extra = [str(out / "ghost/libghost.so.1")] if name == "ext_ghost" else []
        built[name] = _shared(
            out,
            EXTENSION_C % {"extra_decl": decl, "extra_call": call},
            name,
            *link,
            str(out / provider),
            *extra,
        )
    # A host library carrying device code for another GPU only (and one carrying gfx1151).
    for name, gfx in (("fatbin_gfx1151", ["gfx1151"]), ("fatbin_gfx110x", ["gfx1100", "gfx1101"])):
        blob = out / f"{name}.bundle"
        blob.write_bytes(fatbin_for(gfx))
        lib = _shared(out, "int kernels_stub(void) { return 0; }\n", f"{name}.so")
        _run(
            "objcopy",
            f"--add-section=.hip_fatbin={blob}",
            "--set-section-flags=.hip_fatbin=alloc,readonly",
            str(lib),
            cwd=out,
        )
        built[name] = lib
    return {name: path.read_bytes() for name, path in built.items()}


def write_tree(root: Path, files: dict[str, tuple[bytes, int]]) -> Path:
    """Lay out a bundle tree from {relative path: (bytes, mode)} (qualify_files' shape) under `root`."""
    for rel, (data, mode) in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
    return root


def python_wrapper() -> bytes:
    """bin/python3: this interpreter, with the bundle's site-packages first (as the real launcher's)."""
    return (
        '#!/bin/sh\nhere="$(cd "$(dirname "$0")/.." && pwd)"\n'
        f'PYTHONPATH="$here/{SP}" exec "{sys.executable}" "$@"\n'
    ).encode()


def qualify_files(elves: dict[str, bytes], variant: str) -> dict[str, tuple[bytes, int]]:
    """The bundle tree of one variant: good, needs_c, needs_v2, ghost, wrong_gfx, bad_clang."""
    ext = {"needs_c": "ext_needs_c", "needs_v2": "ext_needs_v2", "ghost": "ext_ghost"}.get(
        variant, "ext_good"
    )
    fatbin = "fatbin_gfx110x" if variant == "wrong_gfx" else "fatbin_gfx1151"
    clang = (
        b'#!/bin/sh\nexec "$(dirname "$0")/clang-23" "$@"\n'
        if variant == "bad_clang"
        else b'#!/bin/sh\necho "clang version 23.0.0"\n'
    )
    return {
        "bin/python3": (python_wrapper(), 0o755),
        f"{SP}/vllm/__init__.py": (b"", 0o644),
        EXT: (elves[ext], 0o755),
        f"{SP}/torch/__init__.py": (b"", 0o644),
        f"{TORCH_LIB}/libprovide.so.1": (elves["libprovide.so.1"], 0o755),
        f"{TORCH_LIB}/libtorch_hip.so": (elves[fatbin], 0o755),
        CLANG: (clang, 0o755),
    }


def family_code_objects(family: str, targets: list[str] | None = None) -> dict[str, tuple[bytes, int]]:
    """Standalone code objects (as rocBLAS ships its kernels) for every gfx of a family (the shipped
    manifest's targets unless given), so a synthetic bundle carries GPU code for the host it is installed on."""
    from rocmdoctor.archive.elf_scan import amdgpu_machines
    from rocmdoctor.facts.manifest import shipped_manifest

    mach = {gfx: value for value, gfx in amdgpu_machines().items()}
    shipped = shipped_manifest().families.get(family)
    wanted = targets if targets is not None else list(shipped.targets) if shipped else []
    targets = sorted(gfx for gfx in wanted if gfx in mach)
    return {
        f"{SP}/_rocm_sdk_libraries/lib/rocblas/library/kernels-{gfx}.co": (
            amdgpu_code_object(mach[gfx]),
            0o644,
        )
        for gfx in targets
    }
