#!/usr/bin/env bash
# The test command: set up .venv (idempotent) and run the whole suite on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh --test
. .venv/bin/activate
python -m pytest -q -p no:cacheprovider "$@"
