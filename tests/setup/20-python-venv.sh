#!/usr/bin/env bash
# The project's own virtual environment with the test extras; reinstalled when pyproject.toml changes.
set -euo pipefail
stamp=.venv/.rocmdoctor-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -c "import rocmdoctor, pytest, hypothesis, jsonschema" 
    echo "$want" > "$stamp"
fi
