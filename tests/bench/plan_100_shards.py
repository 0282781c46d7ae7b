"""CPU time and memory of `rocmdoctor plan` reading the headers of a 100-shard model.

The model: DeepSeek V3's real config.json (tests/fixtures/model_configs/deepseek-v3) and 100 sparse
safetensors shards whose headers list its ~47,000 tensors (61 layers, 256 routed experts of three
matrices each, attention and norms) at their real shapes; the weights are holes, only headers are read.
The budget (issue 22): the headers read in under 0.5 s of CPU and 100 MiB.

    .venv/bin/python tests/bench/plan_100_shards.py [--runs 5]

Prints, per run: the CPU seconds and the Python heap peak (tracemalloc) of reading config, index and the
100 headers in a fresh interpreter, and the whole command's CPU seconds and peak RSS. Exits 1 over budget.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "tests/fixtures/model_configs/deepseek-v3/config.json"
SHARDS = 100
CPU_BUDGET_S = 0.5
MEMORY_BUDGET_MIB = 100

READ_HEADERS = """
import json, sys, time, tracemalloc, resource
trace = sys.argv[2] == "trace"  # tracemalloc slows every allocation: CPU is timed in an untraced run
if trace:
    tracemalloc.start()
started = time.process_time()
from rocmdoctor.vllm.model_files import local_model
files = local_model(sys.argv[1])
weights = sum(h.tensor_bytes for h in files.headers)
cpu = time.process_time() - started
peak = tracemalloc.get_traced_memory()[1] if trace else 0
print(json.dumps({"cpu_s": cpu, "heap_peak": peak, "weights": weights, "shards": len(files.headers),
                  "tensors": sum(h.tensors for h in files.headers),
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def tensors(cfg: dict) -> list[tuple[str, list[int]]]:
    h, vocab, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    moe, experts = cfg["moe_intermediate_size"], cfg["n_routed_experts"]
    heads, rope, nope, v = (
        cfg["num_attention_heads"],
        cfg["qk_rope_head_dim"],
        cfg["qk_nope_head_dim"],
        cfg["v_head_dim"],
    )
    q_rank, kv_rank = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    out = [("model.embed_tokens.weight", [vocab, h])]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_a_proj.weight", [q_rank, h]),
            (p + "self_attn.q_b_proj.weight", [heads * (nope + rope), q_rank]),
            (p + "self_attn.kv_a_proj_with_mqa.weight", [kv_rank + rope, h]),
            (p + "self_attn.kv_b_proj.weight", [heads * (nope + v), kv_rank]),
            (p + "self_attn.o_proj.weight", [h, heads * v]),
            (p + "input_layernorm.weight", [h]),
            (p + "post_attention_layernorm.weight", [h]),
        ]
        if i < cfg["first_k_dense_replace"]:
            out += [(p + f"mlp.{m}_proj.weight", [inter, h]) for m in ("gate", "up", "down")]
            continue
        for e in range(experts):
            out += [(p + f"mlp.experts.{e}.{m}_proj.weight", [moe, h]) for m in ("gate", "up", "down")]
        out += [(p + f"mlp.shared_experts.{m}_proj.weight", [moe, h]) for m in ("gate", "up", "down")]
        out.append((p + "mlp.gate.weight", [experts, h]))
    return out + [("model.norm.weight", [h]), ("lm_head.weight", [vocab, h])]


def write_model(directory: Path) -> tuple[int, int]:
    cfg = json.loads(CONFIG.read_text())
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(CONFIG.read_bytes())
    every = tensors(cfg)
    weight_map, total = {}, 0
    for n in range(SHARDS):
        name = f"model-{n + 1:05d}-of-{SHARDS:05d}.safetensors"
        header: dict = {"__metadata__": {"format": "pt"}}
        offset = 0
        for tensor, shape in every[n::SHARDS]:
            size = 1
            for dim in shape:
                size *= dim
            header[tensor] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + 2 * size]}
            offset += 2 * size
            weight_map[tensor] = name
        blob = json.dumps(header).encode()
        with open(directory / name, "wb") as stream:
            stream.write(struct.pack("<Q", len(blob)) + blob)
            stream.truncate(8 + len(blob) + offset)  # sparse: the real size, no weight bytes written
        total += offset
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return total, len(every)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    over = False
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        weights, count = write_model(model)
        print(f"{SHARDS} shards, {count} tensors, {weights / 2**30:.0f} GiB of (sparse) weights")
        reads, commands = [], []
        for _ in range(args.runs):
            doc = {}
            for mode in ("trace", "time"):
                done = subprocess.run(
                    [sys.executable, "-c", READ_HEADERS, str(model), mode],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                doc = {**json.loads(done.stdout), **({"heap_peak": doc["heap_peak"]} if doc else {})}
            assert doc["weights"] == weights and doc["shards"] == SHARDS and doc["tensors"] == count
            reads.append(doc)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            argv = [sys.executable, "-m", "rocmdoctor", "--root", tmp, "plan", "--model", str(model)]
            proc = subprocess.run(
                [*argv, "--memory", "96GiB", "--tensor-parallel-size", "8", "--json"],
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ},
            )
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            assert proc.returncode in (0, 1), proc.stderr[-500:]
            assert json.loads(proc.stdout)["weights_bytes"] == weights
            commands.append(
                (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, after.ru_maxrss / 1024)
            )
    cpu = [r["cpu_s"] for r in reads]
    heap = [r["heap_peak"] / 2**20 for r in reads]
    rss = [r["maxrss_kib"] / 1024 for r in reads]
    print(
        f"reading config + index + {SHARDS} headers (fresh interpreter, imports included): "
        f"CPU median {statistics.median(cpu):.3f} s, max {max(cpu):.3f} s; "
        f"Python heap peak {max(heap):.1f} MiB; process max RSS {max(rss):.1f} MiB"
    )
    print(
        f"whole `rocmdoctor plan --json` command: CPU median {statistics.median(c for c, _ in commands):.3f} s, "
        f"max RSS {max(m for _, m in commands):.1f} MiB"
    )
    if max(cpu) > CPU_BUDGET_S or max(rss) > MEMORY_BUDGET_MIB:
        print(f"OVER BUDGET ({CPU_BUDGET_S} s CPU, {MEMORY_BUDGET_MIB} MiB)")
        over = True
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
