"""ruff and mypy at zero, on every run of the suite (so CI fails on a regression).

mypy checks the *installed* package (a regular, non-editable install into a temporary folder),
because that is what users import and what `py.typed` promises; the editable install's import hook
is invisible to static analysis.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO

BIN = Path(sys.executable).parent


def run(argv: list[str], cwd: Path = REPO, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_ruff_check_is_clean():
    proc = run([str(BIN / "ruff"), "check", "--no-cache", "."])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_ruff_format_is_clean():
    proc = run([str(BIN / "ruff"), "format", "--no-cache", "--check", "."])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_mypy_is_clean_on_the_installed_package(tmp_path):
    site = tmp_path / "site"
    # Built from a copy: setuptools builds in the source tree's build/, which the packaging tests use too
    # (they may run at the same time in another worker).
    source = tmp_path / "source"
    for name in ("pyproject.toml", "README.md", "src", "checks", "provision", "bundles"):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        source.mkdir(exist_ok=True)
        copy(REPO / name, source / name)
    install = run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(site),
            str(source),
        ]
    )
    assert install.returncode == 0, install.stderr[-4000:]
    assert (site / "rocmdoctor" / "py.typed").is_file()
    proc = run(
        [
            str(BIN / "mypy"),
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--no-incremental",
            "--python-executable",
            sys.executable,
            "-p",
            "rocmdoctor",
        ],
        cwd=site,
    )
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
