"""`plan`'s leftovers of issue 35: hostile sizes and shard names are clear exit-2 errors, and a model
one node cannot hold is told how many nodes would hold it without `--nodes`."""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path

from conftest import FIXTURES
from harness.cli import rocmdoctor

LLAMA_70B = FIXTURES / "model_configs" / "llama-3.1-70b-instruct" / "config.json"


def header_only_model(directory: Path, parameters: int, shard: str = "model.safetensors") -> Path:
    """Llama-3.1-70B's real config.json and one safetensors header declaring `parameters` bf16 weights
    (the plan reads headers only)."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(LLAMA_70B.read_bytes())
    header = {"w": {"dtype": "BF16", "shape": [parameters], "data_offsets": [0, 2 * parameters]}}
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    (directory / shard).write_bytes(struct.pack("<Q", len(blob)) + blob)
    return directory


def test_a_400_digit_memory_is_a_clear_error(tmp_path: Path):
    model = header_only_model(tmp_path / "m", 1000)
    for option in ("--memory", "--kv-cache-memory"):
        done = rocmdoctor("plan", "--model", str(model), option, "9" * 400, root=tempfile.mkdtemp())
        assert done.returncode == 2, done.stderr
        assert "larger than any GPU" in done.stderr and "Traceback" not in done.stderr + done.stdout


def test_a_300_character_shard_name_is_a_clear_error(tmp_path: Path):
    model = header_only_model(tmp_path / "m", 1000)
    index = {"weight_map": {"w": "x" * 288 + ".safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    done = rocmdoctor("plan", "--model", str(model), "--memory", "24GiB", root=tempfile.mkdtemp())
    assert done.returncode == 2, done.stderr
    assert "longer than a file name can be" in done.stderr
    assert "File name too long" not in done.stderr and "Traceback" not in done.stderr


def test_plan_says_how_many_nodes_would_hold_it_without_being_asked(tmp_path: Path):
    model = header_only_model(tmp_path / "llama-70b", 70_553_706_496)
    # two 64 GiB GPUs per node: 131 GiB of weights fit no single node; two nodes hold them
    args = ["plan", "--model", str(model), "--memory", "64GiB", "--tensor-parallel-size", "2"]
    alone = rocmdoctor(*args, "--max-model-len", "8192", "--json", root=tempfile.mkdtemp())
    assert alone.returncode == 1
    doc = json.loads(alone.stdout)
    assert doc["cluster"] is None  # --nodes was not asked: no proposal
    assert doc["across_nodes"] == {
        "nodes": 2,
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 2,
        "searched": 8,
    }
    text = rocmdoctor(*args, "--max-model-len", "8192", root=tempfile.mkdtemp())
    assert text.returncode == 1
    assert "across nodes: fits 2 nodes of 2 GPU(s)" in text.stdout and "pass --nodes 2" in text.stdout
    tiny = rocmdoctor(
        "plan", "--model", str(model), "--memory", "1GiB", "--max-model-len", "8192", root=tempfile.mkdtemp()
    )
    assert tiny.returncode == 1 and "does not fit 8 nodes of 1 GPU(s) either" in tiny.stdout
    # no weights: nothing to say about nodes
    (model / "model.safetensors").unlink()
    unknown = rocmdoctor(*args, "--max-model-len", "8192", "--json", root=tempfile.mkdtemp())
    assert json.loads(unknown.stdout)["across_nodes"] is None
