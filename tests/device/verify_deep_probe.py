"""Run the GPU probe on a real accelerator and hold its answers against reality.

Called by tests/device/run_deep_probe.sh while another process holds memory on the GPU. In a fresh
process after the probe (as vLLM would be), with mem_get_info measured at that moment:
- the probe's recommended --gpu-memory-utilization passes vLLM's rule, and a real allocation of
  what vLLM would request (ceil(total * value)) succeeds;
- it is within 0.02 of the largest value that passes;
- the largest passing value + 0.02 fails the rule, and allocating what it would request really fails;
- bf16 matmul TFLOP/s and device copy GB/s (median of the probe runs) reach at least 70% of the
  datasheet peak.
Writes probe.json and verify.json under --out; exits 1 when a claim does not hold.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from rocmdoctor.checks.deep import find_peak
from rocmdoctor.facts.deep_probe import probe_environment, probe_path
from rocmdoctor.vllm import memory_rule

STEP = 0.02
REQUIRED_SHARE = 0.70
GIB = 1 << 30


def try_allocate(nbytes: int) -> dict:
    """A plain device allocation (cudaMalloc under torch's allocator), touched, then freed."""
    try:
        block = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        block.fill_(7)
        torch.cuda.synchronize()
        ok, error = True, ""
        del block
    except torch.OutOfMemoryError as exc:
        ok, error = False, str(exc).splitlines()[0][:200]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return {"bytes": nbytes, "ok": ok, "error": error}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--held-gib", type=float, required=True)
    parser.add_argument(
        "--repeats", type=int, default=2, help="further probe runs, for the spread of the speeds"
    )
    args = parser.parse_args()

    # The first run is the one held against reality; the repeats (compute only) show the spread.
    runs = []
    for i in range(1 + args.repeats):
        argv = [sys.executable, probe_path()] + (["--skip-allocation", "--skip-extensions"] if i else [])
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=300, env=probe_environment(os.environ)
        )
        runs.append(json.loads(proc.stdout))
        if i == 0:
            (args.out / "probe.stderr").write_text(proc.stderr[-20000:])
    (args.out / "probe.json").write_text("".join(json.dumps(run, sort_keys=True) + "\n" for run in runs))
    probe = runs[0]
    claims: dict[str, bool] = {"probe printed one report without error": probe["error"] is None}
    if probe["error"] is not None:
        print(json.dumps(probe["error"], indent=1))
    memory = probe["memory"]
    rec = memory["recommended"]

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    free, total = (int(v) for v in torch.cuda.mem_get_info())
    largest = memory_rule.largest_passing(total, free)
    above = round(largest + STEP, 6)
    claims["probe agrees with rocmdoctor's rule on its own reading"] = rec == memory_rule.recommended(
        memory["total"], memory["free"]
    ) and memory["largest_passing"] == memory_rule.largest_passing(memory["total"], memory["free"])
    claims["holder's memory is missing from free"] = free <= total - args.held_gib * GIB
    claims["recommended passes the rule now"] = memory_rule.passes(total, free, rec)
    claims["recommended within 0.02 of the largest passing"] = 0 <= largest - rec <= STEP + 1e-9
    claims["largest + 0.02 fails the rule"] = not memory_rule.passes(total, free, above)
    at_rec = try_allocate(memory_rule.requested_bytes(total, rec))
    at_above = try_allocate(memory_rule.requested_bytes(total, above))
    at_largest = try_allocate(memory_rule.requested_bytes(total, largest))  # informational: no margin
    claims["allocating ceil(total * recommended) succeeds"] = at_rec["ok"]
    claims["allocating ceil(total * (largest + 0.02)) fails"] = not at_above["ok"]

    device = probe["devices"][memory["device"]]
    peak = find_peak(device["name"], device["arch"])
    compute = probe.get("compute") or {}
    speeds = {
        "tflops": [r["compute"]["matmul"]["tflops"] for r in runs if "copy" in r.get("compute", {})],
        "gbps": [r["compute"]["copy"]["gbps"] for r in runs if "copy" in r.get("compute", {})],
    }
    shares = {}
    if peak is not None and "copy" in compute:
        # Each run's own numbers are in probe.json; the claim is on the median run.
        shares = {
            "matmul": statistics.median(speeds["tflops"]) / peak.bf16_tflops,
            "copy": statistics.median(speeds["gbps"]) / peak.memory_gbps,
        }
    claims["a datasheet peak is known for the device"] = peak is not None
    claims["bf16 matmul >= 70% of peak"] = shares.get("matmul", 0) >= REQUIRED_SHARE
    claims["device copy >= 70% of peak"] = shares.get("copy", 0) >= REQUIRED_SHARE

    result = {
        "device": device,
        "torch": probe["torch"],
        "held_gib": args.held_gib,
        "probe": {
            "free": memory["free"],
            "total": memory["total"],
            "largest_passing": memory["largest_passing"],
            "recommended": rec,
            "allocation": memory.get("allocation"),
            "seconds": probe["seconds"],
        },
        "now": {
            "free": free,
            "total": total,
            "largest_passing": largest,
            "recommended": memory_rule.recommended(total, free),
            "rec_plus_step_passes": memory_rule.passes(total, free, round(rec + STEP, 6)),
        },
        "allocations": {"recommended": at_rec, "largest_plus_step": at_above, "largest": at_largest},
        "compute": compute,
        "speeds_per_run": speeds,
        "peak": peak.__dict__ if peak else None,
        "share_of_peak": {k: round(v, 3) for k, v in shares.items()},
        "claims": claims,
    }
    (args.out / "verify.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")

    print(
        f"device {device['name']} ({device['arch']}), torch {probe['torch']['version']}, "
        f"another process holds {args.held_gib:g} GiB"
    )
    print(
        f"probe: free {memory['free'] / GIB:.2f} of {memory['total'] / GIB:.2f} GiB, largest passing "
        f"{memory['largest_passing']:.2f}, recommended {rec:.2f}, probe took {probe['seconds']:.1f} s"
    )
    print(
        f"now:   free {free / GIB:.2f} GiB, largest passing {largest:.2f}; allocations: "
        f"recommended {at_rec['ok']}, largest {at_largest['ok']}, largest+0.02 {at_above['ok']}"
    )
    if shares:
        print(
            f"bf16 matmul TFLOP/s per run {speeds['tflops']}: median {shares['matmul']:.1%} of "
            f"{peak.bf16_tflops:g}; copy GB/s per run {speeds['gbps']}: median {shares['copy']:.1%} of "
            f"{peak.memory_gbps:g} ({peak.label})"
        )
    for claim, held in claims.items():
        print(f"  [{'ok' if held else 'FAILED'}] {claim}")
    return 0 if all(claims.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
