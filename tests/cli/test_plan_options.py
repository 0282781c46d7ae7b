"""`plan`'s engine options with vLLM's names, the assumptions it reports and its refusal of models it
cannot plan exactly, in-process (click's CliRunner) on model directories written by the test."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from harness.tiny_model_builder import arch_config
from rocmdoctor.cli import cli

# the engine test's tiny Granite-4.0-H: three Mamba2 layers, then attention (legacy names)
GRANITE_H = {**arch_config("granitehybrid", 64), "dtype": "bfloat16"}


def model_dir(tmp_path: Path, config: dict) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def plan_json(model: Path, *options: str) -> dict:
    result = CliRunner().invoke(
        cli,
        [
            "plan",
            "--model",
            str(model),
            "--kv-cache-memory",
            "1GiB",
            "--max-model-len",
            "512",
            "--json",
            *options,
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_prefix_caching_and_the_mamba_dtypes_change_a_hybrids_plan(tmp_path: Path):
    model = model_dir(tmp_path, GRANITE_H)
    on = plan_json(model, "--block-size", "128", "--mamba-ssm-cache-dtype", "float32")
    off = plan_json(
        model, "--block-size", "128", "--mamba-ssm-cache-dtype", "float32", "--no-enable-prefix-caching"
    )
    # state 67840 B -> block 384 (1 KV head x 128 x 2 B = 256 B a token); 1 GiB // (384 x 256) = 10922 blocks
    assert on["block_size"] == off["block_size"] == 384 and on["block_size_requested"] == 128
    # per request: cdiv(512, 384) = 2 + 3 state groups x 3 blocks ("align") or x 1 ("none")
    assert on["max_concurrency"] == round(10922 / 11, 2)
    assert off["max_concurrency"] == round(10922 / 5, 2)
    assert on["enable_prefix_caching"] is True and off["enable_prefix_caching"] is False
    assert any("'align', 3 block(s)" in a for a in on["assumptions"])
    assert any("'none', 1 block(s)" in a for a in off["assumptions"])
    # a bfloat16 SSM state (vLLM's auto here) halves it: 2304 + 32768 B, 128 x cdiv(35072, 32768) = 256
    assert plan_json(model, "--block-size", "128")["block_size"] == 256
    assert plan_json(model, "--block-size", "128", "--mamba-cache-dtype", "float32")["block_size"] == 384


def test_async_scheduling_and_pipeline_parallel_size_are_named_in_the_report(tmp_path: Path):
    cohere = {
        "architectures": ["Cohere2ForCausalLM"],
        "model_type": "cohere2",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 8,
        "sliding_window": 128,
        "sliding_window_pattern": 4,
        "max_position_embeddings": 8192,
        "dtype": "bfloat16",
    }
    model = model_dir(tmp_path, cohere)
    two = plan_json(model, "--max-model-len", "8192")
    one = plan_json(model, "--max-model-len", "8192", "--no-async-scheduling")
    assert one["max_concurrency"] > two["max_concurrency"]
    assert any("2 batch(es) of 2048 tokens in flight" in a for a in two["assumptions"])
    assert any("1 batch(es) of 2048 tokens in flight" in a for a in one["assumptions"])
    pp = plan_json(model, "--max-model-len", "8192", "--pipeline-parallel-size", "2")
    assert pp["pipeline_parallel_size"] == 2 and any(
        "pipeline parallel size 2" in a for a in pp["assumptions"]
    )
    text = CliRunner().invoke(cli, ["plan", "--model", str(model), "--kv-cache-memory", "1GiB"]).output
    assert "assumes" in text and "sliding_window_pattern 4" in text


def test_a_model_it_cannot_plan_exactly_is_exit_2_with_what_is_missing(tmp_path: Path):
    unknown = {**GRANITE_H, "layer_types": ["mamba", "retention", "mamba", "attention"]}
    result = CliRunner().invoke(
        cli, ["plan", "--model", str(model_dir(tmp_path / "a", unknown)), "--memory", "24GiB"]
    )
    assert result.exit_code == 2
    assert "cannot plan this model exactly" in result.output and "'retention'" in result.output
    assert "Traceback" not in result.output
    no_state_size = {**GRANITE_H, "model_type": "brandnewhybrid"}
    result = CliRunner().invoke(
        cli, ["plan", "--model", str(model_dir(tmp_path / "b", no_state_size)), "--memory", "24GiB"]
    )
    assert result.exit_code == 2 and "brandnewhybrid" in result.output
