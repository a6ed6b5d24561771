#!/usr/bin/env bash
# Create (or update) the project virtualenv in .venv with the runtime, the export extra and,
# with --test, everything the test suite compares against (masc-metric 0.3.0 as the oracle).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first, pinned: on these machines 2.13.0 is a local CPU build; an unpinned torch would pull
# a multi-GB CUDA build through transformers.
python -m pip install -q "torch==2.13.0"
if [ "${1:-}" = "--test" ]; then
  python -m pip install -q -e ".[export,test,eval,spacy,parquet,ray,serve]"
  # The oracle. --no-deps: its torchvision requirement cannot be met beside the CPU torch build,
  # and without torchvision transformers uses its PIL image processors (what we reproduce exactly).
  python -m pip install -q --no-deps "masc-metric==0.3.0"
else
  python -m pip install -q -e ".[export,eval]"
fi
