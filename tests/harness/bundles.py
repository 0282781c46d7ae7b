"""Synthetic vllm-rocm bundles with the real release layout, and a manifest + lock that pin them.

The real release: tag `vllm<ver>-rocm<ver>-<family>`, asset base `<tag>-x64`, one gzip'd tar split by
size into `<base>.partNN-of-MM.tar.gz` (1-based, zero-padded) beside `<base>.partcount` (one line: MM).
The tree holds `bin/vllm-server`, `bin/python3` and `lib/python3.*/site-packages/...`.

    built = build_bundle(tmp, "vllm0.1.0-rocm7.0.0-gfx1151", {"bin/vllm-server": (b"#!/bin/sh\n", 0o755)},
                         part_size=64 * 1024)
    write_pins(tmp / "pins", {"gfx1151": built}, base_url=server.mirror_url)
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shlex
import shutil
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.elf_bundle import family_code_objects

FileSpec = bytes | tuple[bytes, int] | tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]

REPO = "lemonade-sdk/vllm-rocm"
MTIME = 1_760_000_000  # fixed, so the same files give the same bytes


@dataclass(frozen=True)
class Asset:
    name: str
    size: int
    digest: str  # "sha256:<hex>", GitHub's format
    path: Path


@dataclass
class BuiltBundle:
    tag: str
    base: str
    out_dir: Path
    parts: list[Path] = field(default_factory=list)
    partcount: Path | None = None

    @property
    def assets(self) -> list[Asset]:
        return [Asset(p.name, p.stat().st_size, "sha256:" + _sha256_file(p), p) for p in self.parts]

    def release_assets(self) -> list[tuple]:
        """What `ReleaseServer.add_release` takes: the parts and the `.partcount` file."""
        items: list[tuple] = [(a.name, a.path, a.digest) for a in self.assets]
        if self.partcount is not None:
            items.append((self.partcount.name, self.partcount))
        return items


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class _SplitWriter(io.RawIOBase):
    """Writes one byte stream into numbered files of at most `part_size` bytes (like `split -b`)."""

    def __init__(self, prefix: Path, part_size: int) -> None:
        self.prefix, self.part_size = prefix, part_size
        self.paths: list[Path] = []
        self._fh = None
        self._left = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        view = memoryview(data)
        while view:
            if self._left == 0:
                if self._fh:
                    self._fh.close()
                path = Path(f"{self.prefix}.split{len(self.paths) + 1:02d}")
                self.paths.append(path)
                self._fh = open(path, "wb")  # noqa: SIM115 - one file per part, closed on rollover
                self._left = self.part_size
            n = min(self._left, len(view))
            self._fh.write(view[:n])
            self._left -= n
            view = view[n:]
        return len(data)

    def close(self) -> None:
        if self._fh:
            self._fh.close()
            self._fh = None
        super().close()


def _parents(relpath: str) -> list[str]:
    parts = relpath.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _add(tar: tarfile.TarFile, relpath: str, spec: FileSpec) -> None:
    if isinstance(spec, tarfile.TarInfo):
        tar.addfile(spec)
        return
    if isinstance(spec, tuple) and isinstance(spec[0], tarfile.TarInfo):
        info, data = spec
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        return
    data, mode = spec if isinstance(spec, tuple) else (spec, 0o644)
    info = tarfile.TarInfo(relpath)
    info.size, info.mode, info.mtime = len(data), mode, MTIME
    tar.addfile(info, io.BytesIO(data))


def write_tarball(fileobj, files: dict[str, FileSpec], compresslevel: int = 6) -> None:
    """A gzip'd tar of `files` (relpath -> bytes, (bytes, mode), or a raw TarInfo for odd members)."""
    with (
        gzip.GzipFile(fileobj=fileobj, mode="wb", compresslevel=compresslevel, mtime=MTIME) as gz,
        tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar,
    ):
        made: set[str] = set()
        for relpath, spec in files.items():
            for parent in _parents(relpath):
                if parent not in made and parent not in files:
                    info = tarfile.TarInfo(parent)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, MTIME
                    tar.addfile(info)
                    made.add(parent)
            _add(tar, relpath, spec)


def build_bundle(
    out_dir: Path, tag: str, files: dict[str, FileSpec], part_size: int, compresslevel: int = 6
) -> BuiltBundle:
    """Pack `files` like the release workflow: one tar.gz split into `partNN-of-MM` + `.partcount`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = f"{tag}-x64"
    writer = _SplitWriter(out_dir / base, part_size)
    write_tarball(writer, files, compresslevel)
    writer.close()
    count = len(writer.paths)
    built = BuiltBundle(tag=tag, base=base, out_dir=out_dir)
    for index, split in enumerate(writer.paths, start=1):
        final = out_dir / f"{base}.part{index:02d}-of-{count:02d}.tar.gz"
        os.replace(split, final)
        built.parts.append(final)
    built.partcount = out_dir / f"{base}.partcount"
    built.partcount.write_text(f"{count}\n")
    return built


def write_pins(
    dest: Path,
    bundles: dict[str, BuiltBundle],
    base_url: str | None = None,
    repo: str = REPO,
    channel: str = "stable",
    targets: dict[str, list[str]] | None = None,
) -> tuple[Path, Path]:
    """`manifest.toml` + `lock.json` pinning each family to its synthetic bundle (for --bundles-dir).

    base_url: where the assets live (a mirror URL); without it the lock carries no url and the
    installer uses GitHub's download URL or --mirror."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    lines = ["schema_version = 1", f'repo = "{repo}"', ""]
    families = {}
    for family, built in bundles.items():
        assets = built.assets
        lines += [
            f"[families.{family}]",
            f'tag = "{built.tag}"',
            f'channel = "{channel}"',
            *([f"targets = {json.dumps(targets[family])}"] if targets and family in targets else []),
            "parts = [" + ", ".join(f'"{a.name}"' for a in assets) + "]",
            "",
        ]
        families[family] = {
            "tag": built.tag,
            "pinned": True,
            "assets": [
                {
                    "name": a.name,
                    "size": a.size,
                    "digest": a.digest,
                    **({"url": f"{base_url}/{a.name}"} if base_url else {}),
                }
                for a in assets
            ],
        }
    manifest = dest / "manifest.toml"
    manifest.write_text("\n".join(lines))
    lock = dest / "lock.json"
    lock.write_text(json.dumps({"schema_version": 1, "repo": repo, "families": families}, indent=2) + "\n")
    return manifest, lock


def default_vllm_python() -> Path:
    cache = Path(os.environ.get("ROCMDOCTOR_TEST_CACHE", "/root/.cache/rocmdoctor-test"))
    return cache / "vllm-venv" / "bin" / "python"


def launcher_scripts(python: Path | str, launcher_args: Sequence[str] = ()) -> dict[str, str]:
    """A test bundle's `bin/vllm-server` (execs `<python> -m vllm.entrypoints.openai.api_server "$@"`,
    then `launcher_args`, which win over the caller's) and `bin/python3` (execs `python`)."""
    extra = "".join(f" {shlex.quote(a)}" for a in launcher_args)
    return {
        "bin/vllm-server": f'#!/bin/bash\nexec "{python}" -m vllm.entrypoints.openai.api_server "$@"{extra}\n',
        "bin/python3": f'#!/bin/bash\nexec "{python}" "$@"\n',
    }


def write_launchers(tree: Path, python: Path | str) -> None:
    """launcher_scripts() written into the tree `tree`, executable."""
    for name, text in launcher_scripts(python).items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
        (tree / name).chmod(0o755)


def environment_as_bundle(python: Path, tree: Path) -> Path:
    """The venv of `python` laid out as a bundle's tree at `tree`: its lib/ hard-linked, and the
    launchers. A real environment, so qualification judges real ELF files and imports for real."""
    shutil.copytree(python.parent.parent / "lib", tree / "lib", symlinks=True, copy_function=os.link)
    write_launchers(tree, python)
    return tree


def vllm_test_bundle(
    out_dir: Path,
    family: str,
    tag: str,
    vllm_python: Path | str | None = None,
    part_size: int = 64 * 1024,
    launcher_args: Sequence[str] = (),
) -> BuiltBundle:
    """A bundle whose `bin/vllm-server` runs the real (CPU) vLLM of the test cache, so an installed
    bundle can be served: the shim execs `<vllm_python> -m vllm.entrypoints.openai.api_server "$@"`
    (then `launcher_args`, which win over the caller's: a launcher that overrides a setting) and
    `bin/python3` execs the same interpreter."""
    launchers = launcher_scripts(vllm_python or default_vllm_python(), launcher_args)
    sp = "lib/python3.13/site-packages"
    files: dict[str, FileSpec] = {
        **{name: (text.encode(), 0o755) for name, text in launchers.items()},
        f"{sp}/rocmdoctor_test_bundle.txt": f"{family} {tag}\n".encode(),
        # The real bundle's clang loses its exec bit in the tarball; the installer restores it.
        f"{sp}/_rocm_sdk_core/lib/llvm/bin/clang": (b"#!/bin/sh\necho clang stand-in\n", 0o644),
        **family_code_objects(family),  # GPU code for the family, which install's qualification looks for
    }
    return build_bundle(Path(out_dir), tag, files, part_size)
