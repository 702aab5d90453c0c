#!/usr/bin/env bash
# Multi-process training with torchrun: bash tools/dist_train.sh CONFIG NPROC [train.py args]
# One process per GPU (NCCL); on a machine without GPUs, NPROC CPU processes (gloo).
set -euo pipefail
CONFIG=$1
NPROC=$2
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
