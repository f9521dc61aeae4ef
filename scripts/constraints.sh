#!/usr/bin/env bash
# Rewrites constraints.txt: installs fedshift with every extra into a fresh virtual environment
# (outside the project) and pins what pip resolved. Run it after changing pyproject.toml's
# dependencies, then run the test suite on the new set (bash scripts/test.sh) before committing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install --quiet ".[all]"
{
  echo "# The exact versions CI installs (scripts/setup.sh: pip install -c constraints.txt -e '.[all]')."
  echo "# pyproject.toml states ranges; this file pins the one set the test suite ran on."
  echo "# Regenerate after changing an extra: bash scripts/constraints.sh"
  "$tmp/venv/bin/pip" freeze --exclude fedshift | sort -f
} > constraints.txt
echo "constraints.txt: $(grep -vc '^#' constraints.txt) pinned packages"
