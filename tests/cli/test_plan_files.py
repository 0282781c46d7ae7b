"""Reading a model without its weights: local directories, the Hugging Face cache offline, and the Hub by
HTTP range requests against a loopback Hub (tests/harness/fake_hub.py) that counts the bytes it sends."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import FIXTURES
from harness.cli import rocmdoctor
from harness.fake_hub import GOOD_TOKEN, fake_hub, safetensors_bytes
from rocmdoctor.provision.server.hub import HubError, fetch_model
from rocmdoctor.vllm.memory_plan import weights_from_headers
from rocmdoctor.vllm.model_files import (
    MAX_HEADER_BYTES,
    ModelFilesError,
    cached_snapshot,
    local_model,
    read_config,
    read_header,
)

CONFIGS = FIXTURES / "model_configs"
MODEL_ID = "loopback-org/tiny-llama"
SHARD_TENSORS = [
    {
        "model.embed_tokens.weight": ("BF16", [512, 256]),
        "model.layers.0.self_attn.q_proj.weight": ("BF16", [256, 256]),
    },
    {
        "model.layers.0.mlp.up_proj.weight": ("BF16", [512, 256]),
        "model.norm.weight": ("F32", [256]),
        "lm_head.weight": ("F8_E4M3", [512, 256]),
    },
]
# by hand: 512x256x2 + 256x256x2 = 393216; 512x256x2 + 256x4 + 512x256x1 = 394240
EXPECTED_WEIGHTS = 393216 + 394240


def tiny_files() -> dict[str, bytes]:
    config = (CONFIGS / "llama-3.1-8b-instruct" / "config.json").read_bytes()
    shards = {
        f"model-0000{i + 1}-of-00002.safetensors": safetensors_bytes(t) for i, t in enumerate(SHARD_TENSORS)
    }
    index = {
        "metadata": {"total_size": EXPECTED_WEIGHTS},
        "weight_map": {
            name: shard for shard, tensors in zip(shards, SHARD_TENSORS, strict=False) for name in tensors
        },
    }
    return {"config.json": config, "model.safetensors.index.json": json.dumps(index).encode(), **shards}


def header_bytes(content: bytes) -> int:
    return 8 + struct.unpack("<Q", content[:8])[0]


def write_dir(directory: Path, files: dict[str, bytes]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (directory / name).write_bytes(content)
    return directory


def write_cache(hub_cache: Path, model_id: str, files: dict[str, bytes], commit: str = "a" * 40) -> Path:
    """The layout huggingface_hub writes: blobs, a snapshot of symlinks, refs/main."""
    repo = hub_cache / ("models--" + model_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for i, (name, content) in enumerate(files.items()):
        blob = repo / "blobs" / f"blob{i}"
        blob.write_bytes(content)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # An empty root: a host without any GPU.
    return rocmdoctor(*args, root=tempfile.mkdtemp(prefix="plan-root-"), env=env)


def test_local_directory_weights_exact_from_sharded_headers(tmp_path: Path):
    files = local_model(str(write_dir(tmp_path / "m", tiny_files())))
    assert files is not None and files.source == "local directory"
    assert weights_from_headers(files.headers) == EXPECTED_WEIGHTS


def test_hf_cache_offline_honours_hf_hub_cache(tmp_path: Path):
    snapshot = write_cache(tmp_path / "hub", MODEL_ID, tiny_files())
    env = {"HF_HUB_CACHE": str(tmp_path / "hub")}
    assert cached_snapshot(MODEL_ID, env=env) == snapshot
    files = local_model(MODEL_ID, env=env)
    assert files is not None and files.source == "Hugging Face cache"
    assert weights_from_headers(files.headers) == EXPECTED_WEIGHTS
    # HF_HOME/hub is the default when HF_HUB_CACHE is unset
    assert cached_snapshot(MODEL_ID, env={"HF_HOME": str(tmp_path)}) == snapshot
    assert local_model("other-org/absent", env=env) is None


def test_missing_shard_leaves_weights_unknown_with_the_reason(tmp_path: Path):
    files = tiny_files()
    del files["model-00002-of-00002.safetensors"]
    model = local_model(str(write_dir(tmp_path / "m", files)))
    assert model is not None and not model.headers
    assert "1 of 2 shards" in (model.weights_note or "")


@pytest.mark.parametrize(
    "content, message",
    [
        (struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}", "header length"),
        (struct.pack("<Q", 0), "header length"),
        (b"\x01\x02", "shorter than 8 bytes"),
        (struct.pack("<Q", 100) + b"{}", "truncated"),
        (struct.pack("<Q", 4) + b"nope", "the safetensors header: not valid JSON"),
        (struct.pack("<Q", 2) + b"[]", "the safetensors header: Expected `object`, got `array`"),
    ],
)
def test_hostile_safetensors_headers_are_refused_without_reading_on(
    tmp_path: Path, content: bytes, message: str
):
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(ModelFilesError, match=message):
        read_header(path)


@pytest.mark.parametrize(
    "content, message",
    [(b"{nope", r"config.json: not valid JSON \("), (b"[1]", "config.json: Expected `object`, got `array`")],
)
def test_a_config_that_is_not_a_json_object_is_refused(tmp_path: Path, content: bytes, message: str):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(ModelFilesError, match=message):
        read_config(path)


def test_hub_fetches_headers_only(tmp_path: Path):
    files = tiny_files()
    with fake_hub({MODEL_ID: files}) as hub:
        model = fetch_model(MODEL_ID, endpoint=hub.url, env={"HF_HOME": str(tmp_path)})
    assert weights_from_headers(model.headers) == EXPECTED_WEIGHTS
    for name, content in files.items():
        if name.endswith(".safetensors"):
            # exactly the 8-byte length and the JSON header left the server; not one weight byte
            assert hub.sent[name] == header_bytes(content) < len(content)
    ranges = [r for path, r in hub.requests if path.startswith("/cdn/")]
    assert ranges and all(r and r.startswith("bytes=") for r in ranges)


def test_hub_that_ignores_range_is_read_only_up_to_the_header(tmp_path: Path):
    files = tiny_files()
    with fake_hub({MODEL_ID: files}, mode="no-range") as hub:
        model = fetch_model(MODEL_ID, endpoint=hub.url, env={"HF_HOME": str(tmp_path)})
    assert weights_from_headers(model.headers) == EXPECTED_WEIGHTS
    shard_total = sum(header_bytes(c) for n, c in files.items() if n.endswith(".safetensors"))
    json_total = sum(len(c) for n, c in files.items() if not n.endswith(".safetensors"))
    # first request: 8 bytes; second: bytes 0..8+N-1 (the server starts at 0), never the weights
    assert model.bytes_read <= json_total + 2 * shard_total + 64 << 10


def test_gated_repo_without_token_says_how_to_get_access(tmp_path: Path):
    with fake_hub({MODEL_ID: tiny_files()}, mode="gated") as hub:
        with pytest.raises(HubError, match="gated or private.*HTTP 401.*no token was sent: set HF_TOKEN"):
            fetch_model(MODEL_ID, endpoint=hub.url, env={"HF_HOME": str(tmp_path)})
        with pytest.raises(HubError, match="HTTP 403.*was refused"):
            fetch_model(MODEL_ID, endpoint=hub.url, env={"HF_TOKEN": "hf_wrong", "HF_HOME": str(tmp_path)})
        (tmp_path / "token").write_text(GOOD_TOKEN + "\n")
        model = fetch_model(MODEL_ID, endpoint=hub.url, env={"HF_HOME": str(tmp_path)})
    assert weights_from_headers(model.headers) == EXPECTED_WEIGHTS


def test_dripping_hub_is_cut_off_by_the_total_deadline(tmp_path: Path):
    with fake_hub({MODEL_ID: tiny_files()}, mode="drip") as hub:
        started = time.monotonic()
        with pytest.raises(HubError, match="within 3 s"):
            fetch_model(MODEL_ID, endpoint=hub.url, env={"HF_HOME": str(tmp_path)}, deadline_s=3)
        assert time.monotonic() - started < 3 + 11  # the deadline plus at most one socket timeout


def test_cli_plan_from_the_hub_json(tmp_path: Path):
    from rocmdoctor.model import SCHEMA_VERSION

    with fake_hub({MODEL_ID: tiny_files()}) as hub:
        result = run_cli(
            "plan",
            "--model",
            MODEL_ID,
            "--memory",
            "24GiB",
            "--max-model-len",
            "8192",
            "--json",
            env={"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path), "HF_HUB_CACHE": str(tmp_path / "c")},
        )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["weights_bytes"] == EXPECTED_WEIGHTS
    assert doc["kv_bytes_per_token"] == 32 * 2 * 8 * 128 * 2
    for key in ("kv_cache_tokens", "max_model_len", "max_num_seqs", "fits", "reasons"):
        assert key in doc
    assert doc["fits"] is True and doc["max_model_len"] > 8192


def test_cli_gated_and_bad_input_exit_2_without_traceback(tmp_path: Path):
    with fake_hub({MODEL_ID: tiny_files()}, mode="gated") as hub:
        gated = run_cli(
            "plan",
            "--model",
            MODEL_ID,
            "--memory",
            "24GiB",
            env={
                "HF_ENDPOINT": hub.url,
                "HF_HOME": str(tmp_path),
                "HF_HUB_CACHE": str(tmp_path / "c"),
                "HF_TOKEN": "",
            },
        )
    assert gated.returncode == 2 and "gated or private" in gated.stderr and "Traceback" not in gated.stderr
    cases = [
        (["plan"], "pass --model"),
        (["plan", "--model", str(tmp_path)], "has no config.json"),
        (["plan", "--model", "not a model id!"], "neither a directory nor a Hugging Face id"),
        (["plan", "--model", "org/absent", "--offline"], "not in the Hugging Face cache"),
        (["plan", "--model", str(CONFIGS / "qwen3-8b"), "--memory", "lots"], "not a size"),
        (
            [
                "plan",
                "--model",
                str(CONFIGS / "qwen3-8b"),
                "--max-model-len",
                "0",
                "--kv-cache-memory",
                "1GiB",
            ],
            "'0' is out of range",
        ),
    ]
    for args, message in cases:
        result = run_cli(*args, env={"HF_HUB_CACHE": str(tmp_path / "c")})
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)


def test_cli_without_gpu_prints_model_figures_and_nulls(tmp_path: Path):
    model = shutil.copytree(CONFIGS / "deepseek-v3", tmp_path / "ds")
    result = run_cli("plan", "--model", str(model), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["kv_bytes_per_token"] == 61 * (512 + 64) * 2
    assert doc["weights_bytes"] is None and doc["kv_cache_tokens"] is None and doc["fits"] is None
    assert doc["null_reason"]


def test_cli_does_not_fit_exits_1_with_remedies(tmp_path: Path):
    write_dir(tmp_path / "m", tiny_files())
    result = run_cli("plan", "--model", str(tmp_path / "m"), "--kv-cache-memory", "4GiB")
    assert result.returncode == 1, result.stderr
    assert "DOES NOT FIT" in result.stdout and "--max-model-len 32752" in result.stdout
    # 4 GiB / 2 MiB blocks = 2048 blocks, 2047 usable x 16 tokens = 32752
    assert "--kv-cache-dtype fp8" in result.stdout


def test_weights_bytes_offline_for_check_never_asks_the_network(tmp_path: Path):
    from rocmdoctor.vllm.model_files import weights_bytes_offline

    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_ENDPOINT": "http://127.0.0.1:9"}
    write_cache(tmp_path / "hub", MODEL_ID, tiny_files())
    assert weights_bytes_offline(MODEL_ID, env=env) == EXPECTED_WEIGHTS
    assert weights_bytes_offline(str(write_dir(tmp_path / "d", tiny_files()))) == EXPECTED_WEIGHTS
    assert weights_bytes_offline("org/not-cached", env=env) is None
    assert weights_bytes_offline("not an id") is None


def test_cli_on_a_host_with_a_gpu_uses_the_free_memory_rule(tmp_path: Path):
    root = FIXTURES / "hosts" / "strix-halo-clean"
    write_dir(tmp_path / "m", tiny_files())
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocmdoctor",
            "--root",
            str(root),
            "plan",
            "--model",
            str(tmp_path / "m"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["memory_source"].startswith("host: node") and doc["gpu_memory_utilization"] > 0
    assert doc["kv_cache_tokens"] > 0 and doc["fits"] is True
