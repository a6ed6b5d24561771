#!/usr/bin/env bash
# The main job on real input shipped in the repo: set up .venv, export the tiny random-weight
# SigLIP2 test model to a bundle, and score examples/dreambooth/pairs.csv torch-free.
# Outputs go under out/ (ignored by git); library messages of the export go to
# bundles/tiny-naflex.export.log.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "[1/3] environment (.venv)" >&2
bash scripts/setup_env.sh
. .venv/bin/activate
echo "[2/3] bundle: the tiny random-weight SigLIP2 test model -> bundles/tiny-naflex" >&2
if [ -f bundles/tiny-naflex/manifest.json ]; then
  echo "already exported (delete bundles/tiny-naflex to export again)" >&2
else
  masc-export --model random:tiny-naflex --out bundles/tiny-naflex
fi
echo "[3/3] scoring examples/dreambooth/pairs.csv -> out/demo-scores.csv" >&2
mkdir -p out
masc-run examples/dreambooth/pairs.csv --bundle bundles/tiny-naflex --out out/demo-scores.csv --print-scores
echo "Next: . .venv/bin/activate, then the README's commands (masc-run, masc-report, masc-rank, masc-eval)." >&2
