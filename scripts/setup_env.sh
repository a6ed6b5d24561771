#!/usr/bin/env bash
# Create (or update) the project virtualenv in .venv with the runtime, the export extra and,
# with --test, everything the test suite compares against (masc-metric 0.3.0 as the oracle).
# Prints one line per stage; pip's own output goes to .venv/setup.log (shown if a step fails).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
step() { echo "setup: $*" >&2; }
[ -x .venv/bin/python ] || { step "creating .venv with $("$PY" --version 2>&1)"; "$PY" -m venv .venv; }
. .venv/bin/activate
# A second call with nothing changed returns at once (the test command calls this script; .ci/run
# calls both): the stamp records what the last completed setup installed from (this script, the
# package's requirements, the CI pins), for which mode, Python and checkout. Anything else: pip runs.
MODE=runtime; [ "${1:-}" = "--test" ] && MODE=test
STAMP=.venv/.masc-setup-$MODE
want="$(cat scripts/setup_env.sh pyproject.toml constraints/ci.txt | sha256sum | cut -d' ' -f1) $(python --version 2>&1) $PWD"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  step "up to date (.venv was set up from these requirements; delete $STAMP to reinstall)"
  exit 0
fi
rm -f "$STAMP"
LOG=.venv/setup.log
: >"$LOG"
pipi() {
  if ! python -m pip install "$@" >>"$LOG" 2>&1; then
    step "pip install $* failed; the end of $LOG:"
    tail -n 25 "$LOG" >&2
    exit 1
  fi
}
step "installing packages into .venv (a first run takes a few minutes; pip's log: $LOG)"
pipi --upgrade pip
# torch first, pinned: on these machines 2.13.0 is a local CPU build; an unpinned torch would pull
# a multi-GB CUDA build through transformers.
step "torch 2.13.0 (CPU build; only masc-export and the tests need it)"
pipi "torch==2.13.0"
if [ "${1:-}" = "--test" ]; then
  # The versions the CI and the tests are measured with are pinned in constraints/ci.txt (the
  # extras give ranges); the torch line above already satisfies its torch pin.
  step "masc-engine (editable) with the export, test, eval, spacy, parquet, ray and serve extras (pins: constraints/ci.txt)"
  pipi -c constraints/ci.txt -e ".[export,test,eval,spacy,parquet,ray,serve]"
  # The oracle. --no-deps: its torchvision requirement cannot be met beside the CPU torch build,
  # and without torchvision transformers uses its PIL image processors (what we reproduce exactly).
  step "the oracle masc-metric 0.3.0 (--no-deps)"
  pipi --no-deps "masc-metric==0.3.0"
else
  step "masc-engine (editable) with the export, eval and report extras"
  pipi -e ".[export,eval,report]"
fi
echo "$want" >"$STAMP"
step "done: activate it with  . .venv/bin/activate"
