#!/usr/bin/env bash
# Training under Slurm: bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG [WORK_DIR] [train.py args]
# GPUS (default 8), GPUS_PER_NODE (8), CPUS_PER_TASK (5) and SRUN_ARGS come from the environment.
set -euo pipefail
USAGE="usage: bash $0 PARTITION JOB_NAME CONFIG [WORK_DIR] [train.py args]"
PARTITION=${1:?$USAGE}
JOB_NAME=${2:?$USAGE}
CONFIG=${3:?$USAGE}
WORK_DIR=${4:-work_dirs/$(basename "${CONFIG%.*}")}
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-python}
PYTHONPATH="$ROOT:${PYTHONPATH:-}" srun -p "$PARTITION" --job-name="$JOB_NAME" \
  --gres=gpu:"$GPUS_PER_NODE" --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE" \
  --cpus-per-task="$CPUS_PER_TASK" --kill-on-bad-exit=1 $SRUN_ARGS \
  "$PYTHON" -u "$ROOT/tools/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher=slurm "${@:5}"
