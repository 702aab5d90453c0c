"""The export and its check in ONNX Runtime, as functions: what
``pytorch2onnx.py`` (the command line) and ``tools/analysis/
onnxruntime_speed.py`` share. ``TensorPath`` is what a model exports (see
``pytorch2onnx.py``'s docstring), ``export`` writes the graph,
``ort_session`` and ``compare`` run it against PyTorch.
"""
import inspect
import os.path as osp
import sys
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from mmengine.config import Config  # noqa: E402
from torch import nn  # noqa: E402

import clustr_mm  # noqa: E402,F401  (registers the backbones)
from clustr_mm.engine.launch import SCOPES, build_in_scope  # noqa: E402
from clustr_mm.protocols import graph_static_hw  # noqa: E402

EXPORTERS = ('torchscript', 'dynamo')


class ExportError(RuntimeError):
    """The export or its check failed; the message says what and where."""


# --------------------------------------------------------------------------
# What is exported


def build_model(cfg: Config) -> Tuple[nn.Module, Optional[str]]:
    """(model, its library's scope or None for a bare backbone config)."""
    from mmengine.registry import MODELS
    if not isinstance(cfg.get('model'), dict):
        raise ExportError(f'{cfg.filename}: the config has no model = dict('
                          '...); give a config of a model or a backbone')
    scope = cfg.get('default_scope')
    if scope is None:
        return MODELS.build(cfg.model), None
    if scope not in SCOPES:
        raise ExportError(f'default_scope must be one of {SCOPES} or unset, '
                          f'got {scope!r}')
    return build_in_scope(cfg.model, scope), scope


def load_weights(module: nn.Module, checkpoint: str, backbone: bool) -> None:
    """Load ``checkpoint`` strictly into ``module`` (for a backbone, the
    ``backbone.`` keys of a whole-model file, else the file's keys)."""
    from clustr_mm.checkpoints import compare_state_dicts, read_checkpoint
    state = read_checkpoint(checkpoint)
    if backbone and any(k.startswith('backbone.') for k in state):
        state = {k[len('backbone.'):]: v for k, v in state.items()
                 if k.startswith('backbone.')}
    # checked here: load_state_dict raises one raw 'size mismatch' line per
    # tensor even with strict=False (another model family: dozens)
    report = compare_state_dicts(state, module.state_dict())
    missing, unexpected = report['missing'], report['unexpected']
    resized = report['shape_mismatch']  # 'key: (file) vs (model)'
    if missing or unexpected or resized:
        raise ExportError(
            f'{checkpoint} does not fit the exported '
            f'{"backbone" if backbone else "model"}: {len(missing)} weights '
            f'missing (e.g. {missing[:3]}), {len(unexpected)} unexpected '
            f'(e.g. {unexpected[:3]}), {len(resized)} of another shape (e.g. '
            f'{resized[:3]}): is it the weights of this config?')
    module.load_state_dict(state)


def _flatten(out) -> List[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flatten(o)]
    raise ExportError(f'the exported path returned a {type(out).__name__}; '
                      'only tensors and (nested) tuples of tensors export')


class TensorPath(nn.Module):
    """The exported function: normalised images -> a flat tuple of tensors.

    Args:
        model: The built model (or bare backbone).
        scope: Its library (None: a bare backbone).
        part: 'model' or 'backbone'.
    """

    def __init__(self, model: nn.Module, scope: Optional[str], part: str):
        super().__init__()
        if part == 'backbone' and scope is not None:
            if not isinstance(getattr(model, 'backbone', None), nn.Module):
                raise ExportError(f'--part backbone: the {scope} model '
                                  f'{type(model).__name__} has no backbone')
            model, scope = model.backbone, None
        self.model, self.scope = model, scope
        self.two_stage = (scope == 'mmdet' and
                          getattr(model, 'with_rpn', False))
        self.names = None  # set by describe()

    def describe(self) -> str:
        m = self.model
        if self.scope is None:
            return f'backbone {type(m).__name__}: feature maps'
        if self.scope == 'mmpretrain':
            return f'{type(m).__name__}: logits (no softmax)'
        if self.scope == 'mmseg':
            return (f'{type(m).__name__}: whole-image logits (decode head '
                    'resized to the input)')
        if self.two_stage:
            return (f'{type(m).__name__}: neck features + RPN head maps (no '
                    'box decoding, NMS or RoI heads)')
        if self.scope == 'mmdet':
            return (f'{type(m).__name__}: dense head maps (no box decoding '
                    'or NMS)')
        return f'{type(m).__name__}: head output'

    def output_names(self, count: int) -> List[str]:
        if self.scope is None:
            return [f'feat{i}' for i in range(count)]
        if self.scope == 'mmpretrain' and count == 1:
            return ['logits']
        if self.scope == 'mmseg' and count == 1:
            return ['seg_logits']
        return [f'output{i}' for i in range(count)]

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        m = self.model
        if self.scope is None:
            out = m(x)
        elif self.scope == 'mmseg':
            logits = m.decode_head(m.extract_feat(x))
            # mmseg's whole-image inference: resize to the input
            out = F.interpolate(logits, size=x.shape[2:], mode='bilinear',
                                align_corners=m.decode_head.align_corners)
        elif self.two_stage:
            feats = m.extract_feat(x)
            out = (feats, m.rpn_head(feats))
        else:
            out = m(x, None, mode='tensor')
        return tuple(_flatten(out))


# --------------------------------------------------------------------------
# Export


def static_hw_reason(module: nn.Module) -> Optional[str]:
    """Why a graph of ``module`` is right only at its export height and
    width (None: it is not). Layers say so with a true ``graph_static_hw``
    (:mod:`clustr_mm.protocols`; ClusTR's DPC-kNN clustering: its windows
    and cluster counts are fixed when traced)."""
    names = sorted({type(m).__name__ for m in module.modules()
                    if graph_static_hw(m)})
    if not names:
        return None
    return (f'{", ".join(names)} fixes the clustering windows and cluster '
            'counts at the export size')


def _has_dynamo_argument() -> bool:
    return 'dynamo' in inspect.signature(torch.onnx.export).parameters


def export(path_module: TensorPath, example: torch.Tensor, out: str,
           exporter: str = 'torchscript', opset: int = 17,
           dynamic: bool = False, dynamic_hw: bool = True) -> List[str]:
    """Write the ONNX file ``out``; returns the output names. ``dynamic``:
    the batch, and with ``dynamic_hw`` height and width, are graph inputs
    (otherwise fixed dims of the input, which ONNX Runtime enforces)."""
    with torch.no_grad():
        count = len(path_module(example))
    names = path_module.output_names(count)
    kwargs = dict(opset_version=opset, input_names=['input'],
                  output_names=names, do_constant_folding=True)
    if exporter == 'torchscript':
        if _has_dynamo_argument():
            kwargs['dynamo'] = False
        if dynamic:
            axes = {'input': {0: 'batch', 2: 'height', 3: 'width'}
                    if dynamic_hw else {0: 'batch'}}
            axes.update({n: {0: 'batch'} for n in names})
            kwargs['dynamic_axes'] = axes
    elif exporter == 'dynamo':
        if not _has_dynamo_argument():
            raise ExportError(
                f'--exporter dynamo: torch {torch.__version__} has no '
                'torch.onnx.export(dynamo=...) (torch >= 2.5); use '
                '--exporter torchscript')
        kwargs['dynamo'] = True
        kwargs['external_data'] = False
        if dynamic:
            # Dim.DYNAMIC (torch >= 2.6) lets an example size of 1 stay
            # symbolic; a named Dim would be specialised to it
            dim = getattr(torch.export.Dim, 'DYNAMIC', None)
            if dim is None:
                dims = [torch.export.Dim(n) for n in ('batch', 'height',
                                                      'width')]
            else:
                dims = [dim] * 3
            kwargs['dynamic_shapes'] = (
                {0: dims[0], 2: dims[1], 3: dims[2]} if dynamic_hw else
                {0: dims[0]}, )
    else:
        raise ExportError(f'exporter must be one of {EXPORTERS}, got '
                          f'{exporter!r}')
    with warnings.catch_warnings(), torch.no_grad():
        # the TorchScript exporter is deprecated upstream (still the one
        # that mmdeploy and most deployment stacks drive)
        warnings.simplefilter('ignore', DeprecationWarning)
        warnings.simplefilter('ignore', torch.jit.TracerWarning)
        try:
            torch.onnx.export(path_module, (example, ), out, **kwargs)
        except ExportError:
            raise
        except Exception as err:  # the exporters raise many types
            raise ExportError(
                f'the {exporter} exporter failed: {type(err).__name__}: '
                f'{str(err)[:2000]}') from err
    return names


# --------------------------------------------------------------------------
# Check in ONNX Runtime


def ort_session(path: str, threads: Optional[int] = None):
    """A CPU ONNX Runtime session of ``path``: ``threads`` intra-op
    threads (default torch's), one inter-op thread, operators run one after
    another."""
    try:
        import onnxruntime as ort
    except ImportError as err:
        raise ExportError('onnxruntime is not installed: pip install -r '
                          'requirements/onnx.txt (or .[onnx])') from err
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(path, options,
                                providers=['CPUExecutionProvider'])


def random_input(shape: Sequence[int], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen)


def compare(path_module: TensorPath, session, names: Sequence[str],
            shape: Sequence[int], seed: int = 0) -> List[Dict]:
    """Per output: the largest |ONNX - PyTorch| and |PyTorch| at ``shape``
    (B, 3, H, W). Raises ExportError when ONNX Runtime refuses the input or
    an output's shape differs."""
    x = random_input(shape, seed)
    with torch.no_grad():
        expected = path_module(x)
    try:
        got = session.run(None, {'input': x.numpy()})
    except Exception as err:  # onnxruntime's own exception types
        raise ExportError(
            f'ONNX Runtime refused input {tuple(shape)}: '
            f'{type(err).__name__}: {str(err)[:1000]}') from err
    rows = []
    for name, ref, val in zip(names, expected, got):
        val = torch.from_numpy(val)
        if tuple(val.shape) != tuple(ref.shape):
            raise ExportError(
                f'input {tuple(shape)}: output {name} has shape '
                f'{tuple(val.shape)} in ONNX Runtime, {tuple(ref.shape)} in '
                'PyTorch')
        ref = ref.float()
        diff = (val.float() - ref).abs()
        rows.append(dict(output=name, shape=list(ref.shape),
                         max_abs_diff=float(diff.max()) if diff.numel()
                         else 0.0,
                         max_abs_ref=float(ref.abs().max()) if ref.numel()
                         else 0.0))
    return rows


