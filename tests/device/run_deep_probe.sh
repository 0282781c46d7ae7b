#!/usr/bin/env bash
# The deep probe on a real accelerator (the NVIDIA H100/H200 device machine; torch.cuda is the same
# API on ROCm). Run from the tree's root with python3 = an interpreter that has torch and the GPU:
#   WHEELS=<dir with rocmdoctor-*.whl and distro-*.whl> OUT=<results dir> bash tests/device/run_deep_probe.sh
# It prints nvidia-smi, holds 20 GiB in another process, runs the probe, checks the recommended
# --gpu-memory-utilization against vLLM's rule and real allocations (tests/device/verify_deep_probe.py),
# compares bf16 matmul and copy speed with the datasheet peaks (>= 70% needed), and runs
# `rocmdoctor check --deep --python $(which python3) --json` end to end. Exit 0 only if all of it holds.
set -uo pipefail
OUT=${OUT:-$PWD/deep-out}
WHEELS=${WHEELS:-$PWD/wheels}
HOLD_GIB=${HOLD_GIB:-20}
mkdir -p "$OUT"
PY=$(command -v python3)
export PYTHONUNBUFFERED=1

nvidia-smi 2>&1 | tee "$OUT/nvidia-smi.txt"
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "devices", torch.cuda.device_count())' || { echo "no torch with a GPU here"; exit 1; }

# rocmdoctor itself (and distro, which the image lacks) into a private folder; the probe that
# rocmdoctor starts never sees this PYTHONPATH (it runs with the environment `serve` uses).
site=$(mktemp -d /tmp/deep-site.XXXXXX)
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl || exit 1
export PYTHONPATH=$site

# Another process holds memory, as a second tenant would; it says "held" once the memory is real.
start_holder() {
    "$PY" tests/device/hold_gpu_memory.py "$@" > /tmp/deep-holder.log 2>&1 &
    holder=$!
    for _ in $(seq 120); do grep -q held /tmp/deep-holder.log && break; sleep 0.5; done
    cat /tmp/deep-holder.log
    grep -q held /tmp/deep-holder.log || { echo "the holder never held its memory"; kill "$holder"; exit 1; }
}
stop_holder() { kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null; }
start_holder hold "$HOLD_GIB"

status=0
"$PY" tests/device/verify_deep_probe.py --out "$OUT" --held-gib "$HOLD_GIB" || status=1

echo "== rocmdoctor check --deep --python $PY --json"
started=$(date +%s%N)
"$PY" -m rocmdoctor check --deep --python "$PY" --json > "$OUT/check-deep.json" 2> "$OUT/check-deep.stderr"
echo "check exit code $? in $(( ($(date +%s%N) - started) / 1000000 )) ms"
"$PY" - "$OUT/check-deep.json" <<'PYEOF' || status=1
import json, sys
report = json.load(open(sys.argv[1]))
deep = {c["id"]: c for c in report["checks"] if c["id"] in ("gpu.runtime", "gpu.memory_fit", "gpu.compute")}
for cid, c in deep.items():
    print(f"{cid:<16} {c['status']:<5} {c['summary']}")
assert set(deep) == {"gpu.runtime", "gpu.memory_fit", "gpu.compute"}, deep.keys()
assert all(c["status"] == "pass" for c in deep.values()), "a deep check did not pass"
PYEOF

stop_holder

# A GPU nearly full (all but 3 GiB taken): gpu.memory_fit must fail with a reason, the others pass.
echo "== nearly full: rocmdoctor check --deep with all but 3 GiB held"
start_holder leave 3
"$PY" -m rocmdoctor check --deep --python "$PY" --json > "$OUT/check-deep-full.json" 2> /tmp/deep-full.stderr
echo "check exit code $?"
"$PY" - "$OUT/check-deep-full.json" <<'PYEOF' || status=1
import json, sys
report = json.load(open(sys.argv[1]))
deep = {c["id"]: c for c in report["checks"] if c["id"].startswith("gpu.")}
for cid, c in deep.items():
    print(f"{cid:<16} {c['status']:<5} {c['summary']}\n{'':<22} remedy: {c['remedy']}")
assert deep["gpu.runtime"]["status"] == "pass"
assert deep["gpu.memory_fit"]["status"] == "fail", "a nearly full GPU must fail gpu.memory_fit"
assert report["exit_code"] == 1
PYEOF
stop_holder
echo "== overall: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
