#!/usr/bin/env bash
# Multi-process training with torchrun: bash tools/dist_train.sh CONFIG NPROC [train.py args]
# One process per GPU (NCCL); on a machine without GPUs, NPROC CPU processes (gloo).
set -euo pipefail
USAGE="usage: bash tools/dist_train.sh CONFIG NPROC [train.py args]"
if [ $# -lt 2 ]; then
  echo "dist_train.sh: CONFIG and NPROC (the number of processes: GPUs, or CPU processes) are required; $USAGE" >&2
  exit 2
fi
CONFIG=$1
NPROC=$2
if ! [[ "$NPROC" =~ ^[1-9][0-9]*$ ]]; then
  echo "dist_train.sh: NPROC must be a positive integer (the number of processes), got '$NPROC'; $USAGE" >&2
  exit 2
fi
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-python}
PYTHONPATH="$ROOT:${PYTHONPATH:-}" exec "$PYTHON" -m torch.distributed.run \
  --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
  --nproc_per_node="$NPROC" --master_port="$PORT" \
  "$ROOT/tools/train.py" "$CONFIG" --launcher pytorch "${@:3}"
