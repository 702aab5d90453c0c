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
# 54. issue 54's GPU rows in one call of ~8 minutes on an H200 (not in the
#     default run; CLUSTR_MM_GPU_STEPS=54), most wanted first, without
#     profiles, into OUT_DIR/54/: (a) bench-800x1344: ClusTR-S window,
#     PVTv2-b2, Swin-T at batch 2, bf16, inference and training step;
#     (b) Mask R-CNN 1x under AMP, ClusTR-S, PaCa-S, Swin-T; (c) bench-224:
#     ClusTR-S exact and PVTv2-b2, bf16, batch 128; (e) nan_check.py --amp
#     fp16, 200 iterations; (d) training s/iter under AMP of UperNet at
#     512x512 and of the whole-body pose model (MTA neck) at 256x192,
#     ClusTR-S against Swin-T and PVTv2-b2 (configs/_peers/); (f) ClusTR-S's
#     UperNet under MMEngine's compile with CUDA graphs
#     (compile.mode=reduce-overhead, compile.dynamic=False; its eager row is
#     (d)'s). Each result is also copied, as it comes, to CLUSTR_MM_RESULTS
#     (default docs/results; on a lent device a folder under $OUT, so that
#     it comes back) as <date>_<device>_<name>, with versions.json.
# Steps 3-6 and 54 build mmdet's models, which need mmcv's CUDA ops: where a
# build of them runs in the background, CLUSTR_MM_MMCV_WAIT=SECONDS waits
# that long for `import mmcv.ops` first. CLUSTR_MM_GPU_STEPS="5 6" runs only
# those steps (default: 1-6), e.g. to go on in a second call where a first
# one ran out of time. CLUSTR_MM_GPU_BUDGET=SECONDS, counted from the
# start (mmcv's wait included): a part of step 54 whose estimate no longer
# fits in what is left is skipped, and its commands and train_speed.py's
# are stopped when it is spent. Exits non-zero if a tier step fails or a
# part was skipped.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DATE="$(date -u +%Y-%m-%d)"
OUT="${1:-$ROOT/gpu_checks/$DATE}"
RESULTS="${CLUSTR_MM_RESULTS:-$ROOT/docs/results}"
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
    [1-6]|54) ;;
    *) echo "CLUSTR_MM_GPU_STEPS: no step '$STEP' (the steps are 1-6, and 54:" \
            "issue 54's rows)" >&2
       exit 2 ;;
  esac
done
[ -n "${STEPS// /}" ] || {
  echo "CLUSTR_MM_GPU_STEPS names no step (the steps are 1-6 and 54)" >&2
  exit 2; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
WAIT="${CLUSTR_MM_MMCV_WAIT:-0}"
BUDGET="${CLUSTR_MM_GPU_BUDGET:-0}"  # 0: none
for SETTING in "CLUSTR_MM_MMCV_WAIT=$WAIT" "CLUSTR_MM_GPU_BUDGET=$BUDGET"; do
  case "${SETTING#*=}" in
    ''|*[!0-9]*) echo "${SETTING%%=*} must be whole seconds, got" \
                      "'${SETTING#*=}'" >&2
                 exit 2 ;;
  esac
done
cd "$ROOT"
mkdir -p "$OUT"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else
"torch.cuda.is_available() is False: run this on a machine with a GPU")' || exit 2
FAILED=0
log() { echo "[gpu_checks] $(date -u +%T) $*"; }
left() { echo $((BUDGET - SECONDS)); }  # of the budget (SECONDS: bash's clock)
fits() {  # fits EST WHAT: a step of about EST seconds fits in the budget
  [ "$BUDGET" -eq 0 ] || [ "$(left)" -ge "$1" ] && return 0
  log "skipped $2: about $1 s wanted, $(left) s of CLUSTR_MM_GPU_BUDGET left"
  FAILED=1; return 1
}
capped() {  # a command, stopped when the budget is spent
  if [ "$BUDGET" -eq 0 ]; then "$@"
  else timeout -k 10 "$(( $(left) > 1 ? $(left) : 1 ))" "$@"; fi
}

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
  capped "$PY" tools/analysis/train_speed.py "$@" --out "$OUT/$NAME.jsonl" 2>&1 \
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

if want 3 || want 4 || want 5 || want 6 || want 54; then  # mmdet's models
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
if want 54; then
  log "54. issue 54's rows (800x1344, Mask R-CNN AMP, 224, fp16 NaN check," \
      "UperNet and pose, compile) -> $OUT/54, copies in $RESULTS"
  P="$OUT/54"
  mkdir -p "$P"
  DEV=$("$PY" -c 'import re, torch
print(re.sub("[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()
             .replace("nvidia", "")).strip("-"))' 2>/dev/null)
  DEV="${DEV:-gpu}"  # e.g. h200
  publish() {  # publish FILE NAME: FILE of $P as $RESULTS/<date>_<device>_NAME
    [ -s "$P/$1" ] || { log "nothing to publish in $P/$1"; FAILED=1; return 1; }
    mkdir -p "$RESULTS" && cp "$P/$1" "$RESULTS/${DATE}_${DEV}_$2" \
      && log "-> $RESULTS/${DATE}_${DEV}_$2"
  }
  tiny_data  # the configs read the tiny embedded data (seconds)
  # what every row was measured with, beside the driver, CUDA, Triton and
  # torch versions that each row also names
  "$PY" - > "$P/versions.json" 2>/dev/null <<'EOS'
import json, platform, subprocess, sys
import torch
sys.path.insert(0, 'tools/analysis')
from clustr_mm.env_check import installed_version
from provenance import software
try:
    commit = subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True,
                            text=True).stdout.strip() or None
except OSError:
    commit = None
print(json.dumps(dict(
    device=torch.cuda.get_device_name(), torch=torch.__version__,
    **software('cuda'), python=platform.python_version(), commit=commit,
    **{name: installed_version(name) for name in (
        'mmcv', 'mmengine', 'mmdet', 'mmsegmentation', 'mmpose',
        'mmpretrain', 'numpy')}), indent=1))
EOS
  publish versions.json issue54_versions.json
  PEERS=configs/_peers
  # (a) the detectors' input size, backbone alone (target: ClusTR-S >= 0.85x
  #     PVTv2-b2 in inference and training img/s)
  fits 60 "54a (800x1344 img/s)" && {
    capped "$PY" tools/analysis/benchmark.py --device cuda --amp bf16 \
      --batch 2 --sizes 800x1344 --train-step --models clustr-s-window \
      pvtv2-b2 swin-t --out "$P/bench-800x1344.json" 2>&1 \
      | tee "$P/bench-800x1344.log"
    publish bench-800x1344.json bench-800x1344.json; }
  # (b) Mask R-CNN 1x under AMP, the three in one run (target: ClusTR-S <=
  #     1.3x Swin-T s/iter)
  fits 75 "54b (Mask R-CNN AMP)" && libs mmdet && {
    speed 54/mask-rcnn_train-speed_amp \
      configs/clustr/mask-rcnn_clustr-s_fpn_1x_coco.py \
      configs/paca/mask-rcnn_paca-s_fpn_ms-1x_coco.py \
      mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py \
      --amp --input-size 1333x800 --batch 2 --iters 6 --warmup 2
    publish mask-rcnn_train-speed_amp.jsonl mask-rcnn_train-speed_amp.jsonl; }
  # (c) the 224 table with today's defaults (targets: ClusTR-S >= 0.75x /
  #     0.95x PVTv2-b2)
  fits 45 "54c (224 img/s)" && {
    capped "$PY" tools/analysis/benchmark.py --device cuda --amp bf16 \
      --batch 128 --sizes 224 --train-step --models clustr-s-exact pvtv2-b2 \
      --out "$P/bench-224.json" 2>&1 | tee "$P/bench-224.log"
    publish bench-224.json bench-224_tf32x3.json; }
  # (e) 200 fp16 iterations without a non-finite number
  fits 40 "54e (nan_check fp16)" && libs mmpretrain && {
    capped "$PY" tools/analysis/nan_check.py \
      configs/clustr/clustr-t_embedded-imagenet.py --amp fp16 --iters 200 \
      --work-dir "$P/nan-fp16" 2>&1 | grep -v ' - mmengine - ' \
      | tee "$P/nan-fp16.log"
    sed -n 's/^\[nan-check\] {/{/p' "$P/nan-fp16.log" \
      > "$P/nan-check_fp16.jsonl"
    publish nan-check_fp16.jsonl nan-check_fp16.jsonl; }
  # (d) the fixed-size tasks' training step under AMP, at each recipe's batch
  #     per GPU (2 and 64); the tiny data read 64 times an epoch fills them
  fits 70 "54d (UperNet 512x512 s/iter)" && libs mmseg mmdet && {
    speed 54/upernet-512_train-speed_amp \
      configs/clustr/upernet_clustr-s_8xb2-160k_ade20k-512x512.py \
      $PEERS/upernet_swin-t_8xb2-160k_ade20k-512x512.py \
      $PEERS/upernet_pvtv2-b2_8xb2-160k_ade20k-512x512.py \
      --amp --repeat 64 --iters 5 --warmup 2
    publish upernet-512_train-speed_amp.jsonl \
      upernet-512_train-speed_amp.jsonl; }
  fits 70 "54d (whole-body pose 256x192 s/iter)" && libs mmpose mmdet && {
    speed 54/pose-wholebody-256x192_train-speed_amp \
      configs/clustr/td-hm_clustr-s_mta-8xb64-210e_coco-wholebody-256x192.py \
      $PEERS/td-hm_swin-t_mta-8xb64-210e_coco-wholebody-256x192.py \
      $PEERS/td-hm_pvtv2-b2_mta-8xb64-210e_coco-wholebody-256x192.py \
      --amp --repeat 64 --iters 5 --warmup 2
    publish pose-wholebody-256x192_train-speed_amp.jsonl \
      pose-wholebody-256x192_train-speed_amp.jsonl; }
  # (f) CUDA graphs through MMEngine's compile (docs/compile.md), against
  #     (d)'s eager ClusTR-S row; the warm-up takes dynamo, inductor and the
  #     graphs' recording
  fits 130 "54f (UperNet under compile reduce-overhead)" \
    && libs mmseg && {
    speed 54/upernet-512_train-speed_amp_compile-reduce-overhead \
      configs/clustr/upernet_clustr-s_8xb2-160k_ade20k-512x512.py \
      --amp --repeat 64 --iters 6 --warmup 4 \
      --cfg-options compile.mode=reduce-overhead compile.dynamic=False
    publish upernet-512_train-speed_amp_compile-reduce-overhead.jsonl \
      upernet-512_train-speed_amp_compile-reduce-overhead.jsonl; }
fi
log "done; tier failures: $FAILED; results in $OUT"
exit "$FAILED"
