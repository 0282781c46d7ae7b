"""Ask an installed bundle's own vLLM what it accepts, and find the answer again for the argument writers.

At install and `bundle qualify` the import step's interpreter (provision/bundle/qualify.check_import: the
bundle's own, bounded in time and output, in the unit's environment) runs rocmdoctor/probes/vllm_surface.py
after its imports; its answer is kept beside the qualification record (vllm/surface.RECORD). `unit`,
`serve`, `instances`, `tune`, `lemonade` and `cluster unit` build their arguments with `for_prefix()`:
the current bundle's record, else the shipped table of the current bundle's version (its tag), else of
the version the manifest's reviewed bundles carry; the surface says which.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from rocmdoctor import host_files as files
from rocmdoctor.documents import DocumentError
from rocmdoctor.facts.manifest import parse_release_tag, shipped_manifest
from rocmdoctor.host_writes import OwnedTrees
from rocmdoctor.rootfs import read_regular
from rocmdoctor.vllm import surface

ASK_OUTPUT = surface.RECORD_LIMIT  # the import step's output bound while it asks


def probe_path() -> str:
    return str(resources.files("rocmdoctor") / "probes" / "vllm_surface.py")


def judge_answer(answer: list[str], tree: Path) -> tuple[str | None, str | None, str]:
    """(vLLM's version, what the record says about the question, the document to keep) from what the
    import step's interpreter printed (`answer` empty: nobody was asked)."""
    if not answer:
        return None, None, ""
    where = str(tree / surface.RECORD)
    try:
        said = surface.from_record(answer[0].encode(), where)
    except DocumentError as exc:
        return None, f"the bundle's vLLM gave no usable answer about its flags ({exc})", ""
    return (
        said.version,
        f"{surface.RECORD}: vLLM {said.version}, {len(said.flags)} flag spellings, "
        f"{len(said.environment)} environment names (asked the bundle's own vLLM)",
        answer[0],
    )


def keep(trees: OwnedTrees, tree: Path, text: str) -> None:
    """The bundle's answer beside its qualification record; none: an old answer is removed (it may be
    another bundle's, from before a rebuild)."""
    if text:
        trees.write_atomic(tree / surface.RECORD, text)
    else:
        trees.remove(tree / surface.RECORD)


def recorded(tree: Path) -> surface.Surface | None:
    try:
        return surface.from_record(
            read_regular(tree / surface.RECORD, surface.RECORD_LIMIT), str(tree / surface.RECORD)
        )
    except (OSError, DocumentError):
        return None


def for_prefix(prefix: str | Path) -> surface.Surface:
    """The vLLM the current bundle under `prefix` runs, as well as it can be known (see the docstring)."""
    current = Path(prefix) / "current"
    answer = recorded(current) if files.is_dir(current) else None
    if answer is not None:
        return answer
    target = files.readlink(current)
    tag = parse_release_tag(Path(target).name) if target else None
    if tag is not None:
        return surface.for_version(tag.version.base_version)
    return surface.for_version(reviewed_version())


def reviewed_version() -> str:
    """The vLLM version most of the manifest's reviewed bundles carry (0.20.1 today)."""
    counts: dict[str, int] = {}
    for pin in shipped_manifest().families.values():
        tag = parse_release_tag(pin.tag) if pin.tag else None
        if tag is not None:
            version = tag.version.base_version
            counts[version] = counts.get(version, 0) + 1
    return max(sorted(counts), key=lambda v: counts[v]) if counts else surface.SHIPPED[-1]
