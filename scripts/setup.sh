#!/usr/bin/env bash
# Creates .venv in the project folder (if missing) and installs fedshift with every extra (Ray,
# Flower, tracking, the hub, the docs and test tools) at the versions pinned in constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import fedshift, pytest, torch" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.fedshift-installed ] \
   || [ constraints.txt -nt .venv/.fedshift-installed ]; then
  .venv/bin/pip install --quiet --upgrade pip
  .venv/bin/pip install --quiet -c constraints.txt -e ".[all]"
  touch .venv/.fedshift-installed
fi
