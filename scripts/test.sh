#!/usr/bin/env bash
# Set up, lint, build the documentation site (strict), then run the whole test suite (unit
# tests and a few tiny end-to-end runs) with the wheel check from a clean virtual environment
# beside it; the exit status fails if either failed.
# FEDSHIFT_SKIP_PACKAGING=1 skips the docs build and the wheel check (a quick local run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests benchmarks
wheel_pid=""
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
  # the wheel check (mostly pip unpacking files) runs beside the tests; its log is printed after
  wheel_log=$(mktemp)
  bash scripts/check_wheel.sh >"$wheel_log" 2>&1 &
  wheel_pid=$!
fi
# two workers on two cores (pytest-xdist); FEDSHIFT_TEST_WORKERS=0 runs in this process
status=0
.venv/bin/python -m pytest -n "${FEDSHIFT_TEST_WORKERS:-auto}" --dist loadgroup "$@" || status=$?
if [ -n "$wheel_pid" ]; then
  wheel_status=0
  wait "$wheel_pid" || wheel_status=$?
  cat "$wheel_log"
  rm -f "$wheel_log"
  if [ "$wheel_status" -ne 0 ]; then
    echo "wheel check: failed (exit $wheel_status)"
    [ "$status" -ne 0 ] || status=$wheel_status
  fi
fi
exit "$status"
