#!/usr/bin/env bash
# Multi-process evaluation: bash tools/dist_test.sh CONFIG CHECKPOINT NPROC [test.py args]
set -euo pipefail
USAGE="usage: bash tools/dist_test.sh CONFIG CHECKPOINT NPROC [test.py args]"
if [ $# -lt 3 ]; then
  echo "dist_test.sh: CONFIG, CHECKPOINT and NPROC (the number of processes) are required; $USAGE" >&2
  exit 2
fi
CONFIG=$1
CHECKPOINT=$2
NPROC=$3
if ! [[ "$NPROC" =~ ^[1-9][0-9]*$ ]]; then
  echo "dist_test.sh: NPROC must be a positive integer (the number of processes), got '$NPROC'; $USAGE" >&2
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
  "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "${@:4}"
