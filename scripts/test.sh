#!/usr/bin/env bash
# Set up, lint, build the documentation site (strict), check the wheel from a clean virtual
# environment, then run the whole test suite (unit tests and a few tiny end-to-end runs).
# FEDSHIFT_SKIP_PACKAGING=1 skips the docs build and the wheel check (a quick local run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests benchmarks
if [ -z "${FEDSHIFT_SKIP_PACKAGING:-}" ]; then
  site=$(mktemp -d)
  # not --quiet: it hides the warnings that --strict turns into a failure
  if ! NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$site/html" \
      >"$site/log" 2>&1; then
    cat "$site/log"
    exit 1
  fi
  rm -rf "$site"
  echo "docs: mkdocs build --strict passed"
  bash scripts/check_wheel.sh
fi
# two workers on two cores (pytest-xdist); FEDSHIFT_TEST_WORKERS=0 runs in this process
.venv/bin/python -m pytest -n "${FEDSHIFT_TEST_WORKERS:-auto}" --dist loadgroup "$@"
