"""Loading pretrained backbone weights, tolerant of a changed cluster count.

Fine-tuning PaCa-ViT for segmentation uses 200 clusters per stage where the
ImageNet checkpoint has 100, so the layers that emit cluster logits change
shape. Those layers are re-initialised and named in a warning; everything else
must load, and a checkpoint that fills nothing is an error (the official code
silently trained from scratch on a wrong path or prefix).
"""
import os
import pickle
import re
import warnings
from typing import Callable, Dict, Optional

import torch
from torch import nn

from .keys import StateDict, strip_module_prefix, unwrap_state_dict
from .safe_pickle import download_checkpoint, safe_load


def read_checkpoint(filename: str, map_location: str = 'cpu') -> StateDict:
    """Read a weights file (local path or URL) without unpickling objects.

    Loads through :func:`clustr_mm.checkpoints.safe_pickle.safe_load`: torch's
    weights-only loader where it can take our allow-list, a restricted
    unpickler on older torch; either way only tensors, containers and the
    data-only types of MMEngine runner checkpoints are rebuilt.
    Accepts a raw state dict or one wrapped under ``state_dict`` or
    ``model`` and strips a DataParallel ``module.`` prefix.
    """
    if filename.startswith(('http://', 'https://')):
        filename = download_checkpoint(filename)
    elif not os.path.isfile(filename):
        raise FileNotFoundError(f'checkpoint file not found: {filename}')
    try:
        ckpt = safe_load(filename, map_location=map_location)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError,
            ValueError) as e:
        unsafe = re.search(r'(?:Unsupported global: |unsupported )GLOBAL (\S+)',
                           str(e))
        if unsafe:
            raise pickle.UnpicklingError(
                f'refusing to load {filename}: it pickles {unsafe.group(1)}, '
                'which could run code on load. Only tensors and plain data '
                'are loaded; re-save the weights alone if you trust the file.'
            ) from None
        raise ValueError(
            f'cannot read checkpoint {filename}: truncated, corrupt or not a '
            f'torch checkpoint ({type(e).__name__}: {e})') from e
    if not isinstance(ckpt, dict):
        raise TypeError(f'{filename} holds a {type(ckpt).__name__}, '
                        'expected a state dict')
    return strip_module_prefix(unwrap_state_dict(ckpt))


def _default_reinit(module: nn.Module) -> None:
    module.reset_parameters()


def load_backbone_state(model: nn.Module,
                        state_dict: StateDict,
                        prefix: Optional[str] = None,
                        reinit: Optional[Callable[[nn.Module], None]] = None
                        ) -> Dict[str, list]:
    """Load ``state_dict`` into ``model``, re-initialising shape mismatches.

    Args:
        model: The module to fill.
        state_dict: Weights, e.g. from :func:`read_checkpoint`.
        prefix: Only keys starting with it are used, with it removed (e.g.
            ``'backbone.'`` for a whole detector / classifier checkpoint).
        reinit: Called on every module owning a shape-mismatched tensor
            (e.g. a clustering layer with a different number of clusters);
            defaults to the module's ``reset_parameters()``.

    Returns:
        dict with the ``loaded``, ``reinitialized``, ``missing`` and
        ``unexpected`` key lists. Everything but ``loaded`` is also reported
        in one ``UserWarning``.

    Raises:
        RuntimeError: if no key of the checkpoint fits the model.
    """
    if prefix:
        selected = {k[len(prefix):]: v for k, v in state_dict.items()
                    if k.startswith(prefix)}
        if not selected:
            raise RuntimeError(
                f'no checkpoint key starts with prefix {prefix!r}; first '
                f'keys: {list(state_dict)[:5]}')
        state_dict = selected
    own = model.state_dict()
    loadable, mismatched = {}, {}
    for key, value in state_dict.items():
        if key not in own:
            continue
        if own[key].shape == value.shape:
            loadable[key] = value
        else:
            mismatched[key] = (tuple(value.shape), tuple(own[key].shape))
    if not loadable:
        raise RuntimeError(
            f'none of the {len(state_dict)} checkpoint keys match '
            f'{type(model).__name__} (wrong checkpoint or prefix?); '
            f'checkpoint keys start {list(state_dict)[:5]}, model keys start '
            f'{list(own)[:5]}')

    reinit = reinit or _default_reinit
    owners = sorted({key.rsplit('.', 1)[0] for key in mismatched})
    for name in owners:
        reinit(model.get_submodule(name))
    model.load_state_dict(loadable, strict=False)

    report = dict(
        loaded=sorted(loadable),
        reinitialized=owners,
        missing=sorted(set(own) - set(loadable) - set(mismatched)),
        unexpected=sorted(set(state_dict) - set(own)))
    lines = []
    if mismatched:
        lines.append('re-initialised (shape differs from the checkpoint): ' +
                     ', '.join(f'{k} {ckpt}->{ours}'
                               for k, (ckpt, ours) in mismatched.items()))
    if report['missing']:
        lines.append('missing in checkpoint: ' + ', '.join(report['missing']))
    if report['unexpected']:
        lines.append('unused checkpoint keys: ' +
                     ', '.join(report['unexpected']))
    if lines:
        warnings.warn(
            f'{type(model).__name__}: loaded {len(loadable)} of {len(own)} '
            'tensors; ' + '; '.join(lines), UserWarning, stacklevel=2)
    return report


def init_backbone_weights(backbone, official_init: Callable[[nn.Module], None]
                          ) -> None:
    """Official from-scratch init, other ``init_cfg`` entries, then weights.

    Replaces MMEngine's ``Pretrained`` handling for our backbones: a
    ``Pretrained`` entry is read with the weights-only loader and applied last
    through :func:`load_backbone_state`, so loaded weights are never
    overwritten, shape-mismatched layers are re-initialised with
    ``official_init`` and named in a warning, and a path or prefix that fills
    nothing is an error instead of a silent from-scratch run.
    """
    from mmengine.model import initialize
    from mmengine.model.weight_init import update_init_info
    if backbone.is_init:
        return
    backbone.apply(official_init)
    cfgs = backbone.init_cfg or []
    cfgs = [cfgs] if isinstance(cfgs, dict) else list(cfgs)
    others = [c for c in cfgs if c.get('type') != 'Pretrained']
    if others:
        initialize(backbone, others)
    for cfg in cfgs:
        if cfg.get('type') == 'Pretrained':
            state = read_checkpoint(cfg['checkpoint'],
                                    cfg.get('map_location', 'cpu'))
            load_backbone_state(backbone, state, prefix=cfg.get('prefix'),
                                reinit=lambda m: m.apply(official_init))
    if hasattr(backbone, '_params_init_info'):  # set by a parent model
        update_init_info(backbone, f'{type(backbone).__name__} official init '
                         f'+ init_cfg {cfgs}')
    backbone._is_init = True
