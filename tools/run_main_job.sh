#!/usr/bin/env bash
# The main job on the embedded data: set up the environment, generate the tiny
# datasets, train a detector with tools/train.py and evaluate it with
# tools/test.py (COCO box and mask metrics).
#   bash tools/run_main_job.sh [CONFIG]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CONFIG="${1:-configs/clustr/mask-rcnn_clustr-t_fpn_embedded-coco.py}"
bash "$ROOT/tools/setup_env.sh"
VENV="${CLUSTR_MM_VENV:-$ROOT/.venv}"
cd "$ROOT"
"$VENV/bin/python" tools/data/make_tiny_data.py --out data
NAME=$(basename "${CONFIG%.py}")
WORK_DIR="work_dirs/main_job/$NAME"
echo "[main_job] training $CONFIG -> $WORK_DIR"
"$VENV/bin/python" tools/train.py "$CONFIG" --work-dir "$WORK_DIR"
CKPT=$(cat "$WORK_DIR/last_checkpoint")
echo "[main_job] evaluating $CKPT"
"$VENV/bin/python" tools/test.py "$CONFIG" "$CKPT" --work-dir "$WORK_DIR"
