#!/usr/bin/env bash
# What to run first on a machine with a GPU: the GPU test tier, then the
# benchmark table that has waited for one.
#   bash tools/run_gpu_checks.sh [OUT_DIR]    # default gpu_checks/<date>
# Writes OUT_DIR/tier.log (pytest -m cuda, every skip with its reason) and
# OUT_DIR/bench-*.{log,json}; exits non-zero if the tier fails (the
# benchmarks still run, so one run gives all the figures).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/gpu_checks/$(date -u +%Y-%m-%d)}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
cd "$ROOT"
mkdir -p "$OUT"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else
"torch.cuda.is_available() is False: run this on a machine with a GPU")' || exit 2
"$PY" -m pytest -m cuda -rs -v -s 2>&1 | tee "$OUT/tier.log"
TIER=${PIPESTATUS[0]}
MODELS=(clustr-s-exact clustr-s-window paca-s pvtv2-b2 swin-t)
for PREC in ieee tf32x3; do
  "$PY" tools/analysis/benchmark.py --device cuda --amp bf16 --batch 128 \
    --sizes 224 --train-step --precision "$PREC" --models "${MODELS[@]}" \
    --out "$OUT/bench-224-$PREC.json" 2>&1 | tee "$OUT/bench-224-$PREC.log"
  "$PY" tools/analysis/benchmark.py --device cuda --amp bf16 --batch 2 \
    --sizes 800x1344 --train-step --precision "$PREC" \
    --models clustr-s-window paca-s pvtv2-b2 swin-t \
    --out "$OUT/bench-800-$PREC.json" 2>&1 | tee "$OUT/bench-800-$PREC.log"
done
echo "[gpu_checks] tier exit status $TIER; results in $OUT"
exit "$TIER"
