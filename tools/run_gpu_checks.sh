#!/usr/bin/env bash
# What to run first on a machine with a GPU, most wanted first, each result
# written as soon as it exists (a run cut short keeps what it finished):
#   bash tools/run_gpu_checks.sh [OUT_DIR]    # default gpu_checks/<date>
#  1. clustering.{log,json}: tools/analysis/clustering_speed.py (ClusTR-S's
#     clustering op and its parts on real stage tokens, both precisions,
#     pass 2 pruned beside the full scan (its "pruned" rows: where faster
#     with the same ids, fused.MEASURED prunes by default), against
#     the reference, the official formulation and, with
#     CLUSTR_MM_BASELINE=path/to/old/fused.py, an earlier op);
#  2. tier-fused.log: the fused kernels (full and pruned) against the
#     reference on the GPU;
#  3. bench-224.{log,json}: the benchmark table, bf16, batch 128, inference
#     and training step (the default precision, tf32x3), with a kernel
#     profile per model and the time of each stage and of its attention,
#     clustering and MLP; bench-224-ieee: ClusTR-S in 'ieee';
#  4. train-speed{,-amp}.{log,jsonl}: Mask R-CNN 1x s/iter, ClusTR-S, PaCa-S
#     and Swin-T, fp32 and AMP;
#  5. tier.log: the rest of the GPU tier; bench-800.{log,json} (with the
#     kernel profile and stage ranges at the detectors' input size: where
#     Mask R-CNN's extra time goes); nan-fp16.log; bench-800-graphs: the
#     same size under CUDA graphs (--compile reduce-overhead: ClusTR-S at
#     batch 2 waited 20 of 50 ms a forward on kernel launches, 2026-11-28);
#  6. release-time{,-coco}.{log,jsonl}: s/iter of every config that
#     reproduces a release, at its recipe's batch per GPU with --amp, and the
#     hours its official schedule takes on the recipe's 8 GPUs
#     (train_speed.py --release; the tiny embedded data, read 32 times an
#     epoch; Mask R-CNN at 853x640, the multi-scale recipe's mean scale for
#     COCO's usual 4:3 image).
# Steps 3-6 build mmdet's models, which need mmcv's CUDA ops: where a build
# of them runs in the background, CLUSTR_MM_MMCV_WAIT=SECONDS waits that long
# for `import mmcv.ops` first. CLUSTR_MM_GPU_STEPS="5 6" runs only those
# steps (default: all), e.g. to go on in a second call where a first one
# ran out of time. Exits non-zero if a tier step fails.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/gpu_checks/$(date -u +%Y-%m-%d)}"
# the default environment's Python, else python3 (a GPU machine with the
# stack installed system-wide, as a lent device after .gpu/install.sh)
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -n "${PYTHON:-}" ] || [ -x "$PY" ] || PY=python3
command -v "$PY" >/dev/null || {
  echo "PYTHON=$PY is not a Python interpreter here" >&2; exit 2; }
BASELINE="${CLUSTR_MM_BASELINE:-}"
[ -z "$BASELINE" ] || [ -f "$BASELINE" ] || {
  echo "CLUSTR_MM_BASELINE=$BASELINE is not a file (an earlier fused.py)" >&2
  exit 2; }
STEPS="${CLUSTR_MM_GPU_STEPS:-1 2 3 4 5 6}"
for STEP in $STEPS; do
  case "$STEP" in
    [1-6]) ;;
    *) echo "CLUSTR_MM_GPU_STEPS: no step '$STEP' (the steps are 1-6)" >&2
       exit 2 ;;
  esac
done
[ -n "${STEPS// /}" ] || {
  echo "CLUSTR_MM_GPU_STEPS names no step (the steps are 1-6)" >&2; exit 2; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
WAIT="${CLUSTR_MM_MMCV_WAIT:-0}"
case "$WAIT" in
  ''|*[!0-9]*) echo "CLUSTR_MM_MMCV_WAIT must be whole seconds, got '$WAIT'" >&2
               exit 2 ;;
esac
cd "$ROOT"
mkdir -p "$OUT"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else
"torch.cuda.is_available() is False: run this on a machine with a GPU")' || exit 2
FAILED=0
log() { echo "[gpu_checks] $(date -u +%T) $*"; }

tiny_data() {  # the configs read the datasets' files: the tiny set serves
  [ -f data/coco/annotations/instances_train2017.json ] && \
    [ -d data/imagenet/train ] && [ -d data/ade ] || \
    "$PY" tools/data/make_tiny_data.py --out data > "$OUT/tiny-data.log" 2>&1
}
libs() {  # the task libraries import (clustr_mm.env_check), else the
  # missing package, named once here rather than once per config
  local MSG
  MSG=$("$PY" -c 'import sys; from clustr_mm.env_check import check_scope
for scope in sys.argv[1:]: check_scope(scope)' "$@" 2>&1) && return 0
  log "skipped (configs of $*): ${MSG##*$'\n'}"; FAILED=1; return 1
}
speed() {  # train_speed.py's rows and table, without MMEngine's log lines
  local NAME=$1; shift
  "$PY" tools/analysis/train_speed.py "$@" --out "$OUT/$NAME.jsonl" 2>&1 \
    | grep -v ' - mmengine - ' | tee "$OUT/$NAME.log"
}

if want 1; then
  log "1. clustering op"
  "$PY" tools/analysis/clustering_speed.py --batch 128 --runs 10 \
    ${BASELINE:+--baseline "$BASELINE"} --out "$OUT/clustering.json" \
    2>&1 | tee "$OUT/clustering.log"
fi
if want 2; then
  log "2. fused kernels against the reference"
  "$PY" -m pytest -m cuda -k fused -rs -v -s tests/test_cuda.py 2>&1 \
    | tee "$OUT/tier-fused.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || FAILED=1
fi

if want 3 || want 4 || want 5 || want 6; then  # mmdet's models
  until "$PY" -c 'import mmcv.ops' >/dev/null 2>&1 || [ "$WAIT" -le 0 ]; do
    sleep 10; WAIT=$((WAIT - 10))
  done
fi
if want 3; then
  log "3. benchmark table"
  MODELS=(clustr-s-exact pvtv2-b2 paca-s swin-t)  # window = exact at 224
  "$PY" tools/analysis/benchmark.py --device cuda --amp bf16 --batch 128 \
    --sizes 224 --train-step --profile --models "${MODELS[@]}" \
    --out "$OUT/bench-224.json" 2>&1 | tee "$OUT/bench-224.log"
  "$PY" tools/analysis/benchmark.py --device cuda --amp bf16 --batch 128 \
    --sizes 224 --train-step --precision ieee --models clustr-s-exact \
    pvtv2-b2 --out "$OUT/bench-224-ieee.json" 2>&1 \
    | tee "$OUT/bench-224-ieee.log"
fi
if want 4; then
  log "4. Mask R-CNN seconds per iteration, fp32 and AMP"
  tiny_data  # every image resized to 1333x800
  MASK_RCNN=(configs/clustr/mask-rcnn_clustr-s_fpn_1x_coco.py
             configs/paca/mask-rcnn_paca-s_fpn_ms-1x_coco.py
             mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py)
  libs mmdet && for AMP in "" --amp; do
    speed "train-speed${AMP:+-amp}" "${MASK_RCNN[@]}" $AMP \
      --input-size 1333x800 --batch 2 --iters 6 --warmup 2
  done
fi
if want 5; then
  log "5. the rest"
  "$PY" -m pytest -m cuda -k "not fused" -rs -v -s \
    --continue-on-collection-errors 2>&1 | tee "$OUT/tier.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || FAILED=1
  "$PY" tools/analysis/benchmark.py --device cuda --amp bf16 --batch 2 \
    --sizes 800x1344 --train-step --profile --models clustr-s-window paca-s \
    pvtv2-b2 swin-t --out "$OUT/bench-800.json" 2>&1 \
    | tee "$OUT/bench-800.log"
  "$PY" tools/analysis/nan_check.py \
    configs/clustr/clustr-t_embedded-imagenet.py --amp fp16 --iters 200 \
    --work-dir "$OUT/nan-fp16" 2>&1 | tee "$OUT/nan-fp16.log"
  "$PY" tools/analysis/benchmark.py --device cuda --amp bf16 --batch 2 \
    --sizes 800x1344 --train-step --compile reduce-overhead --models \
    clustr-s-window swin-t --out "$OUT/bench-800-graphs.json" 2>&1 \
    | tee "$OUT/bench-800-graphs.log"
fi
if want 6; then
  log "6. release schedules: s/iter at the recipes' batch and precision"
  tiny_data
  libs mmpretrain mmseg && speed release-time --release clustr-imagenet \
    paca-imagenet paca-upernet-160k paca-head-160k --amp --repeat 32 \
    --iters 5 --warmup 2
  libs mmdet && speed release-time-coco --release paca-mask-rcnn-ms-1x \
    --input-size 853x640 --amp --repeat 32 --iters 5 --warmup 2
fi
log "done; tier failures: $FAILED; results in $OUT"
exit "$FAILED"
