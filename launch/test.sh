#!/usr/bin/env bash
# Set up .venv if needed, then run the test suite (fast tests + the real-model tests whose
# packages the setup installs). Extra arguments go to pytest, e.g. `bash launch/test.sh -m "not slow"`.
# Test files run in parallel worker processes (pytest-xdist, one file per worker at a time, so module
# fixtures are built once), longest first (tests/schedule.py; --no-loadscope-reorder keeps that order):
# CARRYOVER_TEST_WORKERS=N sets their number (default: one per CPU core); `-n 0` runs everything in this process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
VENV="${CARRYOVER_VENV:-.venv}"
set +e
# `heavy` tests (minutes each here) stay out of the default run: CARRYOVER_TEST_HEAVY=1 runs them too
MARK="not gpu and not heavy"
[[ -n "${CARRYOVER_TEST_HEAVY:-}" ]] && MARK="not gpu"
"$VENV/bin/python" -m pytest -m "$MARK" -n "${CARRYOVER_TEST_WORKERS:-auto}" --dist loadfile --no-loadscope-reorder "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then echo "no tests collected"; exit 1; fi
exit $rc
