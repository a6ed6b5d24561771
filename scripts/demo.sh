#!/usr/bin/env bash
# The main job on real input shipped in the repo: set up .venv, export the tiny random-weight
# SigLIP2 test model to a bundle, and score examples/dreambooth/pairs.csv torch-free.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
[ -f bundles/tiny-naflex/manifest.json ] || masc-export --model random:tiny-naflex --out bundles/tiny-naflex
masc-run examples/dreambooth/pairs.csv --bundle bundles/tiny-naflex --out examples-scores.csv --print-scores
