#!/usr/bin/env bash
# The test command: set up (or re-check) each tested stack, then run its tests.
#   bash tools/run_tests.sh [pytest args]
#
# Stacks (docs/environments.md), in order:
#   default   .venv           the whole suite
#   torch2.1  .venv-torch2.1  the tests marked `torch21` (pytest.ini):
#                             backbone, checkpoint and environment unit tests
#                             + Mask R-CNN ClusTR-T train/test end to end
#   mmdeploy  .venv-mmdeploy  the tests marked `mmdeploy`: Mask R-CNN through
#                             mmdeploy + ONNX Runtime (a side environment on
#                             the torch 2.1 stack: run after it)
# CLUSTR_MM_STACKS="default" (or "torch2.1") runs only those. pytest args go to
# every stack. The default and torch 2.1 suites run in CLUSTR_MM_TEST_WORKERS
# pytest-xdist workers (default: one per core, at most 4; 0 or 1 runs them in
# the pytest process itself, as plain `pytest` does). Every stack runs even if
# an earlier one fails; the exit status is non-zero if any failed.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STACKS="${CLUSTR_MM_STACKS:-default torch2.1 mmdeploy}"
CORES="$(nproc 2>/dev/null || echo 1)"
WORKERS="${CLUSTR_MM_TEST_WORKERS:-$(( CORES < 4 ? CORES : 4 ))}"
case "$WORKERS" in
  ''|*[!0-9]*) echo "[run_tests] CLUSTR_MM_TEST_WORKERS must be a whole" \
                    "number (0 or 1: no workers), got '$WORKERS'" >&2; exit 2 ;;
esac
PARALLEL=()
# one test at a time to a free worker, in tests/conftest.py's order
[ "$WORKERS" -gt 1 ] && PARALLEL=(-n "$WORKERS" --maxschedchunk 1)
cd "$ROOT"

FAILED=()
for STACK in $STACKS; do
  START=$SECONDS
  echo "[run_tests] ===== stack $STACK ====="
  SETUP=(bash "$ROOT/tools/setup_env.sh")
  if [ "$STACK" = default ]; then
    VENV="${CLUSTR_MM_VENV:-$ROOT/.venv}"
    TESTS=(tests "${PARALLEL[@]}")
  elif [ "$STACK" = mmdeploy ]; then
    VENV="$ROOT/.venv-mmdeploy"
    TESTS=(tests/test_mmdeploy.py -m mmdeploy)  # (its side packages: onnx 1.17)
    SETUP=(bash "$ROOT/tools/deployment/setup_mmdeploy_env.sh")
  else
    VENV="$ROOT/.venv-$STACK"
    case "$STACK" in
      # a subset chosen by marker (keeps CI well inside its time limit)
      torch2.1) TESTS=(tests -m torch21 "${PARALLEL[@]}") ;;
      *) echo "[run_tests] unknown stack $STACK" >&2; FAILED+=("$STACK"); continue ;;
    esac
  fi
  if ! CLUSTR_MM_STACK="$STACK" CLUSTR_MM_VENV="$VENV" "${SETUP[@]}"; then
    FAILED+=("$STACK (setup)"); continue
  fi
  "$VENV/bin/python" tools/data/make_tiny_data.py --out data || { FAILED+=("$STACK (data)"); continue; }
  "$VENV/bin/python" -m pytest "${TESTS[@]}" "$@" || FAILED+=("$STACK")
  echo "[run_tests] stack $STACK: $(( (SECONDS - START) / 60 )) min $(( (SECONDS - START) % 60 )) s"
done

if [ ${#FAILED[@]} -gt 0 ]; then
  echo "[run_tests] FAILED: ${FAILED[*]}" >&2
  exit 1
fi
echo "[run_tests] all stacks passed: $STACKS"
