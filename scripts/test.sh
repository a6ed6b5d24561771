#!/usr/bin/env bash
# The test command: set up .venv (idempotent) and run the whole suite on CPU; arguments go to pytest.
# -rs lists every skipped test with its reason at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh --test
# Headless Chromium renders masc-report in tests/test_report.py (skipped, with a reason, without it;
# under CI=true, as .ci/run sets it, the test fails instead). As root with apt-get, and only then,
# this script installs it (the README says so); otherwise install it yourself or let the test skip.
# Only when the selection can include that test: no test path given (the whole suite), or
# tests/test_report.py named.
needs_browser=1
for a in "$@"; do case "$a" in *.py|*::*) needs_browser=0;; esac; done
for a in "$@"; do case "$a" in *test_report.py*) needs_browser=1;; esac; done
if [ "$needs_browser" = 1 ] && ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
   && command -v apt-get >/dev/null 2>&1; then
  echo "test: installing chromium and fonts-dejavu-core with apt-get (root; for the report's browser-render test)" >&2
  (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core) >/dev/null 2>&1 \
    || echo "test: could not install chromium; the report's browser-render test will skip (fail under CI=true)" >&2
fi
# The whole suite (or a -m selection of it) runs on MASC_TEST_WORKERS pytest-xdist workers (default 2:
# the CI machine's cores), a test file per worker (--dist loadfile: module fixtures are built once); the session's bundles are built once
# per run whatever the number of workers (tests/support build_once). A named test file or test, or -n
# given, runs as asked.
workers=()
named=0
explicit=0
for a in "$@"; do case "$a" in *.py|*::*|tests/*) named=1;; -n|-n*|--numprocesses*) explicit=1;; esac; done
if [ "$named" = 0 ] && [ "$explicit" = 0 ]; then workers=(-n "${MASC_TEST_WORKERS:-2}" --dist loadfile); fi
. .venv/bin/activate
python -m pytest -q -rs -p no:cacheprovider "${workers[@]}" "$@"
