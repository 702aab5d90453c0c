#!/usr/bin/env bash
# What to run first on a machine with a GPU: the GPU test tier, then the
# benchmark table that has waited for one.
#   bash tools/run_gpu_checks.sh [OUT_DIR]    # default gpu_checks/<date>
# Writes OUT_DIR/tier.log (pytest -m cuda, every skip with its reason),
# OUT_DIR/bench-*.{log,json} (224 with a kernel profile per model, 800x1344),
# nan-fp16.log (200 fp16 iterations) and train-speed.log (Mask R-CNN 1x,
# with_cp off and on); exits non-zero if the tier fails (the measurements
# still run, so one run gives all the figures).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/gpu_checks/$(date -u +%Y-%m-%d)}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
cd "$ROOT"
mkdir -p "$OUT"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else
"torch.cuda.is_available() is False: run this on a machine with a GPU")' || exit 2
"$PY" -m pytest -m cuda -rs -v -s --continue-on-collection-errors 2>&1 | tee "$OUT/tier.log"
TIER=${PIPESTATUS[0]}
MODELS=(clustr-s-exact clustr-s-window paca-s pvtv2-b2 swin-t)
# 224 first, with the kernel profile of each model (where ClusTR-S's time
# goes: 0.23x PVTv2-b2 on an H200 with the row scan, 2026-11-26); tf32x3
# only changes ClusTR
"$PY" tools/analysis/benchmark.py --device cuda --amp bf16 --batch 128 \
  --sizes 224 --train-step --profile --models "${MODELS[@]}" \
  --out "$OUT/bench-224-ieee.json" 2>&1 | tee "$OUT/bench-224-ieee.log"
"$PY" tools/analysis/benchmark.py --device cuda --amp bf16 --batch 128 \
  --sizes 224 --train-step --profile --precision tf32x3 \
  --models clustr-s-exact clustr-s-window \
  --out "$OUT/bench-224-tf32x3.json" 2>&1 | tee "$OUT/bench-224-tf32x3.log"
for PREC in ieee tf32x3; do
  "$PY" tools/analysis/benchmark.py --device cuda --amp bf16 --batch 2 \
    --sizes 800x1344 --train-step --precision "$PREC" \
    --models clustr-s-window paca-s pvtv2-b2 swin-t \
    --out "$OUT/bench-800-$PREC.json" 2>&1 | tee "$OUT/bench-800-$PREC.log"
done
# 200 fp16 iterations; Mask R-CNN 1x seconds per iteration, with_cp off/on
"$PY" tools/analysis/nan_check.py configs/clustr/clustr-t_embedded-imagenet.py \
  --amp fp16 --iters 200 --work-dir "$OUT/nan-fp16" 2>&1 | tee "$OUT/nan-fp16.log"
for CFG in configs/clustr/mask-rcnn_clustr-s_fpn_1x_coco.py \
           configs/paca/mask-rcnn_paca-s_fpn_ms-1x_coco.py \
           mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py; do
  for CP in False True; do
    "$PY" tools/analysis/train_speed.py "$CFG" --input-size 1333x800 \
      --batch 2 --iters 10 --warmup 3 --cfg-options \
      model.backbone.with_cp=$CP 2>&1 | tail -n 3 | tee -a "$OUT/train-speed.log"
  done
done
echo "[gpu_checks] tier exit status $TIER; results in $OUT"
exit "$TIER"
