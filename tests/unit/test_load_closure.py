"""Qualification judges what loads: real ELF files made by gcc (harness.elf_bundle), laid out as bundles.
A file in the load closure of `import torch, vllm._C` that cannot resolve fails, naming it and what it
needs; the same in a file nothing loads is a note; a renamed library (its soname never satisfies the
DT_NEEDED) is named."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from harness.elf_bundle import (
    EXT,
    EXTENSION_C,
    SP,
    TORCH_LIB,
    _shared,
    build_elves,
    qualify_files,
    write_tree,
)
from rocmdoctor.provision.bundle.qualify import qualify

TAG = "vllm0.1.0-rocm7.0.0-gfx1151"
RENAMED = "librocm_sysdeps_libghost.so.1"  # as TheRock's sysdeps rename liblzma.so.5
PLUGIN = f"{SP}/torch/lib/plugins/libomptarget.rtl.offload.so"  # an optional plugin nothing loads


@pytest.fixture(scope="module")
def elves(tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("elves")
    built = build_elves(out)
    renamed = _shared(out, "int ghost(void) { return 4; }\n", RENAMED, f"-Wl,-soname,{RENAMED}")
    return {**built, RENAMED: renamed.read_bytes()}


def _steps(result) -> dict[str, str]:
    return {step.id: step.status for step in result.steps}


def test_a_renamed_library_in_the_load_closure_is_refused_naming_it_and_its_user(elves, tmp_path):
    files = qualify_files(elves, "ghost")  # vllm/_C needs libghost.so.1
    files[f"{TORCH_LIB}/{RENAMED}"] = (elves[RENAMED], 0o755)  # shipped under another name only
    result = qualify(write_tree(tmp_path / "b", files), TAG, "sha256:x", "gfx1151")
    assert not result.qualified
    libraries = next(step for step in result.steps if step.id == "libraries")
    (failure,) = libraries.failures
    assert failure.file == EXT and failure.missing == "libghost.so.1"
    assert f"{EXT} needs libghost.so.1" in failure.message
    assert f"the bundle carries {RENAMED}, whose name never satisfies a DT_NEEDED of libghost.so.1" in (
        failure.message
    )
    assert _steps(result)["import"] == "skipped"


def test_the_same_in_a_file_nothing_loads_is_a_note_and_the_import_decides(elves, tmp_path):
    files = qualify_files(elves, "good")
    files[PLUGIN] = (elves["ext_ghost"], 0o755)  # needs libghost.so.1, which nothing provides
    files[f"{TORCH_LIB}/{RENAMED}"] = (elves[RENAMED], 0o755)
    result = qualify(write_tree(tmp_path / "b", files), TAG, "sha256:x", "gfx1151")
    assert result.qualified, result.first_failure()
    assert _steps(result) == dict.fromkeys(
        ("libraries", "symbols", "code_objects", "compiler", "import"), "passed"
    )
    libraries = next(step for step in result.steps if step.id == "libraries")
    (note,) = [n for n in libraries.notes if PLUGIN in n]
    assert "needs libghost.so.1" in note and RENAMED in note and "nothing import torch, vllm._C" in note
    assert libraries.note_count == len(libraries.notes) >= 1


def test_an_optional_plugin_with_a_missing_dependency_outside_the_closure_passes(elves, tmp_path):
    files = qualify_files(elves, "good")
    files[PLUGIN] = (elves["ext_ghost"], 0o755)
    result = qualify(write_tree(tmp_path / "b", files), TAG, "sha256:x", "gfx1151")
    assert result.qualified and _steps(result)["import"] == "passed"
    symbols = next(step for step in result.steps if step.id == "symbols")
    assert "1 not loaded, not checked" in symbols.detail


def test_a_tree_without_torch_or_vllm_is_judged_file_by_file(elves, tmp_path):
    """No root to follow: every file counts, as before the closure."""
    files = {f"{SP}/other/libx.so": (elves["ext_ghost"], 0o755)}
    result = qualify(write_tree(tmp_path / "b", files), TAG, "sha256:x", None)
    assert not result.qualified and "other/libx.so needs libprovide.so.1" in result.first_failure()


def test_a_build_host_checks_every_isa_of_the_family(elves, tmp_path):
    """install --family gfx110X on a host without that GPU: a bundle holding only gfx1100 code objects
    is not qualified for the family; one holding all four is."""
    from harness.elf_bundle import family_code_objects
    from rocmdoctor.facts.manifest import shipped_manifest

    targets = shipped_manifest().families["gfx110X"].targets
    partial = {**qualify_files(elves, "good"), **family_code_objects("gfx110X", ["gfx1100"])}
    partial.pop(f"{TORCH_LIB}/libtorch_hip.so")  # its fatbin holds gfx1151 code only
    result = qualify(write_tree(tmp_path / "partial", partial), TAG, "sha256:x", None, targets=targets)
    step = next(step for step in result.steps if step.id == "code_objects")
    assert step.status == "failed" and {f.missing for f in step.failures} == {"gfx1101", "gfx1102", "gfx1103"}
    assert "carries no GPU code objects for the family's gfx1101" in step.failures[0].message
    full = {**partial, **family_code_objects("gfx110X")}
    result = qualify(write_tree(tmp_path / "full", full), TAG, "sha256:x", None, targets=targets)
    step = next(step for step in result.steps if step.id == "code_objects")
    assert step.status == "passed" and "every ISA of the family" in step.detail
    one = qualify(write_tree(tmp_path / "one", partial), TAG, "sha256:x", None, targets=("gfx1100",))
    assert next(s for s in one.steps if s.id == "code_objects").status == "passed"  # --gfx gfx1100


def test_install_options_on_a_host_without_the_familys_gpu_name_its_isas():
    from harness.hosts import HOSTS
    from rocmdoctor.commands.option_groups import QualifyChoice

    class App:
        root = Path("/")

        def host(self):
            from rocmdoctor.host import Host

            return Host(HOSTS / "no-amd-gpu")

    targets = ("gfx1100", "gfx1101", "gfx1102", "gfx1103")
    options = QualifyChoice(None, 180.0).settings(App(), family_targets=targets)  # type: ignore[arg-type]
    assert (options.gfx, options.targets) == (None, targets)
    named = QualifyChoice("gfx1101", 180.0).settings(App(), family_targets=targets)  # type: ignore[arg-type]
    assert (named.gfx, named.targets) == ("gfx1101", ())


USER = "libuser.so.1"  # calls defs_fn without naming libdefs.so.1 (libtorch_nvshmem.so and libc10_cuda.so)
DEFS = "libdefs.so.1"


def _group_elves(out: Path, root_needs: tuple[str, ...]) -> dict[str, tuple[bytes, int]]:
    out.mkdir(parents=True, exist_ok=True)
    defs = _shared(out, "int defs_fn(void) { return 7; }\n", DEFS, f"-Wl,-soname,{DEFS}")
    user = _shared(
        out, "int defs_fn(void);\nint user_fn(void) { return defs_fn(); }\n", USER, f"-Wl,-soname,{USER}"
    )
    provide = out / "libprovide.so.1"
    ext = _shared(
        out,
        EXTENSION_C % {"extra_decl": "int user_fn(void);", "extra_call": "+ user_fn()"},
        "ext_group",
        "-Wl,--enable-new-dtags",
        "-Wl,-rpath,$ORIGIN/../torch/lib",
        f"-I{sysconfig.get_paths()['include']}",
        "-Wl,--no-as-needed",
        str(provide),
        *(str(out / name) for name in root_needs),
    )
    return {
        EXT: (ext.read_bytes(), 0o755),
        f"{TORCH_LIB}/{USER}": (user.read_bytes(), 0o755),
        f"{TORCH_LIB}/{DEFS}": (defs.read_bytes(), 0o755),
    }


def test_a_symbol_found_in_the_load_group_resolves_as_the_loader_resolves_it(elves, tmp_path):
    """libuser needs defs_fn and does not name libdefs; the root loads both, so the real loader binds
    it (the import step imports vllm._C for real and agrees)."""
    out = tmp_path / "elves"
    out.mkdir()
    (out / "libprovide.so.1").write_bytes(elves["libprovide.so.1"])
    files = qualify_files(elves, "good") | _group_elves(out, (USER, DEFS))
    result = qualify(write_tree(tmp_path / "b", files), TAG, "sha256:x", "gfx1151")
    assert _steps(result)["symbols"] == "passed", [f.message for s in result.steps for f in s.failures]
    assert _steps(result)["import"] == "passed" and result.qualified


def test_a_symbol_no_library_of_the_group_defines_still_fails(elves, tmp_path):
    out = tmp_path / "elves"
    out.mkdir()
    (out / "libprovide.so.1").write_bytes(elves["libprovide.so.1"])
    files = qualify_files(elves, "good") | _group_elves(out, (USER,))  # libdefs loaded by nobody
    result = qualify(write_tree(tmp_path / "b", files), TAG, "sha256:x", "gfx1151")
    symbols = next(step for step in result.steps if step.id == "symbols")
    assert [f.missing for f in symbols.failures] == ["defs_fn"]
    assert f"{TORCH_LIB}/{USER} needs symbol defs_fn" in symbols.failures[0].message
    assert not result.qualified
