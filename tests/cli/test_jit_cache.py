"""JIT caches owned by the unit, keyed by bundle digest and gfx: the unit reads them from the bundle's
env file (still starting the bundle's bin/vllm-server), `check` reports a stale or partial cache on a
host fixture, `bundle cache purge` removes what is not the current bundle's."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from harness.fleet import host_root
from harness.hosts import check_json, fixture_root
from rocmdoctor.cli import cli
from rocmdoctor.host_writes import HostWriter

DIGEST = "sha256:" + "ab" * 32
KEY = "gfx1151-" + "ab" * 8
TAG = "vllm0.1.0-rocm7.0.0-gfx1151"


def _installed(prefix: Path) -> None:
    """A current bundle with its qualification record and JIT env file, as install leaves them."""
    from rocmdoctor.provision.server import jit_cache

    tree = prefix / "bundles" / TAG
    tree.mkdir(parents=True)
    (tree / ".rocmdoctor-qualification.json").write_text(
        json.dumps(
            {"tag": TAG, "qualified": True, "host_gfx": "gfx1151", "bundle_digest": DIGEST, "steps": []}
        )
    )
    jit_cache.write_bundle_env(HostWriter().trees, tree, DIGEST, "gfx1151")
    (prefix / "current").symlink_to(f"bundles/{TAG}")


def test_bundle_env_file_keys_every_cache_by_digest_and_gfx(tmp_path):
    _installed(tmp_path / "opt/rocmdoctor")
    env = (tmp_path / f"opt/rocmdoctor/bundles/{TAG}/.rocmdoctor-jit.env").read_text().splitlines()[1:]
    assert env == [
        f"TRITON_CACHE_DIR=/var/lib/vllm/jit/{KEY}/triton",
        f"TORCHINDUCTOR_CACHE_DIR=/var/lib/vllm/jit/{KEY}/inductor",
        f"VLLM_CACHE_ROOT=/var/lib/vllm/jit/{KEY}/vllm",
        f"AITER_JIT_DIR=/var/lib/vllm/jit/{KEY}/aiter",
    ]


def test_unit_reads_the_current_bundles_cache_file_and_starts_its_launcher():
    result = CliRunner().invoke(
        cli,
        ["--root", str(fixture_root("strix-halo-clean")), "unit", "--model", "/srv/m"],
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "EnvironmentFile=-/opt/rocmdoctor/current/.rocmdoctor-jit.env" in lines
    # after Environment= (which it overrides, systemd.exec(5)), and the launcher still starts the server
    assert lines.index("EnvironmentFile=-/opt/rocmdoctor/current/.rocmdoctor-jit.env") > max(
        i for i, line in enumerate(lines) if line.startswith("Environment=")
    )
    assert next(line for line in lines if line.startswith("ExecStart=")).startswith(
        "ExecStart=/opt/rocmdoctor/current/bin/vllm-server "
    )


def test_check_reports_stale_and_partial_caches_and_purge_removes_them(tmp_path):
    root = host_root("strix-halo-clean", tmp_path / "host")
    _installed(root / "opt/rocmdoctor")
    jit = root / "var/lib/vllm/jit"
    (jit / KEY / "triton/abc123").mkdir(parents=True)
    (jit / KEY / "fingerprint.json").write_text(
        json.dumps({"bundle_digest": DIGEST, "gfx": "gfx1151", "tag": TAG})
    )
    _, report, _ = check_json(root)
    cache = next(c for c in report["checks"] if c["id"] == "bundle.jit_cache")
    assert cache["status"] == "pass" and cache["details"]["current_key"] == KEY

    old = jit / "gfx1100-0123456789abcdef"
    (old / "triton").mkdir(parents=True)
    (old / "fingerprint.json").write_text(
        json.dumps({"bundle_digest": "sha256:01", "gfx": "gfx1100", "tag": "old"})
    )
    (jit / KEY / "triton/abc123/tmp.pid_77_1234").mkdir()
    (jit / KEY / "aiter/build/module_moe").mkdir(parents=True)
    _, report, _ = check_json(root)
    cache = next(c for c in report["checks"] if c["id"] == "bundle.jit_cache")
    assert cache["status"] == "warn"
    assert f"/var/lib/vllm/jit/{old.name} (built for old on gfx1100)" in cache["summary"]
    assert f"/var/lib/vllm/jit/{KEY}/triton/abc123/tmp.pid_77_1234" in cache["summary"]
    assert sorted(cache["details"]["partial"]) == [
        f"/var/lib/vllm/jit/{KEY}/aiter/build/module_moe",
        f"/var/lib/vllm/jit/{KEY}/triton/abc123/tmp.pid_77_1234",
    ]
    assert "rocmdoctor bundle cache purge" in cache["remedy"]

    args = ["bundle", "cache", "purge", "--prefix", str(root / "opt/rocmdoctor"), "--state-dir"]
    dry = CliRunner().invoke(cli, [*args, str(root / "var/lib/vllm"), "--check", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["removed"] == [old.name] and old.is_dir()
    done = CliRunner().invoke(cli, [*args, str(root / "var/lib/vllm"), "--json"])
    assert json.loads(done.output)["kept"] == [KEY] and not old.exists() and (jit / KEY).is_dir()
    everything = CliRunner().invoke(cli, [*args, str(root / "var/lib/vllm"), "--all"])
    assert everything.exit_code == 0 and not (jit / KEY).exists()


def test_serve_environment_is_keyed_and_fingerprinted(tmp_path):
    from rocmdoctor.commands.bundle_qualify import jit_environment

    _installed(tmp_path / "prefix")
    env = jit_environment(tmp_path / "prefix", tmp_path / "state")
    key_dir = tmp_path / "state/jit" / KEY
    assert (
        env["AITER_JIT_DIR"] == f"{key_dir}/aiter" and env["TORCHINDUCTOR_CACHE_DIR"] == f"{key_dir}/inductor"
    )
    assert json.loads((key_dir / "fingerprint.json").read_text())["bundle_digest"] == DIGEST
    assert jit_environment(tmp_path / "nothing", tmp_path / "state") == {}  # never qualified: vLLM's defaults
