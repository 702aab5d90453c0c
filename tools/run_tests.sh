#!/usr/bin/env bash
# The test command: set up (or re-check) the environment, then run the suite.
#   bash tools/run_tests.sh [pytest args]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
bash "$ROOT/tools/setup_env.sh"
VENV="${CLUSTR_MM_VENV:-$ROOT/.venv}"
cd "$ROOT"
"$VENV/bin/python" tools/data/make_tiny_data.py --out data
exec "$VENV/bin/python" -m pytest tests "$@"
