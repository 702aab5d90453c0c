"""Export a clustr_mm model to ONNX and check it in ONNX Runtime.

    python tools/deployment/pytorch2onnx.py CONFIG [CHECKPOINT] --shape H W
        [--batch N] [--dynamic] [--out FILE] [--part {model,backbone}]
        [--exporter {torchscript,dynamo}] [--opset 17] [--tol 1e-4]
        [--check-shape B H W ...] [--cfg-options k=v ...]

What is exported (the tensor path, as the libraries' own tools; no data
preprocessing: the graph takes the normalised NCHW float image):

- a backbone (a config whose ``model`` is a backbone, or ``--part backbone``
  of any config): the tuple of feature maps, outputs ``feat0``, ``feat1``...;
- mmpretrain classifiers: the logits (``logits``), no softmax;
- mmseg segmentors: whole-image logits (``seg_logits``: the decode head's
  output resized to the input, as mmseg's 'whole' inference; no auxiliary
  head);
- mmpose top-down estimators: the head's output (``output0``...);
- mmdet detectors: the dense tensor outputs (``output0``...): a one-stage
  detector's head maps (class scores, box deltas per level); a two-stage
  detector's neck features, then its RPN head's maps. Box decoding, NMS and
  the RoI heads are data-dependent and not in the graph.

CHECKPOINT (optional; random weights, seed 0, without it): a whole-model
runner checkpoint, or backbone weights when exporting a backbone. Loaded
strictly: a deployed file must not silently miss weights.

The export and its check are ``onnx_export.py``'s functions (shared with
``tools/analysis/onnxruntime_speed.py``). After the export the file is run
in ONNX Runtime (CPU) and compared with
PyTorch (eval mode) on the same random inputs (normal, seed 0): at
(``--batch``, H, W), and with ``--dynamic`` (batch, height and width are
graph inputs) also at every ``--check-shape B H W`` (default one more:
batch + 1, H + 17, W + 11). The largest difference of every output is
printed; if one exceeds ``--tol`` times max(1, the largest |PyTorch value|
of that output) the file is not written and the tool exits 1. Without
``--dynamic`` the graph has a static input shape and ONNX Runtime refuses
any other (an error, never a wrong output).

ClusTR (DPC-kNN clustering) graphs are right only at their export height
and width (the clustering windows and cluster counts are fixed when
traced): with ``--dynamic`` only the batch is a graph input, height and
width stay fixed dims that ONNX Runtime enforces, and a ``--check-shape``
of another size is refused. Export one file per input size.

Exporters: ``torchscript`` (default; ``torch.onnx.export(..., dynamo=False)``
where torch has the argument) or ``dynamo`` (``dynamo=True``, torch >= 2.5
with onnxscript installed). Opset 17 by default. See docs/deployment.md for
what exports with which exporter and the differences measured.
"""
import argparse
import os
import os.path as osp
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import torch  # noqa: E402
from mmengine.config import Config, DictAction  # noqa: E402

import clustr_mm  # noqa: E402,F401  (registers the backbones)
from clustr_mm.engine.options import merge_cfg_options  # noqa: E402
from clustr_mm.engine.cli_args import (  # noqa: E402
    new_file, positive_float, positive_int)

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from onnx_export import (EXPORTERS, ExportError, TensorPath,  # noqa: E402
                         build_model, compare, export, load_weights,
                         ort_session, random_input, static_hw_reason)

PARTS = ('model', 'backbone')


def default_check_shapes(batch: int, h: int, w: int, dynamic: bool,
                         dynamic_hw: bool = True
                         ) -> List[Tuple[int, int, int]]:
    shapes = [(batch, h, w)]
    if dynamic:
        shapes.append((batch + 1, h + 17, w + 11) if dynamic_hw else
                      (batch + 1, h, w))
    return shapes


def export_and_check(cfg: Config, checkpoint: Optional[str],
                     shape: Tuple[int, int], out: str, batch: int = 1,
                     dynamic: bool = False, part: str = 'model',
                     exporter: str = 'torchscript', opset: int = 17,
                     tol: float = 1e-4,
                     check_shapes: Optional[Sequence[Sequence[int]]] = None,
                     log=print) -> Dict:
    """Export ``cfg``'s model, compare ONNX Runtime with PyTorch at every
    check shape and move the file to ``out`` only if every output agrees
    within ``tol`` * max(1, max |PyTorch|); otherwise no file and an
    ExportError. Returns the report (what was exported, every difference).
    """
    if part not in PARTS:
        raise ExportError(f'part must be one of {PARTS}, got {part!r}')
    h, w = shape
    if h < 1 or w < 1 or batch < 1:
        raise ExportError(f'--shape and --batch must be positive, got '
                          f'shape {tuple(shape)}, batch {batch}')
    if not tol > 0:
        raise ExportError(f'--tol must be > 0, got {tol}')
    for s in check_shapes or ():
        if len(s) != 3 or min(s) < 1:
            raise ExportError(f'--check-shape takes three positive ints B H '
                              f'W, got {tuple(s)}')
    torch.manual_seed(0)
    model, scope = build_model(cfg)
    model.eval()
    path_module = TensorPath(model, scope, part).eval()
    if checkpoint:
        load_weights(path_module.model, checkpoint,
                     backbone=path_module.scope is None)
    static_hw = static_hw_reason(path_module)
    checks = [(batch, h, w)] + [tuple(s) for s in check_shapes or ()]
    if check_shapes is None:
        checks = default_check_shapes(batch, h, w, dynamic, not static_hw)
    if not dynamic and any(tuple(s) != (batch, h, w) for s in checks):
        raise ExportError('--check-shape needs --dynamic: a static graph '
                          f'takes only its export shape {(batch, h, w)}')
    if static_hw and any(tuple(s[1:]) != (h, w) for s in checks):
        raise ExportError(
            f'{static_hw}: its graph takes only {h} x {w} inputs (any batch '
            'with --dynamic); export one file per input size instead of '
            '--check-shape with another height or width')
    what = path_module.describe()
    mode = 'static shape'
    if dynamic:
        mode = ('dynamic batch, static height and width (' + static_hw +
                ')' if static_hw else 'dynamic batch, height and width')
    log(f'[pytorch2onnx] exporting {what}; input (batch, 3, H, W) = '
        f'({batch}, 3, {h}, {w}), {mode}, {exporter} exporter, '
        f'opset {opset}')
    out_dir = osp.dirname(osp.abspath(out))
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix='.onnx.tmp', dir=out_dir)
    os.close(fd)
    try:
        t0 = time.perf_counter()
        # torch.export specialises a dim whose example size is 1: a dynamic
        # batch is traced with an example of 2 (the graph takes any)
        example_batch = (max(batch, 2) if dynamic and exporter == 'dynamo'
                         else batch)
        names = export(path_module, random_input((example_batch, 3, h, w)),
                       tmp, exporter, opset, dynamic, not static_hw)
        export_s = time.perf_counter() - t0
        session = ort_session(tmp)
        rows, worst = [], 0.0
        for b, ch, cw in checks:
            for row in compare(path_module, session, names, (b, 3, ch, cw)):
                row['input'] = [b, 3, ch, cw]
                row['scaled'] = row['max_abs_diff'] / max(1.0,
                                                          row['max_abs_ref'])
                worst = max(worst, row['scaled'])
                rows.append(row)
                log(f'[pytorch2onnx]   input {b}x3x{ch}x{cw} '
                    f'{row["output"]} {tuple(row["shape"])}: max |onnx - '
                    f'torch| = {row["max_abs_diff"]:.3e} (max |torch| '
                    f'{row["max_abs_ref"]:.3g})')
        report = dict(config=cfg.filename, checkpoint=checkpoint,
                      exported=what, exporter=exporter, opset=opset,
                      dynamic=dynamic, dynamic_hw=dynamic and not static_hw,
                      outputs=names, checks=rows,
                      worst_scaled_diff=worst, tol=tol,
                      export_seconds=round(export_s, 2),
                      torch=torch.__version__)
        if not worst <= tol:
            raise ExportError(
                f'ONNX Runtime disagrees with PyTorch: largest difference '
                f'{worst:.3e} x max(1, max |torch|) > tol {tol:g}; no file '
                'written')
        os.replace(tmp, out)
        report['out'] = out
        log(f'[pytorch2onnx] wrote {out}: every output within {tol:g} '
            f'(largest {worst:.2e} of max(1, max |torch|)); export took '
            f'{export_s:.1f} s')
        return report
    finally:
        if osp.exists(tmp):
            os.remove(tmp)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', nargs='?', default=None,
                        help='weights (default: random, seed 0)')
    parser.add_argument('--shape', nargs=2, type=positive_int, required=True,
                        metavar=('H', 'W'), help='export input size')
    parser.add_argument('--batch', type=positive_int, default=1,
                        help='export batch size (default 1)')
    parser.add_argument('--dynamic', action='store_true',
                        help='batch, height and width as graph inputs')
    parser.add_argument('--out', default=None, type=new_file,
                        help='ONNX file (default: work_dirs/onnx/'
                        '<config name>[_backbone].onnx)')
    parser.add_argument('--part', choices=PARTS, default='model',
                        help="'backbone': export the model's backbone only")
    parser.add_argument('--exporter', choices=EXPORTERS,
                        default='torchscript')
    parser.add_argument('--opset', type=positive_int, default=17)
    parser.add_argument('--tol', type=positive_float, default=1e-4,
                        help='largest allowed |onnx - torch| per output, in '
                        'units of max(1, max |torch|) (default 1e-4)')
    parser.add_argument('--check-shape', nargs=3, type=positive_int,
                        action='append',
                        metavar=('B', 'H', 'W'), default=None,
                        help='(with --dynamic) also compare at this input; '
                        'repeatable (default: B+1, H+17, W+11)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        default={}, help='override config entries')
    return parser.parse_args(argv)


def main(argv=None) -> Dict:
    args = parse_args(argv)
    if not osp.isfile(args.config):
        raise SystemExit(f'config file not found: {args.config}')
    cfg = Config.fromfile(args.config)
    try:
        merge_cfg_options(cfg, args.cfg_options, args.config)
    except ValueError as err:
        raise SystemExit(str(err))
    out = args.out or osp.join(
        'work_dirs', 'onnx', osp.splitext(osp.basename(args.config))[0] +
        ('_backbone' if args.part == 'backbone' else '') + '.onnx')
    try:
        return export_and_check(
            cfg, args.checkpoint, tuple(args.shape), out, args.batch,
            args.dynamic, args.part, args.exporter, args.opset, args.tol,
            args.check_shape)
    except ExportError as err:
        print(f'[pytorch2onnx] FAILED: {err}', file=sys.stderr)
        raise SystemExit(1)


if __name__ == '__main__':
    main()
