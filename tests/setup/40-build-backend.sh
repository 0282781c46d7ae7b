#!/usr/bin/env bash
# The packaging test builds the wheel without isolation: the venv needs the project's build backend.
set -euo pipefail
if ! .venv/bin/python -c "import setuptools, wheel, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 69)" 2>/dev/null; then
    .venv/bin/pip install -q --disable-pip-version-check 'setuptools>=69' wheel
fi
