#!/usr/bin/env bash
# Create or update a virtual environment with one of the tested, pinned
# OpenMMLab stacks (docs/environments.md). Idempotent: a second run only
# re-checks the installation (seconds).
#
#   bash tools/setup_env.sh                          # default stack -> .venv
#   CLUSTR_MM_STACK=torch2.1 bash tools/setup_env.sh # torch 2.1.2 -> .venv-torch2.1
#
# A stack is its torch pair, requirements/torch.txt (default) or
# requirements/torch<X.Y>.txt, plus the shared locks requirements/mmlibs.txt,
# tests.txt and onnx.txt (ONNX export and ONNX Runtime).
# Override the venv path with CLUSTR_MM_VENV, the base interpreter with
# CLUSTR_MM_PYTHON.
#
# The mmcv 2.1.0 wheel (about 6 min to compile on 2 cores, 31 with CUDA ops) is
# cached outside the repo in ${CLUSTR_MM_CACHE:-~/.cache/clustr_mm}, keyed by
# mmcv, torch, python and device flavour, so the build happens once per
# machine and stack.
#
# mmcv's ops flavour: CUDA ops where nvcc and a GPU are present, CPU ops
# otherwise. CLUSTR_MM_MMCV_CUDA=1 asks for the CUDA ops on a build node
# without a GPU (nvcc needed), =0 for the CPU ops anywhere. CUDA ops are
# built for TORCH_CUDA_ARCH_LIST (default "8.0;9.0": A100, H100) and cached
# apart from CPU wheels (the key names the nvcc release and the archs).
#   bash tools/setup_env.sh --mmcv-plan   # print the flavour, build
#                                         # variables and cache dir; no changes
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="${CLUSTR_MM_STACK:-default}"
if [ "$STACK" = default ]; then
  TORCH_REQ="$ROOT/requirements/torch.txt"
  VENV="${CLUSTR_MM_VENV:-$ROOT/.venv}"
else
  TORCH_REQ="$ROOT/requirements/$STACK.txt"
  VENV="${CLUSTR_MM_VENV:-$ROOT/.venv-$STACK}"
fi
[ -f "$TORCH_REQ" ] || { echo "[setup_env] unknown stack '$STACK': no $TORCH_REQ" >&2; exit 2; }
CACHE="${CLUSTR_MM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clustr_mm}"
PY_BASE="${CLUSTR_MM_PYTHON:-python3.11}"
MMCV_VERSION=2.1.0
XTCOCO_VERSION=1.14.3
STAMP="$VENV/.clustr_mm_env"

# The mmcv build this machine gets: FLAVOUR, MMCV_BUILD_ENV, WHEEL_KEY.
mmcv_plan() {
  case "${CLUSTR_MM_MMCV_CUDA:-auto}" in
    1) FLAVOUR=cuda
       command -v nvcc >/dev/null || {
         echo "[setup_env] CLUSTR_MM_MMCV_CUDA=1 needs nvcc on PATH" >&2; return 1; } ;;
    0) FLAVOUR=cpu ;;
    auto) FLAVOUR=cpu
          if command -v nvcc >/dev/null && nvidia-smi -L >/dev/null 2>&1; then FLAVOUR=cuda; fi ;;
    *) echo "[setup_env] CLUSTR_MM_MMCV_CUDA must be 1, 0 or auto, got" \
            "'$CLUSTR_MM_MMCV_CUDA'" >&2; return 1 ;;
  esac
  MMCV_BUILD_ENV=(MMCV_WITH_OPS=1)
  WHEEL_KEY=$FLAVOUR
  if [ "$FLAVOUR" = cuda ]; then
    local archs="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}" nvcc_v
    nvcc_v=$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
    MMCV_BUILD_ENV+=(FORCE_CUDA=1 "TORCH_CUDA_ARCH_LIST=$archs")
    WHEEL_KEY="cuda$nvcc_v-sm$(echo "$archs" | tr -d '.' | tr ' ;' '__')"
  fi
}

if [ "${1:-}" = --mmcv-plan ]; then
  mmcv_plan
  TORCH_V=$(sed -n 's/^torch==//p' "$TORCH_REQ")
  PY_TAG=$("$PY_BASE" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  echo "flavour=$FLAVOUR"
  echo "build_env=${MMCV_BUILD_ENV[*]}"
  echo "wheel_dir=$CACHE/mmcv-$MMCV_VERSION-torch$TORCH_V-$PY_TAG-$WHEEL_KEY"
  exit 0
fi

STEP="start"
step() { STEP="$1"; echo "[setup_env] $(date +%H:%M:%S) $1"; }
fail() {
  echo "[setup_env] FAILED during: $STEP" >&2
  echo "[setup_env] Fix the error above, then re-run 'bash tools/setup_env.sh';" \
       "finished steps are skipped. To start over: rm -rf '$VENV'." >&2
}
trap fail ERR

# Everything that defines the environment; a change re-runs the installs.
fingerprint() {
  cat "$TORCH_REQ" "$ROOT"/requirements/mmlibs.txt "$ROOT"/requirements/tests.txt \
    "$ROOT"/requirements/onnx.txt "$ROOT/tools/setup_env.sh" "$ROOT/setup.py" \
    | sha256sum | cut -c1-16
}

# The versions an install must not move (valid once mmcv is installed).
stack_versions() {
  "$PY" -c 'from importlib.metadata import version as v
print(*(f"{d}=={v(d)}" for d in ("torch", "torchvision", "mmcv", "mmengine", "numpy")))'
}

# install_keeping_stack WHAT PIP_ARGS...: pip install, then fail if that
# changed stack_versions.
install_keeping_stack() {
  local what="$1" before after
  shift
  before=$(stack_versions)
  "${PIP[@]}" install -q "$@"
  after=$(stack_versions)
  if [ "$before" != "$after" ]; then
    echo "[setup_env] $what changed the stack: $before -> $after" >&2
    false
  fi
}

step "1/7 virtual environment ($VENV, stack $STACK)"
if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PY_BASE" >/dev/null || { echo "need $PY_BASE (set CLUSTR_MM_PYTHON)" >&2; false; }
  "$PY_BASE" -m venv "$VENV"
fi
echo '*' >"$VENV/.gitignore"         # keep any venv name out of git
echo "$STACK" >"$VENV/.clustr_mm_stack" # tests/test_env.py checks this stack's pins
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
export PIP_PROGRESS_BAR=off

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(fingerprint)" ]; then
  echo "[setup_env] environment up to date; checking it"
else
  step "2/7 torch + torchvision (first time: large download)"
  "${PIP[@]}" install -q -r "$TORCH_REQ" 'setuptools<82' wheel \
    numpy==1.26.4 ninja cython

  step "3/7 mmcv $MMCV_VERSION with ops (cached wheel)"
  TORCH_V=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
  PY_TAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  mmcv_plan
  WHEEL_DIR="$CACHE/mmcv-$MMCV_VERSION-torch$TORCH_V-$PY_TAG-$WHEEL_KEY"
  if ! ls "$WHEEL_DIR"/mmcv-*.whl >/dev/null 2>&1; then
    BUILD=$(mktemp -d)
    # times measured on a 2-core machine with GCC (docs/environments.md)
    if [ "$FLAVOUR" = cuda ]; then EXPECT="31 min for two archs"; else EXPECT="6 min"; fi
    echo "[setup_env] building mmcv from source ($FLAVOUR ops); about $EXPECT on 2 cores, once per machine"
    "${PIP[@]}" download -q --no-deps --no-binary :all: --no-build-isolation \
      "mmcv==$MMCV_VERSION" -d "$BUILD"
    tar -xzf "$BUILD"/mmcv-*.tar.gz -C "$BUILD"
    SRC=$(echo "$BUILD"/mmcv-$MMCV_VERSION)
    # torch >= 2.5 headers need C++20; mmcv 2.1.0 hard-codes C++17, which
    # is right for older torch.
    if "$PY" -c 'import sys, torch; v = torch.__version__.split("+")[0].split(".")
sys.exit(0 if (int(v[0]), int(v[1])) >= (2, 5) else 1)'; then
      sed -i 's/-std=c++17/-std=c++20/g' "$SRC/setup.py"
    fi
    # -g0: no debug info. It halves the compile time of mmcv's C++ files
    # (pytorch/nms.cpp 37.9 s -> 16.5 s, 2026-11-26) and changes nothing the
    # ops compute. A CFLAGS variable replaces Python's own flags (-O3 among
    # them) rather than adding to them, so it starts from those.
    PY_CFLAGS=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("CFLAGS") or "")')
    export "${MMCV_BUILD_ENV[@]}" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
      CFLAGS="${CFLAGS:-$PY_CFLAGS} -g0"
    if [ "$FLAVOUR" = cuda ]; then
      # torch's CUDA headers include the CUDA libraries' (cusparse.h,
      # cublas_v2.h, ...); a node with nvcc alone lacks them (seen here,
      # nvcc 13.0: "fatal error: cusparse.h"). torch's own nvidia-* wheels
      # carry them, matching its CUDA: searched after the toolkit's.
      NV_INC=$("$PY" -c 'import glob, os, sysconfig
print(os.pathsep.join(sorted(glob.glob(os.path.join(
    sysconfig.get_paths()["purelib"], "nvidia", "*", "include")))))')
      export CPATH="${CPATH:+$CPATH:}$NV_INC"
      # torch takes CUDA_HOME from `which nvcc`'s parent; an nvcc that is a
      # wrapper script (/usr/local/bin/nvcc here) gives /usr/local, without
      # the toolkit's headers (crt/host_defines.h) or lib64/libcudart. The
      # toolkit nvcc itself runs from is TOP in its dry run.
      if [ -z "${CUDA_HOME:-}" ]; then
        TOP=$( { nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 || true; } | sed -n 's/^#\$ TOP=//p' | head -n 1)
        if [ -n "$TOP" ]; then export CUDA_HOME="$(cd "$TOP" && pwd -P)"; fi
      fi
      echo "[setup_env]   CUDA build with CUDA_HOME=${CUDA_HOME:-unset} ($(nvcc --version | tail -n 2 | head -n 1))"
    fi
    # GCC: torch's headers parsed once for most C++ files (tools/pch_cxx.sh)
    PCH_DIR="$BUILD/pch"
    PCH_HEADER="$SRC/mmcv/ops/csrc/common/pytorch_cpp_helper.hpp"
    GCH="$(basename "$PCH_HEADER").gch"  # the name pch_cxx.sh gives it
    if "${CXX:-c++}" --version 2>/dev/null | grep -q 'Free Software Foundation'; then
      export PCH_REAL_CXX="${CXX:-c++}" PCH_DIR PCH_HEADER \
        CXX="$ROOT/tools/pch_cxx.sh"
    fi
    LOG="$BUILD/build.log"
    ( cd "$SRC" && "${PIP[@]}" wheel -v --no-deps --no-build-isolation -w "$BUILD/dist" . ) \
      >"$LOG" 2>&1 &
    BUILD_PID=$!
    START=$SECONDS
    while kill -0 "$BUILD_PID" 2>/dev/null; do
      sleep 60
      DONE=$(grep -c '\.o$\|-o .*\.o ' "$LOG" 2>/dev/null || true)
      echo "[setup_env]   mmcv build: $(( (SECONDS - START) / 60 )) min, ~$DONE objects compiled"
    done
    if ! wait "$BUILD_PID"; then tail -40 "$LOG" >&2; false; fi
    echo "[setup_env]   mmcv built in $(( (SECONDS - START) / 60 )) min $(( (SECONDS - START) % 60 )) s"
    if [ -e "$PCH_DIR/$GCH" ]; then
      echo "[setup_env]   precompiled header: used; skipped by" \
        "$(grep -c "$GCH: not used" "$LOG" || true) compiles"
    elif [ -e "$PCH_DIR/$GCH.failed" ]; then
      echo "[setup_env]   precompiled header: not made ($(head -c 300 "$PCH_DIR/$GCH.failed"))"
    fi
    mkdir -p "$WHEEL_DIR"
    mv "$BUILD"/dist/mmcv-*.whl "$WHEEL_DIR/"
    rm -rf "$BUILD"
  fi
  "${PIP[@]}" install -q --no-deps "$WHEEL_DIR"/mmcv-*.whl

  step "4/7 mmengine, mmdet, mmsegmentation, mmpretrain and their needs"
  # -c: nothing here may move the stack's torch pair.
  "${PIP[@]}" install -q -r "$ROOT/requirements/mmlibs.txt" -r "$ROOT/requirements/tests.txt" \
    -c "$TORCH_REQ" "$WHEEL_DIR"/mmcv-*.whl addict rich termcolor yapf
  # ONNX export and its check; onnx/onnxscript would take numpy 2 with them
  # (through ml_dtypes >= 0.6) if the lock did not hold them.
  install_keeping_stack "requirements/onnx.txt" -r "$ROOT/requirements/onnx.txt" \
    -c "$TORCH_REQ" -c "$ROOT/requirements/mmlibs.txt"

  step "5/7 xtcocotools $XTCOCO_VERSION from source (the binary wheel breaks on this numpy)"
  NP_V=$("$PY" -c 'import numpy; print(numpy.__version__)')
  XT_DIR="$CACHE/xtcocotools-$XTCOCO_VERSION-numpy$NP_V-$PY_TAG"
  if ! ls "$XT_DIR"/xtcocotools-*.whl >/dev/null 2>&1; then
    "${PIP[@]}" wheel -q --no-deps --no-binary xtcocotools --no-build-isolation \
      "xtcocotools==$XTCOCO_VERSION" -w "$XT_DIR"
  fi
  "${PIP[@]}" install -q --no-deps "$XT_DIR"/xtcocotools-*.whl

  # Both without their declared deps: mmpose's chumpy does not build, and
  # openmim's opendatalab -> openxlab pins numpy and setuptools (it would
  # move the stack). Their real runtime needs are in requirements/.
  step "6/7 mmpose 1.3.2 and openmim 0.3.9 (without their declared deps)"
  "${PIP[@]}" install -q --no-deps mmpose==1.3.2 openmim==0.3.9

  step "7/7 clustr_mm (editable, plain 'pip install -e .': must not move the stack)"
  install_keeping_stack "'pip install -e .'" -e "$ROOT"
  fingerprint >"$STAMP"
fi

STEP="final check"
"$PY" - <<'PYCHECK'
import importlib
import torch
for name in ('torch', 'mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain', 'mmpose',
             'onnx', 'onnxruntime', 'clustr_mm'):
    mod = importlib.import_module(name)
    print(f'[setup_env]   {name:10s} {mod.__version__}')
from mmcv.ops import RoIAlign, nms
boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [50., 50., 60., 60.]])
_, keep = nms(boxes, torch.tensor([0.9, 0.8, 0.7]), iou_threshold=0.5)
assert keep.tolist() == [0, 2], keep
feat = torch.arange(64.).reshape(1, 1, 8, 8)
out = RoIAlign((2, 2), spatial_scale=1.0, sampling_ratio=1, aligned=True)(
    feat, torch.tensor([[0., 0., 0., 4., 4.]]))
assert out.shape == (1, 1, 2, 2) and torch.isfinite(out).all()
print('[setup_env]   mmcv.ops nms and RoIAlign run on CPU tensors')
PYCHECK
trap - ERR
echo "[setup_env] ready: $VENV"
