"""Fixtures for `rocmdoctor serve`/`unit` tests: an installed test bundle and tiny models.

The bundle is the install helper's `vllm_test_bundle` (real release layout; `bin/vllm-server` execs
the real vLLM CPU engine), installed with the real `rocmdoctor install --mirror`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.served_bundle import TEST_FAMILY, TEST_TAG, install_argv


@pytest.fixture(scope="session")
def bundle_mirror(tmp_path_factory) -> tuple[Path, Path]:
    """(mirror dir with the release parts, pins dir with manifest.toml + lock.json)."""
    from harness.bundles import vllm_test_bundle, write_pins

    base = tmp_path_factory.mktemp("serve-bundle")
    built = vllm_test_bundle(base / "mirror", TEST_FAMILY, TEST_TAG)
    write_pins(base / "pins", {TEST_FAMILY: built})
    return base / "mirror", base / "pins"


@pytest.fixture(scope="session")
def installed_prefix(bundle_mirror, tmp_path_factory) -> Path:
    mirror, pins = bundle_mirror
    prefix = tmp_path_factory.mktemp("serve-prefix") / "opt"
    done = subprocess.run(install_argv(mirror, pins, prefix), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["changed"] is True
    assert (prefix / "current" / "bin" / "vllm-server").is_file()
    return prefix


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from harness.engine import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("serve-models") / "tiny")


@pytest.fixture(scope="session")
def crashing_model(tmp_path_factory) -> Path:
    """head_dim 16: /health answers 200, then the CPU attention backend dies at the first request."""
    from harness.engine import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("serve-models") / "tiny-hd16", head_dim=16)
