"""Fixtures for the install tests: a loopback release server, small synthetic bundles, the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.bundles import BuiltBundle, FileSpec, build_bundle, write_pins
from harness.cli import rocmdoctor
from harness.elf_bundle import family_code_objects
from harness.release_server import ReleaseServer

REPO = "lemonade-sdk/vllm-rocm"
# Fast failure in tests: short timeouts, few retries (the defaults are for real networks).
FAST = ("--connect-timeout", "2", "--read-timeout", "1", "--retries", "2")


def bundle_files(tag: str, extra: dict[str, FileSpec] | None = None, payload: int = 0) -> dict[str, FileSpec]:
    """A minimal valid tree: the shim, an interpreter wrapper that really runs, and `payload` bytes."""
    files: dict[str, FileSpec] = {
        "bin/vllm-server": (b"#!/bin/sh\necho vllm-server stand-in\n", 0o755),
        "bin/python3": (f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'.encode(), 0o755),
        "lib/python3.13/site-packages/marker.txt": tag.encode(),
        **family_code_objects(tag.rsplit("-", 1)[-1]),  # GPU code for the family (qualification)
    }
    if payload:
        files["lib/python3.13/site-packages/payload.bin"] = os.urandom(payload)
    files.update(extra or {})
    return files


class InstallLab:
    # A plain class: conftest loads plugins without registering them in sys.modules, which @dataclass needs.
    def __init__(self, root: Path, server: ReleaseServer) -> None:
        self.root, self.server = root, server

    @property
    def prefix(self) -> Path:
        return self.root / "prefix"

    @property
    def pins(self) -> Path:
        return self.root / "pins"

    def bundle(
        self,
        tag: str,
        extra: dict[str, FileSpec] | None = None,
        payload: int = 0,
        part_size: int = 64 * 1024,
        publish: bool = True,
        digests: bool = True,
        prerelease: bool = False,
    ) -> BuiltBundle:
        built = build_bundle(self.root / "assets" / tag, tag, bundle_files(tag, extra, payload), part_size)
        if publish:
            assets = built.release_assets() if digests else [(a.name, a.path, None) for a in built.assets]
            self.server.add_release(REPO, tag, assets, prerelease=prerelease)
        return built

    def listed_only(self, tag: str, prerelease: bool = False, draft: bool = False) -> None:
        """A release the list shows but nobody should install (its one asset is no tarball)."""
        self.server.add_release(
            REPO,
            tag,
            [(f"{tag}-x64.tar.gz", f"not a bundle: {tag}".encode())],
            prerelease=prerelease,
            draft=draft,
        )

    def shipped(self, *args: str) -> subprocess.CompletedProcess:
        """`rocmdoctor install` with the shipped manifest and lock, as a new user runs it."""
        return self.cli("install", "--prefix", str(self.prefix), *FAST, *args)

    def pin(self, family: str, built: BuiltBundle) -> Path:
        write_pins(self.pins, {family: built}, base_url=self.server.mirror_url)
        return self.pins

    def env(self) -> dict[str, str]:
        return {**os.environ, "ROCMDOCTOR_GITHUB_API": self.server.api_url}

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """The command line in this process (harness.cli), against this lab's release server."""
        return rocmdoctor(*args, env={"ROCMDOCTOR_GITHUB_API": self.server.api_url})

    def install_args(self, family: str, *args: str) -> list[str]:
        return [
            "install",
            "--family",
            family,
            "--prefix",
            str(self.prefix),
            "--bundles-dir",
            str(self.pins),
            *FAST,
            *args,
        ]

    def install(self, family: str, *args: str) -> subprocess.CompletedProcess:
        return self.cli(*self.install_args(family, *args))

    def spawn_install(self, family: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "rocmdoctor", *self.install_args(family, *args)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env(),
        )

    def current(self) -> str | None:
        try:
            return os.readlink(self.prefix / "current")
        except OSError:
            return None

    def leftovers(self) -> list[str]:
        """Anything a failed install must not leave behind in bundles/."""
        bundles = self.prefix / "bundles"
        return (
            sorted(p.name for p in bundles.iterdir() if p.name.endswith(".partial") or ".old-" in p.name)
            if bundles.is_dir()
            else []
        )


@pytest.fixture
def install_lab(tmp_path: Path):
    with ReleaseServer() as server:
        yield InstallLab(tmp_path, server)
