#!/usr/bin/env bash
# The test command: set up .venv (idempotent) and run the whole suite on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh --test
# Headless Chromium renders masc-report in tests/test_report.py (skipped, with a reason, without it;
# under CI=true, as .ci/run sets it, the test fails instead).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core) >/dev/null 2>&1 \
    || echo "note: could not install chromium; the report screenshot test will skip (fail under CI=true)"
fi
. .venv/bin/activate
python -m pytest -q -p no:cacheprovider "$@"
