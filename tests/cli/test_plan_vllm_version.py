"""`plan` sizes with the rules of the vLLM that will serve (vllm/plan_versions.py) and says which and why:
the bundle installed under the prefix (its own vllm dist-info), else --vllm-version, else the reviewed
bundle the shipped manifest pins for the host's GPU family, else the newest rules. Replayed roots from
the real captures (tests/fixtures/hosts), in-process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from harness.hosts import fixture_root
from rocmdoctor.cli import cli

# A Gemma 2 shape (sliding window 512 and full attention alternating): 0.32 keeps two batches beyond the
# window with async scheduling, 0.20.1 one (tests/unit/test_plan_versions.py works the figures).
GEMMA2 = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_size": 256,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 8192,
    "sliding_window": 512,
    "torch_dtype": "bfloat16",
}
DIST_INFO = "lib/python3.12/site-packages/vllm-{v}.dist-info/METADATA"


def _root(tmp_path: Path, installed: str | None) -> Path:
    root = tmp_path / "root"
    shutil.copytree(fixture_root("strix-halo-clean"), root, symlinks=True)
    if installed:
        tree = root / "opt" / "rocmdoctor" / "bundles" / "test-bundle"
        # the dist-info folder names the version; a hostile one keeps a plain folder name
        metadata = tree / DIST_INFO.format(v=installed if installed.isprintable() else "0.0.0")
        metadata.parent.mkdir(parents=True)
        metadata.write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {installed}\n")
        (root / "opt" / "rocmdoctor" / "current").symlink_to("bundles/test-bundle")
    return root


def _plan(tmp_path: Path, root: Path, *options: str) -> dict:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(GEMMA2))
    args = ["--root", str(root), "plan", "--model", str(model), "--kv-cache-memory", "64MiB", "--json"]
    result = CliRunner().invoke(cli, [*args, *options])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_the_installed_bundles_vllm_picks_the_rules(tmp_path: Path):
    plan = _plan(tmp_path, _root(tmp_path, "0.20.1+rocm7.12.0"))
    assert plan["vllm_version"] == "0.20.1+rocm7.12.0" and plan["vllm_rules"] == "0.20.1"
    assert "installed under /opt/rocmdoctor" in plan["vllm_version_source"]
    assert plan["kv_cache_tokens"] == 49857  # one batch beyond the window


def test_a_named_version_is_used_and_the_installed_one_is_said(tmp_path: Path):
    plan = _plan(tmp_path, _root(tmp_path, "0.20.1"), "--vllm-version", "0.32.0")
    assert plan["vllm_rules"] == "0.32.0" and plan["kv_cache_tokens"] == 41890
    assert (
        plan["vllm_version_source"].startswith("--vllm-version") and "0.20.1" in plan["vllm_version_source"]
    )


def test_without_a_bundle_the_manifests_pin_for_the_family_is_used(tmp_path: Path):
    # strix-halo-clean is a gfx1151; manifest.toml pins vllm0.20.1-rocm7.12.0-gfx1151 for it.
    root = _root(tmp_path, None)
    plan = _plan(tmp_path, root)
    assert plan["vllm_rules"] == "0.20.1" and "vllm0.20.1-rocm7.12.0-gfx1151" in plan["vllm_version_source"]
    model = tmp_path / "model"
    text = CliRunner().invoke(cli, ["--root", str(root), "plan", "--model", str(model), "--memory", "96GiB"])
    assert "vLLM rules" in text.output and "0.20.1 (no bundle installed" in text.output


def test_an_installed_version_without_rules_is_exit_2_naming_it(tmp_path: Path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(GEMMA2))
    root = _root(tmp_path, "0.25.2.dev0+rocm7.15.0")
    result = CliRunner().invoke(
        cli, ["--root", str(root), "plan", "--model", str(model), "--memory", "96GiB"]
    )
    assert result.exit_code == 2, result.output
    assert "vLLM 0.25.2.dev0+rocm7.15.0" in result.output and "0.32.0" in result.output
    assert "Traceback" not in result.output


def _gemma3_27b(tmp_path: Path) -> str:
    """Gemma 3 27B's real config (5 sliding : 1 full, window 1024) with a header-only safetensors file of
    its real size in bf16 (27.4 B parameters; only the header is read)."""
    import struct

    from conftest import FIXTURES

    model = tmp_path / "gemma-3-27b-it"
    model.mkdir()
    shutil.copy(FIXTURES / "model_configs/gemma-3-27b-it/config.json", model / "config.json")
    rows = 27_432_406_640 // 5376
    header = {"w": {"dtype": "BF16", "shape": [rows, 5376], "data_offsets": [0, rows * 5376 * 2]}}
    blob = json.dumps(header).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob)
    return str(model)


def _unit_seqs(root: Path, model: str) -> tuple[str, list[str]]:
    result = CliRunner().invoke(cli, ["--root", str(root), "unit", "--model", model, "--json"])
    assert result.exit_code == 0, result.output
    args = json.loads(result.output)["server_args"]
    reason = next(s["reason"] for s in args["settings"] if s["flag"] == "--max-num-seqs")
    return reason, args["notes"]


def test_unit_sizes_with_the_installed_bundles_vllm(tmp_path: Path):
    model = _gemma3_27b(tmp_path)
    newest, newest_notes = _unit_seqs(_root(tmp_path / "a", None), model)
    old, old_notes = _unit_seqs(_root(tmp_path / "b", "0.20.1+rocm7.12.0"), model)
    # The sequences the KV cache holds (before the APU cap of 10): 0.20.1 keeps one batch beyond each
    # sliding window, 0.32 two, so 0.20.1's figure is larger; the default path says nothing new.
    assert int(old.split()[0]) > int(newest.split()[0]), (old, newest)
    assert not any("KV-cache rules" in n for n in newest_notes)
    assert any(
        "sized by vLLM 0.20.1+rocm7.12.0's KV-cache rules (the bundle installed under" in n for n in old_notes
    )


def test_a_hostile_installed_version_is_refused_shown_bounded(tmp_path: Path):
    # the dist-info is the bundle's own text: an escape sequence and 5000 characters are not echoed
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(GEMMA2))
    root = _root(tmp_path, "\x1b[31m" + "9" * 5000)
    result = CliRunner().invoke(
        cli, ["--root", str(root), "plan", "--model", str(model), "--memory", "96GiB"]
    )
    assert result.exit_code == 2, result.output
    assert "\x1b" not in result.output and "9" * 100 not in result.output
    assert "cannot plan exactly for vLLM '\\x1b[31m" in result.output and "Traceback" not in result.output
