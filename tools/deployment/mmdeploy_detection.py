"""An mmdet detector end to end through mmdeploy and ONNX Runtime, checked
against PyTorch on the same images.

    .venv-mmdeploy/bin/python tools/deployment/mmdeploy_detection.py \\
        CONFIG [CHECKPOINT] --deploy-cfg configs/deploy/FILE \\
        [--images IMG ...] [--work-dir DIR] [--box-tol 1e-3] [--score-tol 1e-4]

Runs in mmdeploy's side environment (``bash
tools/deployment/setup_mmdeploy_env.sh``, on the torch 2.1 stack). mmdeploy's
``torch2onnx`` writes ``DIR/end2end.onnx`` with its rewriters: the box
decoding, NMS (ONNX NonMaxSuppression) and RoIAlign (ONNX RoiAlign, opset
16 and later) are in the graph. Then, per image, on mmdeploy's preprocessed
input (``create_input``: a static deploy config resizes to its size):

1. **The graph** (checked): ONNX Runtime's outputs (``dets``, ``labels``)
   against the same model run in PyTorch under mmdeploy's rewriters (the
   forward that was exported). Each PyTorch detection must have an ONNX
   Runtime one with the same label, the box within ``--box-tol`` pixels
   (largest coordinate difference) and the score within ``--score-tol``,
   matched one to one, and the counts must be equal. Where a result is full
   (``keep_top_k`` detections) the detections at its lowest score are a cut
   that near-equal scores make arbitrary: both sides are compared above it.
2. **mmdeploy against mmdet** (reported, not checked): mmdeploy's ONNX
   Runtime detector against the stock mmdet model (``test_step``), matched
   the same way. They differ by design: mmdeploy's rewritten
   post-processing runs the RPN's NMS over all levels as one class (mmdet:
   per level), applies the deploy config's score threshold and ``pre_top_k``
   there, and caps boxes per class; the count of unmatched detections says
   how much that changes.

Where the graph disagrees on an image, the PyTorch forward is run again on
that input times ``1 + NOISE * N(0, 1)`` (``--noise``, default 1e-5
relative: the order of the differences between ClusTR-T backbone graphs and
PyTorch, up to 8e-6, docs/deployment.md), for ``--noise-draws`` seeded
draws (default 4; one draw is not enough: on one image one draw moved 56 of
87 detections and another none). If PyTorch's own detections move beyond
the tolerances under any draw, the image is **input-sensitive**: the model
sits near a discrete decision there (ClusTR's clustering: a density or
nearest-neighbour tie), so round-off alone moves its detections, and the
image is reported rather than counted as an export failure. At least one
image must match exactly, so the graph is always checked somewhere.

Without CHECKPOINT the model's random initialisation (seed 0) is saved to
``DIR/random_init.pth`` and every side loads it. Exit status 1 if the graph
disagrees on an image that is not input-sensitive, or no image matched;
the numbers are printed per image and as one ``[mmdeploy] {json}`` line.
"""
import argparse
import json
import os
import os.path as osp
import sys
from typing import Dict, List

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import numpy as np  # noqa: E402

from clustr_mm.engine.cli_args import (  # noqa: E402
    non_negative_float, positive_float, positive_int, work_dir)

DEFAULT_IMAGES = ['data/coco/val2017/000000001001.jpg',
                  'data/coco/val2017/000000001002.jpg']


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('config', help='the mmdet model config')
    p.add_argument('checkpoint', nargs='?', default=None,
                   help='whole-model checkpoint (default: random weights, '
                   'seed 0)')
    p.add_argument('--deploy-cfg', required=True,
                   help='an mmdeploy deploy config (configs/deploy/)')
    p.add_argument('--images', nargs='+', default=DEFAULT_IMAGES)
    p.add_argument('--work-dir', type=work_dir, default='work_dirs/mmdeploy')
    p.add_argument('--box-tol', type=positive_float, default=1e-3)
    p.add_argument('--score-tol', type=positive_float, default=1e-4)
    p.add_argument('--noise', type=non_negative_float, default=1e-5,
                   help='relative input noise of the sensitivity probe run '
                   'on an image whose graph check fails')
    p.add_argument('--noise-draws', type=positive_int, default=4,
                   help='seeded noise draws of that probe')
    args = p.parse_args(argv)
    for path in [args.config, args.deploy_cfg, *args.images] + (
            [args.checkpoint] if args.checkpoint else []):
        if not osp.isfile(path):
            p.error(f'no such file: {path}')
    if args.noise_draws < 0:
        p.error(f'--noise-draws must be >= 0 (0: no probe), got '
                f'{args.noise_draws}')
    for name in ('box_tol', 'score_tol', 'noise'):
        if not getattr(args, name) > 0:
            p.error(f'--{name.replace("_", "-")} must be > 0, got '
                    f'{getattr(args, name)}')
    return args


def _numpy(instances) -> Dict[str, np.ndarray]:
    out = {k: instances[k].detach().cpu().numpy()
           for k in ('bboxes', 'scores', 'labels')}
    if 'masks' in instances:
        out['masks'] = np.asarray(instances.masks.detach().cpu().numpy()
                                  if hasattr(instances.masks, 'detach')
                                  else instances.masks, dtype=bool)
    return out


def compare_detections(ref: Dict[str, np.ndarray], got: Dict[str, np.ndarray],
                       keep_top_k: int, box_tol: float,
                       score_tol: float) -> dict:
    """Match ``got``'s detections to ``ref``'s (see the module docstring);
    returns the counts, the largest differences and ``ok``."""
    floor = -np.inf
    for side in (ref, got):
        if len(side['scores']) >= keep_top_k:
            floor = max(floor, float(side['scores'].min()) + score_tol)
    keep_ref = np.flatnonzero(ref['scores'] > floor)
    keep_got = np.flatnonzero(got['scores'] > floor)
    used = np.zeros(len(got['scores']), bool)
    box_diff, score_diff, unmatched, pairs = 0.0, 0.0, 0, []
    for i in keep_ref[np.argsort(-ref['scores'][keep_ref], kind='stable')]:
        cand = keep_got[~used[keep_got]
                        & (got['labels'][keep_got] == ref['labels'][i])]
        if len(cand):
            boxes = np.abs(got['bboxes'][cand] - ref['bboxes'][i]).max(1)
            scores = np.abs(got['scores'][cand] - ref['scores'][i])
            fits = (boxes <= box_tol) & (scores <= score_tol)
            if fits.any():
                j = cand[fits][np.argmin(boxes[fits])]
                used[j] = True
                pairs.append((i, j))
                box_diff = max(box_diff, float(boxes[cand == j][0]))
                score_diff = max(score_diff, float(scores[cand == j][0]))
                continue
        unmatched += 1
    result = dict(compared=len(keep_ref), compared_onnx=len(keep_got),
                  unmatched=unmatched, max_box_diff=box_diff,
                  max_score_diff=score_diff, score_floor=(
                      None if floor == -np.inf else floor))
    if 'masks' in ref and 'masks' in got and pairs:
        equal = [float((ref['masks'][i] == got['masks'][j]).mean())
                 for i, j in pairs]
        result['mask_pixels_equal_min'] = min(equal)
    result['ok'] = unmatched == 0 and len(keep_ref) == len(keep_got)
    return result


def verdict(graph: dict, torch_self: dict = None) -> str:
    """An image's outcome: ``ok`` (the graph matched), ``input-sensitive``
    (it did not, and neither did PyTorch against itself under input noise)
    or ``different``."""
    if graph['ok']:
        return 'ok'
    if torch_self is not None and not torch_self['ok']:
        return 'input-sensitive'
    return 'different'


def overall_ok(verdicts: List[str]) -> bool:
    """Every image matched or was input-sensitive, and one matched."""
    return ('ok' in verdicts
            and all(v in ('ok', 'input-sensitive') for v in verdicts))


def _as_detections(dets, labels) -> Dict[str, np.ndarray]:
    """The graph's (1, N, 5) ``dets`` and (1, N) ``labels``, as arrays."""
    dets, labels = np.asarray(dets)[0], np.asarray(labels)[0]
    return dict(bboxes=dets[:, :4], scores=dets[:, 4],
                labels=labels.astype(np.int64))


def noise_probe(exported, inputs, data_samples, reference, keep_top_k,
                args) -> dict:
    """PyTorch's exported forward against its own ``reference`` detections
    on ``inputs * (1 + args.noise * N(0, 1))``, seeded draws 0, 1, ... up to
    ``args.noise_draws``: the comparison (with its ``draw``) of the first
    draw that moves a detection, else of the last; None without draws."""
    import torch
    result = None
    for seed in range(args.noise_draws):
        noise = torch.randn(inputs.shape,
                            generator=torch.Generator().manual_seed(seed))
        moved, moved_labels, _ = exported(inputs * (1 + args.noise * noise),
                                          data_samples)
        result = dict(compare_detections(
            reference, _as_detections(moved, moved_labels), keep_top_k,
            args.box_tol, args.score_tol), draw=seed)
        if not result['ok']:
            break
    return result


def rewritten_forward(model, deploy_cfg):
    """``fn(inputs, data_samples)``: ``model``'s forward as mmdeploy exports
    it (its module patches and function rewriters active), run in PyTorch:
    the graph's (dets, labels, masks)."""
    import torch
    from mmdeploy.core import RewriterContext, patch_model
    from mmdeploy.utils import IR, get_backend, get_onnx_config
    backend = get_backend(deploy_cfg).value
    opset = get_onnx_config(deploy_cfg).get('opset_version', 11)
    patched = patch_model(model, cfg=deploy_cfg, backend=backend, ir=IR.ONNX)

    def run(inputs, data_samples):
        with RewriterContext(cfg=deploy_cfg, backend=backend, ir=IR.ONNX,
                             opset=opset), torch.no_grad():
            return patched(inputs, data_samples=data_samples, mode='predict')

    return run


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    try:
        import mmdeploy  # noqa: F401
    except ImportError as err:
        raise SystemExit(
            f'mmdeploy_detection.py needs mmdeploy ({err}); it lives in its '
            'own environment on the torch 2.1 stack: run `bash '
            'tools/deployment/setup_mmdeploy_env.sh` once, then this tool '
            'with .venv-mmdeploy/bin/python (docs/deployment.md)') from None
    from mmdeploy.apis import torch2onnx
    from mmdeploy.apis.utils import build_task_processor
    from mmdeploy.utils import get_input_shape, load_config

    import clustr_mm  # noqa: F401  (registers the backbones)
    deploy_cfg, model_cfg = load_config(args.deploy_cfg, args.config)
    os.makedirs(args.work_dir, exist_ok=True)
    processor = build_task_processor(model_cfg, deploy_cfg, 'cpu')
    checkpoint = args.checkpoint
    if checkpoint is None:
        torch.manual_seed(0)
        checkpoint = osp.join(args.work_dir, 'random_init.pth')
        torch.save({'state_dict': processor.build_pytorch_model().state_dict()},
                   checkpoint)
        print(f'[mmdeploy] no checkpoint: random weights (seed 0) saved to '
              f'{checkpoint}')
    onnx_file = osp.join(args.work_dir, 'end2end.onnx')
    torch2onnx(args.images[0], args.work_dir, 'end2end.onnx', deploy_cfg,
               model_cfg, checkpoint, device='cpu')
    print(f'[mmdeploy] exported {onnx_file}')
    backend = processor.build_backend_model([onnx_file])
    # the graph's raw outputs, from the session mmdeploy's detector runs
    session = backend.wrapper.sess
    model = processor.build_pytorch_model(checkpoint)
    exported = rewritten_forward(processor.build_pytorch_model(checkpoint),
                                 deploy_cfg)
    keep_top_k = deploy_cfg.codebase_config.post_processing.keep_top_k
    input_shape = get_input_shape(deploy_cfg)
    results: List[dict] = []
    for image in args.images:
        data, inputs = processor.create_input(
            image, input_shape, data_preprocessor=model.data_preprocessor)
        inputs = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        dets, labels, _ = exported(inputs, data['data_samples'])
        onnx_dets, onnx_labels = session.run(
            ['dets', 'labels'], {'input': inputs.numpy()})[:2]
        exported_dets = _as_detections(dets, labels)
        graph = compare_detections(
            exported_dets, _as_detections(onnx_dets, onnx_labels),
            keep_top_k, args.box_tol, args.score_tol)
        torch_self = None if graph['ok'] else noise_probe(
            exported, inputs, data['data_samples'], exported_dets,
            keep_top_k, args)
        status = verdict(graph, torch_self)
        raw, _ = processor.create_input(image, input_shape)
        with torch.no_grad():
            got = _numpy(backend.test_step(raw)[0].pred_instances)
            ref = _numpy(model.test_step(raw)[0].pred_instances)
        vs_mmdet = compare_detections(ref, got, keep_top_k, args.box_tol,
                                      args.score_tol)
        results.append(dict(image=image, ok=graph['ok'], verdict=status,
                            graph=graph, torch_vs_noisy_input=torch_self,
                            mmdeploy_vs_mmdet=vs_mmdet))
        sensitivity = '' if torch_self is None else (
            f'; PyTorch against itself with {args.noise:g} relative input '
            f'noise, draw {torch_self["draw"] + 1} of {args.noise_draws}: '
            f'{torch_self["unmatched"]} of {torch_self["compared"]} moved')
        print(f'[mmdeploy] {image}: graph {status} {json.dumps(graph)}'
              f'{sensitivity}; mmdeploy vs mmdet (reported): '
              f'{vs_mmdet["unmatched"]} of {vs_mmdet["compared"]} unmatched')
    ok = overall_ok([r['verdict'] for r in results])
    print('[mmdeploy] ' + json.dumps(dict(ok=ok, onnx=onnx_file,
                                          images=results)))
    if not ok:
        print(f'[mmdeploy] ONNX Runtime and the exported PyTorch forward '
              f'disagree beyond box {args.box_tol} / score {args.score_tol} '
              'on an image where PyTorch is stable, or no image matched '
              '(see above)', file=sys.stderr)
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
