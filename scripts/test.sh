#!/usr/bin/env bash
# Set up .venv (create or reuse), check the import contracts (pyproject.toml) and run the test suite.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest -q "$@"
