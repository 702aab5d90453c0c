#!/usr/bin/env bash
# Create or re-check .venv-mmdeploy: mmdeploy 1.3.1 (requirements/mmdeploy.txt)
# on top of the torch 2.1 stack, which must exist first:
#   CLUSTR_MM_STACK=torch2.1 bash tools/setup_env.sh
#   bash tools/deployment/setup_mmdeploy_env.sh
# mmdeploy supports torch <= 2.1 with mmcv 2.1 (on torch 2.14 its
# torch.onnx.export call runs the dynamo exporter and its rewriters are
# bypassed), and pins protobuf<=3.20.2, which the stack's onnx 1.23 cannot
# use: so the side environment holds only mmdeploy, protobuf, onnx and a few
# small packages, and reads the rest from the stack (a .pth file adds the
# stack's site-packages after its own). Idempotent: a second run re-checks
# the imports (seconds).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STACK="${CLUSTR_MM_STACK_VENV:-$ROOT/.venv-torch2.1}"
VENV="${CLUSTR_MM_MMDEPLOY_VENV:-$ROOT/.venv-mmdeploy}"
REQ="$ROOT/requirements/mmdeploy.txt"
STAMP="$VENV/.clustr_mm_mmdeploy"

[ -x "$STACK/bin/python" ] || {
  echo "[setup_mmdeploy] no torch 2.1 stack at $STACK: run" \
       "'CLUSTR_MM_STACK=torch2.1 bash tools/setup_env.sh' first" >&2; exit 2; }
SITE=$("$STACK/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
KEY=$(cat "$REQ" "$0" | sha256sum | cut -c1-16)-$(basename "$STACK")

if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$KEY" ]; then
  echo "[setup_mmdeploy] creating $VENV on top of $STACK"
  rm -rf "$VENV"
  # the same interpreter as the stack (its compiled packages are read too)
  "$(readlink -f "$STACK/bin/python")" -m venv "$VENV"
  OWN=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # addsitedir: the stack's own .pth files (clustr_mm's editable install)
  # are processed too
  echo "import site; site.addsitedir('$SITE')" > "$OWN/zz_clustr_mm_stack.pth"
  "$VENV/bin/python" -m pip install --quiet --no-deps -r "$REQ"
  echo "$KEY" > "$STAMP"
fi

# The side environment's protobuf and onnx, everything else the stack's.
"$VENV/bin/python" - "$SITE" "$REQ" <<'PY'
import re, sys
import google.protobuf, mmcv, mmdeploy, numpy, onnx, onnxruntime, torch
import clustr_mm
from mmdeploy.backend.onnxruntime.init_plugins import get_ops_path
stack, req = sys.argv[1], open(sys.argv[2]).read()
pins = dict(re.findall(r'^([\w-]+)==(\S+)', req, re.M))
assert google.protobuf.__version__ == pins['protobuf'], google.protobuf.__version__
assert onnx.__version__ == pins['onnx'], onnx.__version__
assert mmdeploy.__version__ == pins['mmdeploy'], mmdeploy.__version__
for module in (torch, mmcv, numpy, onnxruntime):
    assert module.__file__.startswith(stack), (module.__name__, module.__file__)
ops = get_ops_path()
assert ops, "mmdeploy's ONNX Runtime custom ops library is missing"
onnxruntime.SessionOptions().register_custom_ops_library(ops)
print(f'[setup_mmdeploy] ok: mmdeploy {mmdeploy.__version__}, torch '
      f'{torch.__version__}, mmcv {mmcv.__version__}, onnx {onnx.__version__}, '
      f'onnxruntime {onnxruntime.__version__}, protobuf '
      f'{google.protobuf.__version__}, numpy {numpy.__version__}')
PY
