"""Wall time of `rocmdoctor plan --offline` on a model in a Hugging Face cache: Llama 3.1 8B's real
config.json and four sparse safetensors shards whose headers list its 291 tensors at their real shapes
(the weights are holes: nothing but the headers is ever read).

    .venv/bin/python tests/bench/plan_speed.py [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "tests/fixtures/model_configs/llama-3.1-8b-instruct/config.json"
MODEL_ID = "meta-llama/Llama-3.1-8B-Instruct"


def llama_tensors(cfg: dict) -> list[tuple[str, list[int]]]:
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    out = [("model.embed_tokens.weight", [vocab, h])]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", [h, h]),
            (p + "self_attn.k_proj.weight", [kv, h]),
            (p + "self_attn.v_proj.weight", [kv, h]),
            (p + "self_attn.o_proj.weight", [h, h]),
            (p + "mlp.gate_proj.weight", [inter, h]),
            (p + "mlp.up_proj.weight", [inter, h]),
            (p + "mlp.down_proj.weight", [h, inter]),
            (p + "input_layernorm.weight", [h]),
            (p + "post_attention_layernorm.weight", [h]),
        ]
    return out + [("model.norm.weight", [h]), ("lm_head.weight", [vocab, h])]


def write_cache(root: Path) -> int:
    cfg = json.loads(CONFIG.read_text())
    tensors = llama_tensors(cfg)
    shards = [tensors[i::4] for i in range(4)]
    snapshot = root / ("models--" + MODEL_ID.replace("/", "--")) / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("c" * 40)
    (snapshot / "config.json").write_bytes(CONFIG.read_bytes())
    weight_map, total = {}, 0
    for n, shard in enumerate(shards, 1):
        name = f"model-{n:05d}-of-00004.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for tensor, shape in shard:
            size = 2 * shape[0] * (shape[1] if len(shape) > 1 else 1)
            header[tensor] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[tensor] = name
        blob = json.dumps(header).encode()
        with open(snapshot / name, "wb") as stream:
            stream.write(struct.pack("<Q", len(blob)) + blob)
            stream.truncate(8 + len(blob) + offset)  # a sparse file of the real size
        total += offset
    (snapshot / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        weights = write_cache(Path(tmp) / "hub")
        env = {**os.environ, "HF_HUB_CACHE": str(Path(tmp) / "hub")}
        argv = [
            sys.executable,
            "-m",
            "rocmdoctor",
            "--root",
            tmp,
            "plan",
            "--model",
            MODEL_ID,
            "--offline",
            "--memory",
            "24GiB",
            "--json",
        ]
        walls = []
        for _ in range(args.runs):
            started = time.perf_counter()
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            walls.append(time.perf_counter() - started)
            if proc.returncode not in (0, 1):
                sys.exit(f"plan exited {proc.returncode}: {proc.stderr[-500:]}")
        doc = json.loads(proc.stdout)
        assert doc["weights_bytes"] == weights, (doc["weights_bytes"], weights)
        # in-process: the plan itself, without the interpreter's start
        sys.path.insert(0, str(REPO / "src"))
        from rocmdoctor.vllm.memory_plan import GIB, Memory, plan_model, weights_from_headers
        from rocmdoctor.vllm.model_files import local_model

        inner = []
        for _ in range(args.runs):
            started = time.perf_counter()
            files = local_model(MODEL_ID, env=env)
            assert files is not None
            plan_model(
                MODEL_ID,
                files.config,
                weights_from_headers(files.headers),
                Memory(24 * GIB, 0.92, "--memory"),
            )
            inner.append(time.perf_counter() - started)
    print(f"weights {weights} B from 4 shard headers; {args.runs} runs")
    print(
        f"whole command (python -m rocmdoctor plan --offline): median {statistics.median(walls):.3f} s, "
        f"max {max(walls):.3f} s"
    )
    print(
        f"plan itself (read cache + headers + arithmetic): median {statistics.median(inner) * 1000:.1f} ms, "
        f"max {max(inner) * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
