#!/usr/bin/env bash
# Creates .venv in the project folder (if missing) and installs fedshift with its dev tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import fedshift, pytest, torch" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.fedshift-installed ]; then
  .venv/bin/pip install --quiet --upgrade pip
  .venv/bin/pip install --quiet -e ".[dev,ray,flower]"
  touch .venv/.fedshift-installed
fi
