#!/usr/bin/env bash
# Set up, lint, then run the whole test suite (unit tests and a few tiny end-to-end runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests benchmarks
.venv/bin/python -m pytest "$@"
