"""Qualification judges what loads: real ELF files made by gcc (harness.elf_bundle), laid out as bundles.
A file in the load closure of `import torch, vllm._C` that cannot resolve fails, naming it and what it
needs; the same in a file nothing loads is a note; a renamed library (its soname never satisfies the
DT_NEEDED) is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.elf_bundle import EXT, SP, TORCH_LIB, _shared, build_elves, qualify_files
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


def _tree(root: Path, files: dict[str, tuple[bytes, int]]) -> Path:
    for rel, (data, mode) in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
    return root


def _steps(result) -> dict[str, str]:
    return {step.id: step.status for step in result.steps}


def test_a_renamed_library_in_the_load_closure_is_refused_naming_it_and_its_user(elves, tmp_path):
    files = qualify_files(elves, "ghost")  # vllm/_C needs libghost.so.1
    files[f"{TORCH_LIB}/{RENAMED}"] = (elves[RENAMED], 0o755)  # shipped under another name only
    result = qualify(_tree(tmp_path / "b", files), TAG, "sha256:x", "gfx1151")
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
    result = qualify(_tree(tmp_path / "b", files), TAG, "sha256:x", "gfx1151")
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
    result = qualify(_tree(tmp_path / "b", files), TAG, "sha256:x", "gfx1151")
    assert result.qualified and _steps(result)["import"] == "passed"
    symbols = next(step for step in result.steps if step.id == "symbols")
    assert "1 not loaded, not checked" in symbols.detail


def test_a_tree_without_torch_or_vllm_is_judged_file_by_file(elves, tmp_path):
    """No root to follow: every file counts, as before the closure."""
    files = {f"{SP}/other/libx.so": (elves["ext_ghost"], 0o755)}
    result = qualify(_tree(tmp_path / "b", files), TAG, "sha256:x", None)
    assert not result.qualified and "other/libx.so needs libprovide.so.1" in result.first_failure()
