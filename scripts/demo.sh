#!/usr/bin/env bash
# The main job on real input shipped in the repo: set up .venv, export the tiny random-weight
# SigLIP2 test model to a bundle, and score examples/dreambooth/pairs.csv torch-free.
# Prints one line per stage, then masc-run's random-weights warning, score table and summary.
# Each stage's own output goes to out/demo.log (pip's to .venv/setup.log, the exporter's library
# messages to bundles/tiny-naflex.export.log); a failing stage prints the end of its log.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
LOG=out/demo.log
: >"$LOG"
quietly() {
  if ! "$@" >>"$LOG" 2>&1; then
    echo "failed: $*; the end of $LOG:" >&2
    tail -n 25 "$LOG" >&2
    exit 1
  fi
}
echo "[1/3] environment: .venv (pip's log: .venv/setup.log; this stage's: $LOG)" >&2
quietly bash scripts/setup_env.sh
. .venv/bin/activate
if [ -f bundles/tiny-naflex/manifest.json ]; then
  echo "[2/3] bundle: bundles/tiny-naflex, exported before (delete it to export again)" >&2
else
  echo "[2/3] bundle: random:tiny-naflex -> bundles/tiny-naflex (log: $LOG)" >&2
  quietly masc-export --model random:tiny-naflex --out bundles/tiny-naflex
fi
echo "[3/3] scoring examples/dreambooth/pairs.csv -> out/demo-scores.csv" >&2
masc-run examples/dreambooth/pairs.csv --bundle bundles/tiny-naflex --out out/demo-scores.csv \
  --print-scores --no-progress --overwrite
echo "Next: . .venv/bin/activate, then the README's commands (masc-run, masc-report, masc-rank, masc-eval, masc-serve)." >&2
