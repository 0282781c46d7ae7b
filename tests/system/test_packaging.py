"""The wheel carries every module of checks/ and provision/ under rocmdoctor/, and the package data."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from conftest import REPO


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> set[str]:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("rocmdoctor-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def sources(folder: str, pattern: str) -> list[str]:
    return sorted(str(p.relative_to(REPO / folder)) for p in (REPO / folder).glob(pattern) if p.is_file())


@pytest.mark.parametrize("folder", ["checks", "provision"])
def test_every_module_is_in_the_wheel(wheel_names, folder):
    modules = sources(folder, "*.py")
    assert modules, f"{folder}/ has no modules"
    missing = [m for m in modules if f"rocmdoctor/{folder}/{m}" not in wheel_names]
    assert not missing, f"not in the wheel: {missing}"


def test_no_generic_top_level_package(wheel_names):
    tops = {name.split("/", 1)[0] for name in wheel_names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"rocmdoctor"}


def test_package_data_is_in_the_wheel(wheel_names):
    expected = [f"rocmdoctor/schema/{n}" for n in sources("src/rocmdoctor/schema", "*.json")]
    expected += [f"rocmdoctor/probes/{n}" for n in sources("src/rocmdoctor/probes", "*.py")]
    expected += [
        f"rocmdoctor/bundles/{n}" for n in sources("bundles", "*.toml") + sources("bundles", "*.json")
    ]
    expected += [
        f"rocmdoctor/provision/server/templates/{n}" for n in sources("provision/server/templates", "*")
    ]
    # The unit's helpers are modules of the package; `unit` writes their source to <prefix>/libexec.
    expected += [
        f"rocmdoctor/provision/server/{n}" for n in ("wait_ready.py", "stop_leftovers.py", "vllm_serve.py")
    ]
    assert "rocmdoctor/schema/check-report.schema.json" in expected
    assert sorted(set(expected) - wheel_names) == []
