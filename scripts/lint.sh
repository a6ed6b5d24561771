#!/usr/bin/env bash
# The house's static checks, run by .ci/run before the tests (needs the .venv of scripts/setup_env.sh --test):
# ruff (lint rules and the formatter's check, pyproject.toml [tool.ruff]), import-linter (the layer contracts in [tool.importlinter]) and mypy
# ([tool.mypy]: the package, engine/ and runtime/ strictly).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi  # else: the active environment
ruff check src tests scripts bench
ruff format --check src tests scripts bench
(cd src && lint-imports --no-logo ../pyproject.toml)
mypy
