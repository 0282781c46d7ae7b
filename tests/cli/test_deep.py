"""`check --deep`: the GPU probe and the gpu.runtime / gpu.memory_fit / gpu.compute checks.

The probe always runs for real, by path, as rocmdoctor runs it. Its interpreter is the real vLLM
CPU environment (torch without a GPU), the project's own venv (no torch at all), a stand-in ROCm
torch over a described AMD GPU (tests/harness/fake_torch: no AMD GPU exists here), or a shell
script that hangs, crashes or prints garbage.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from harness.deep import GIB, RX_7900_XTX_NAME, STRIX_HALO, fake_rocm_python, rocm_gpu, shell_python
from rocmdoctor.checks import load_registry
from rocmdoctor.checks.deep import find_peak
from rocmdoctor.facts.deep_probe import probe_environment, probe_path
from rocmdoctor.host import Host
from rocmdoctor.model import Status
from rocmdoctor.registry import Context, Options
from rocmdoctor.vllm import memory_rule

DEEP_IDS = ("gpu.runtime", "gpu.memory_fit", "gpu.compute")
FIXTURES = REPO / "tests" / "fixtures" / "deep"


@pytest.fixture(scope="session")
def cpu_torch_python() -> str:
    """The real vLLM CPU engine environment (torch 2.13+cpu), built by tests/setup/30-vllm-env.sh."""
    cache = Path(os.environ.get("ROCMDOCTOR_TEST_CACHE", Path.home() / ".cache" / "rocmdoctor-test"))
    python = cache / "vllm-venv" / "bin" / "python"
    assert python.exists(), f"{python} is missing: run tests/setup/30-vllm-env.sh"
    return str(python)


def load_probe_module():
    spec = importlib.util.spec_from_file_location("rocmdoctor_gpu_probe", probe_path())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_probe(python: str, *args: str, timeout: float = 60) -> tuple[dict, subprocess.CompletedProcess]:
    proc = subprocess.run(
        [python, probe_path(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=probe_environment(os.environ),
    )
    return json.loads(proc.stdout), proc


def deep_results(
    python: Path | str | None, root: Path | str = "/", timeout: float = 60.0, prefix: str | None = None
):
    registry = load_registry()
    options = Options(python=str(python) if python else None, deep_timeout_s=timeout)
    if prefix:
        options.prefix = prefix
    ctx = Context(Host(Path(root)), options)
    outcomes = registry.run(ctx, registry.select(only=DEEP_IDS))
    return {o.spec.id: o.result for o in outcomes if o.spec.id in DEEP_IDS}


def rx7900xtx_root(tmp_path: Path) -> Path:
    """A host tree whose KFD topology holds the captured RX 7900 XTX (gfx1100) as node 1."""
    root = tmp_path / "rx7900xtx-root"
    node = root / "sys/class/kfd/kfd/topology/nodes/1"
    node.mkdir(parents=True)
    (node / "properties").write_text((FIXTURES / "kfd-properties-gfx1100-rx7900xtx.txt").read_text())
    return root


# -- the probe ---------------------------------------------------------------------------------


def test_probe_applies_the_one_memory_rule():
    """The probe loads rocmdoctor's memory_rule.py by path (it runs where rocmdoctor cannot be imported)."""
    rule = load_probe_module().load_memory_rule()
    assert Path(rule.__file__).samefile(memory_rule.__file__)
    assert rule.recommended(80 * GIB, 60 * GIB) == memory_rule.recommended(80 * GIB, 60 * GIB)


def test_memory_rule_imports_the_standard_library_only():
    """What the bundle's interpreter has: the rule may not import rocmdoctor or a third-party package."""
    tree = ast.parse(Path(memory_rule.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    assert not any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree))


def test_probe_without_its_memory_rule_says_so_in_its_document(tmp_path):
    lone = tmp_path / "pkg" / "probes" / "gpu_probe.py"
    lone.parent.mkdir(parents=True)
    lone.write_bytes(Path(probe_path()).read_bytes())
    proc = subprocess.run([sys.executable, str(lone)], capture_output=True, text=True, timeout=60)
    report = json.loads(proc.stdout)
    assert report["error"]["stage"] == "memory rule"
    assert str(tmp_path / "pkg" / "vllm" / "memory_rule.py") in report["error"]["message"]


@pytest.mark.system  # the real vLLM CPU environment's torch
def test_probe_with_cpu_only_torch_reports_no_gpu(cpu_torch_python):
    report, proc = run_probe(cpu_torch_python)
    assert proc.returncode == 0
    assert proc.stdout.count("\n") == 1  # one document, nothing else on stdout
    assert report["probe"] == "rocmdoctor-gpu"
    assert report["torch"]["version"].endswith("+cpu")
    assert (report["backend"], report["available"], report["device_count"]) == ("cpu", False, 0)
    assert report["error"]["stage"] == "runtime"
    assert "sees no GPU" in report["error"]["message"]


def test_probe_without_torch_says_so():
    report, proc = run_probe(sys.executable)  # the project's venv has no torch
    assert proc.returncode == 0
    assert report["error"]["stage"] == "import torch"
    assert (
        "ModuleNotFoundError" in report["error"]["message"] and sys.executable in report["error"]["message"]
    )


def test_probe_on_a_described_rocm_gpu(tmp_path):
    free = 100 * GIB
    python = fake_rocm_python(
        tmp_path / "fake", rocm_gpu(STRIX_HALO, free=free, tflops=45.0, gbps=210.0, chatter=True)
    )
    report, proc = run_probe(str(python))
    assert report["error"] is None, report["error"]
    assert "a native banner on stdout" in proc.stderr and "a warning on stdout" in proc.stderr
    assert report["backend"] == "rocm" and report["devices"][0]["arch"] == "gfx1151"
    memory = report["memory"]
    total = STRIX_HALO["total_memory"]
    assert memory["recommended"] == memory_rule.recommended(total, free)
    assert memory["largest_passing"] == memory_rule.largest_passing(total, free)
    assert memory["allocation"]["bytes"] == memory_rule.requested_bytes(total, memory["recommended"])
    assert memory["allocation"]["ok"] and memory["allocation"]["released"]
    assert memory["allocation"]["free_while_held"] == free - memory["allocation"]["bytes"]
    assert report["compute"]["matmul"]["tflops"] == pytest.approx(45.0, rel=1e-3)
    assert report["compute"]["copy"]["gbps"] == pytest.approx(210.0, rel=1e-3)
    assert report["extensions"] == {"vllm": None}


@pytest.mark.system  # the real vLLM CPU environment's torch
def test_probe_bad_arguments_still_print_one_document(cpu_torch_python):
    report, proc = run_probe(cpu_torch_python, "--margin-bytes", "lots")
    assert proc.returncode == 2
    assert report["error"]["stage"] == "arguments"


# -- the checks: what breaks -----------------------------------------------------------------


@pytest.mark.system  # the real vLLM CPU environment's torch
def test_cpu_only_torch_fails_gpu_runtime_end_to_end(cpu_torch_python):
    import jsonschema

    proc = subprocess.run(
        [sys.executable, "-m", "rocmdoctor", "check", "--deep", "--python", cpu_torch_python, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(proc.stdout)
    schema = json.loads((REPO / "src/rocmdoctor/schema/check-report.schema.json").read_text())
    jsonschema.validate(report, schema)
    checks = {c["id"]: c for c in report["checks"]}
    runtime = checks["gpu.runtime"]
    assert runtime["status"] == "fail"
    assert "sees no GPU" in runtime["summary"] and "cpu" in runtime["summary"]
    assert "CPU-only" in runtime["remedy"]
    assert checks["gpu.memory_fit"]["status"] == checks["gpu.compute"]["status"] == "skip"
    assert proc.returncode == 1


def test_without_deep_no_probe_runs(tmp_path):
    python = fake_rocm_python(tmp_path / "fake", rocm_gpu(STRIX_HALO, free=100 * GIB))
    proc = subprocess.run(
        [sys.executable, "-m", "rocmdoctor", "check", "--python", str(python), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert not {c["id"] for c in json.loads(proc.stdout)["checks"]} & set(DEEP_IDS)
    assert not (tmp_path / "fake" / "runs.txt").exists()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "\nState:\tZ" in status.read_text()  # a zombie awaiting its reaper


def test_hanging_interpreter_is_killed_and_reported(tmp_path):
    python = shell_python(tmp_path / "hang", f"sleep 300 & echo $! > {tmp_path}/child.pid; wait")
    started = time.monotonic()
    results = deep_results(python, timeout=1.5)
    assert time.monotonic() - started < 10
    runtime = results["gpu.runtime"]
    assert runtime.status is Status.ERROR
    assert "did not finish within 1.5 s" in runtime.summary and "dmesg" in runtime.remedy
    assert results["gpu.memory_fit"].status is Status.SKIP and results["gpu.compute"].status is Status.SKIP
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child), "the probe's process group outlived the timeout"


def test_runtime_hanging_inside_the_gpu_is_reported(tmp_path):
    python = fake_rocm_python(tmp_path / "fake", rocm_gpu(STRIX_HALO, free=100 * GIB, hang_in="memory"))
    started = time.monotonic()
    results = deep_results(python, timeout=3)
    assert time.monotonic() - started < 15
    assert results["gpu.runtime"].status is Status.ERROR
    assert "did not finish" in results["gpu.runtime"].summary


def test_crashing_interpreter_is_an_error_with_its_last_words(tmp_path):
    python = shell_python(tmp_path / "crash", 'echo "HSA_STATUS_ERROR_OUT_OF_RESOURCES" >&2; kill -SEGV $$')
    runtime = deep_results(python)["gpu.runtime"]
    assert runtime.status is Status.ERROR
    assert "killed by signal 11" in runtime.summary and "HSA_STATUS_ERROR_OUT_OF_RESOURCES" in runtime.summary
    assert probe_path() in runtime.remedy


@pytest.mark.parametrize(
    "output",
    [
        "hello from a sitecustomize",
        '{"probe": "rocmdoctor-gpu", "devices": [',
        "[1, 2, 3]",
        '{"probe": "something-else"}',
        "",
    ],
)
def test_garbage_output_is_an_error(tmp_path, output):
    python = shell_python(tmp_path / "garbage", f"printf '%s' '{output}'; exit 0")
    runtime = deep_results(python)["gpu.runtime"]
    assert runtime.status is Status.ERROR
    assert "exited with status 0 without a report" in runtime.summary


def test_probe_refusing_its_arguments_is_an_error_of_ours(tmp_path):
    python = shell_python(tmp_path / "other-probe", f'exec {sys.executable} "$@" --an-option-it-lacks')
    runtime = deep_results(python)["gpu.runtime"]
    assert runtime.status is Status.ERROR
    assert "refused its arguments" in runtime.summary


def test_probe_without_its_memory_rule_is_an_error_of_ours(tmp_path):
    lone = tmp_path / "pkg" / "probes" / "gpu_probe.py"
    lone.parent.mkdir(parents=True)
    lone.write_bytes(Path(probe_path()).read_bytes())
    python = shell_python(tmp_path / "bin", f'shift; exec {sys.executable} {lone} "$@"')
    runtime = deep_results(python)["gpu.runtime"]
    assert runtime.status is Status.ERROR
    assert "the GPU probe is incomplete" in runtime.summary and "memory_rule.py" in runtime.summary
    assert "Reinstall rocmdoctor" in runtime.remedy


def test_missing_interpreter_fails_with_the_install_remedy(tmp_path):
    results = deep_results(tmp_path / "no-bundle" / "bin" / "python3")
    runtime = results["gpu.runtime"]
    assert runtime.status is Status.FAIL
    assert "cannot start" in runtime.summary and "rocmdoctor install" in runtime.remedy


def test_default_interpreter_is_the_current_bundle_under_the_prefix(tmp_path):
    fake_rocm_python(tmp_path / "opt" / "current" / "bin", rocm_gpu(STRIX_HALO, free=100 * GIB))
    results = deep_results(None, prefix=str(tmp_path / "opt"))
    assert results["gpu.runtime"].status is Status.PASS
    assert results["gpu.runtime"].details["argv"][0] == str(tmp_path / "opt" / "current" / "bin" / "python3")


def test_rocm_torch_without_a_gpu_fails_with_the_access_remedy(tmp_path):
    python = fake_rocm_python(tmp_path / "fake", rocm_gpu(None, free=0))
    runtime = deep_results(python)["gpu.runtime"]
    assert runtime.status is Status.FAIL
    assert "rocm build" in runtime.summary and "render" in runtime.remedy


def test_torch_that_does_not_import(tmp_path):
    python = shell_python(tmp_path / "no-torch", f'exec {sys.executable} "$@"')
    runtime = deep_results(python)["gpu.runtime"]
    assert runtime.status is Status.FAIL
    assert "torch does not import" in runtime.summary and "PYTHONNOUSERSITE" in runtime.remedy


def test_broken_native_extension_fails_gpu_runtime(tmp_path):
    vllm = tmp_path / "site" / "vllm"
    vllm.mkdir(parents=True)
    (vllm / "__init__.py").write_text("")
    (vllm / "_rocm_C.abi3.so").write_bytes(b"\x7fELF truncated by a partial download")
    python = fake_rocm_python(tmp_path / "fake", rocm_gpu(STRIX_HALO, free=100 * GIB))
    launcher = python.read_text().replace("export PYTHONPATH=", f"export PYTHONPATH={tmp_path / 'site'}:")
    python.write_text(launcher)
    runtime = deep_results(python)["gpu.runtime"]
    assert runtime.status is Status.FAIL
    assert "vllm._rocm_C does not load" in runtime.summary and "ABI" in runtime.remedy


# -- the checks: a working GPU, once, in serve's environment -----------------------------------


def test_one_probe_run_feeds_all_three_checks_in_serves_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/deep-leaked-path")
    monkeypatch.delenv("PYTHONNOUSERSITE", raising=False)
    free = 100 * GIB
    python = fake_rocm_python(tmp_path / "fake", rocm_gpu(STRIX_HALO, free=free, tflops=45.0, gbps=210.0))
    results = deep_results(python)
    assert (tmp_path / "fake" / "runs.txt").read_text().count("run") == 1
    env = json.loads((tmp_path / "fake" / "env-1.json").read_text())
    assert env["PYTHONNOUSERSITE"] == "1" and "PYTHONPATH" not in env
    assert {i: r.status for i, r in results.items()} == dict.fromkeys(DEEP_IDS, Status.PASS)
    assert "AMD Radeon 8060S Graphics (gfx1151)" in results["gpu.runtime"].summary
    assert "no AMD GPU in the KFD topology" in results["gpu.runtime"].summary  # this machine has none
    fit = results["gpu.memory_fit"]
    total = STRIX_HALO["total_memory"]
    assert fit.details["recommended"] == memory_rule.recommended(total, free)
    assert fit.details["largest_passing"] == memory_rule.largest_passing(total, free)
    assert f"passes up to {memory_rule.largest_passing(total, free):.2f}" in fit.summary
    assert f"serve would use {memory_rule.recommended(total, free):.2f}" in fit.summary
    assert fit.details["vllm_default_passes"] is False  # 100 of 128 GiB free: 0.92 is refused
    compute = results["gpu.compute"]
    assert compute.details["peak"] == "AMD Radeon 8060S (gfx1151)" and "(45 sustained)" in compute.summary
    assert compute.details["share_of_peak"]["matmul"] == pytest.approx(45.0 / 59.4, abs=1e-3)


def test_runtime_arch_matches_the_kfd_topology(tmp_path):
    device = {
        **STRIX_HALO,
        "name": RX_7900_XTX_NAME,
        "gcnArchName": "gfx1100",
        "is_integrated": False,
        "multi_processor_count": 96,
        "total_memory": 24 * GIB,
    }
    python = fake_rocm_python(tmp_path / "fake", rocm_gpu(device, free=23 * GIB, tflops=100.0, gbps=850.0))
    results = deep_results(python, root=rx7900xtx_root(tmp_path))
    assert results["gpu.runtime"].status is Status.PASS
    assert "arch matches KFD (gfx1100)" in results["gpu.runtime"].summary
    assert results["gpu.runtime"].details["static_gfx"] == ["gfx1100"]
    assert results["gpu.compute"].details["peak"] == "AMD Radeon RX 7900 XTX"


def test_runtime_arch_other_than_kfd_fails(tmp_path):
    # What HSA_OVERRIDE_GFX_VERSION=11.5.1 makes HIP report on an RX 7900 XTX.
    device = {**STRIX_HALO, "name": RX_7900_XTX_NAME, "gcnArchName": "gfx1151"}
    python = fake_rocm_python(tmp_path / "fake", rocm_gpu(device, free=23 * GIB))
    runtime = deep_results(python, root=rx7900xtx_root(tmp_path))["gpu.runtime"]
    assert runtime.status is Status.FAIL
    assert "gfx1151" in runtime.summary and "KFD topology has gfx1100" in runtime.summary
    assert "HSA_OVERRIDE_GFX_VERSION" in runtime.remedy


def test_cuda_torch_on_an_amd_host_fails(tmp_path):
    gpu = {
        **rocm_gpu({**STRIX_HALO, "name": "NVIDIA H100 80GB HBM3", "major": 9, "minor": 0}, free=70 * GIB),
        "hip": None,
        "cuda": "13.0",
        "torch_version": "2.11.0+cu130",
    }
    python = fake_rocm_python(tmp_path / "fake", gpu)
    runtime = deep_results(python, root=rx7900xtx_root(tmp_path))["gpu.runtime"]
    assert runtime.status is Status.FAIL
    assert "sm_90" in runtime.summary and "CUDA build" in runtime.remedy


def test_nearly_full_gpu_fails_memory_fit(tmp_path):
    python = fake_rocm_python(tmp_path / "fake", rocm_gpu(STRIX_HALO, free=5 * GIB))
    fit = deep_results(python)["gpu.memory_fit"]
    assert fit.status is Status.FAIL
    assert "only 5.0 GiB of 128.0 GiB free" in fit.summary and "processes.orphans" in fit.remedy


def test_memory_the_runtime_cannot_hand_out_fails_memory_fit(tmp_path):
    # An APU whose HIP reports 100 GiB free but whose GTT/TTM limit stops allocations at 60 GiB.
    python = fake_rocm_python(
        tmp_path / "fake", rocm_gpu(STRIX_HALO, free=100 * GIB, allocation_limit=60 * GIB)
    )
    results = deep_results(python)
    fit = results["gpu.memory_fit"]
    assert fit.status is Status.FAIL
    assert "OutOfMemoryError" in fit.summary and "ttm.pages_limit" in fit.remedy
    assert results["gpu.compute"].status is Status.PASS


def test_gpu_vanishing_mid_probe(tmp_path):
    python = fake_rocm_python(tmp_path / "compute", rocm_gpu(STRIX_HALO, free=100 * GIB, vanish_in="compute"))
    results = deep_results(python)
    assert results["gpu.runtime"].status is Status.PASS and results["gpu.memory_fit"].status is Status.PASS
    assert results["gpu.compute"].status is Status.FAIL
    assert "no ROCm-capable device is detected" in results["gpu.compute"].summary

    python = fake_rocm_python(
        tmp_path / "memory", rocm_gpu(STRIX_HALO, free=100 * GIB, vanish_after_mem_get_info=2)
    )
    results = deep_results(python)
    assert results["gpu.memory_fit"].status is Status.FAIL
    assert "stopped answering" in results["gpu.memory_fit"].summary
    assert results["gpu.compute"].status is Status.SKIP


def test_slow_gpu_warns_and_unknown_gpu_passes_without_a_peak(tmp_path):
    python = fake_rocm_python(
        tmp_path / "slow", rocm_gpu(STRIX_HALO, free=100 * GIB, tflops=30.0, gbps=210.0)
    )
    compute = deep_results(python)["gpu.compute"]
    assert compute.status is Status.WARN
    assert "51% and 82% of the AMD Radeon 8060S (gfx1151) peaks" in compute.summary

    other = {**STRIX_HALO, "name": "AMD Radeon RX 6900 XT", "gcnArchName": "gfx1030"}
    python = fake_rocm_python(tmp_path / "unknown", rocm_gpu(other, free=15 * GIB, tflops=30.0))
    compute = deep_results(python)["gpu.compute"]
    assert compute.status is Status.PASS and "no reference peak" in compute.summary


@pytest.mark.parametrize(
    "name, arch, label",
    [
        ("NVIDIA H100 80GB HBM3", "sm_90", "NVIDIA H100 SXM"),
        ("NVIDIA H100 PCIe", "sm_90", "NVIDIA H100 PCIe"),
        ("NVIDIA H100 NVL", "sm_90", "NVIDIA H100 NVL"),
        ("NVIDIA H200", "sm_90", "NVIDIA H200 SXM"),
        ("NVIDIA H200 NVL", "sm_90", "NVIDIA H200 NVL"),
        ("AMD Instinct MI300X", "gfx942", "AMD Instinct MI300X"),
        ("AMD Instinct MI355X", "gfx950", "AMD Instinct MI355X"),
        ("AMD Radeon AI PRO R9700", "gfx1201", "AMD Radeon AI PRO R9700"),
        ("AMD Radeon Graphics", "gfx1151", "AMD Radeon 8060S (gfx1151)"),
        ("AMD Radeon RX 9070 XT", "gfx1201", None),
    ],
)
def test_peak_table_matches_devices(name, arch, label):
    peak = find_peak(name, arch)
    assert (peak.label if peak else None) == label


def test_cli_deep_timeout_bounds_a_hanging_probe(tmp_path):
    from harness.hosts import run_cli

    python = shell_python(tmp_path / "hang", "sleep 300")
    started = time.monotonic()
    proc = run_cli(
        "check",
        "--deep",
        "--only",
        "gpu.runtime",
        "--python",
        str(python),
        "--deep-timeout",
        "2",
        "--json",
        root=tmp_path,
    )
    assert time.monotonic() - started < 20
    runtime = next(c for c in json.loads(proc.stdout)["checks"] if c["id"] == "gpu.runtime")
    assert runtime["status"] == "error" and "did not finish within 2 s" in runtime["summary"]
    bad = run_cli("check", "--deep", "--deep-timeout", "0", root=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
