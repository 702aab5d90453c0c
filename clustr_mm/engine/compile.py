"""MMEngine's ``compile`` option with the optimizer step left eager.

``Runner.train`` compiles ``model.train_step`` whole when the config sets
``compile`` (``True`` or a dict of ``torch.compile`` arguments, e.g.
``dict(mode='reduce-overhead', dynamic=False)`` for CUDA graphs on a GPU).
Dynamo then also traces the optimizer wrapper's ``update_params`` (backward,
gradient clipping, the optimizer step), and that fails or costs, measured
with torch 2.14.1 and mmengine 0.10.7:

- with a ``paramwise_cfg`` (every ImageNet config here) MMEngine hands the
  optimizer its param groups as ``ConfigDict``s, and dynamo stops with an
  internal error on them (``'UserDefinedDictVariable' object has no
  attribute 'items'``, in ``_set_capturable``);
- with plain dicts it would compile the step with the learning rate as a
  constant: each scheduler step is a recompilation, until dynamo's limit
  (8) sends the step back to eager anyway.

So the step stays eager, as with ``torch.compile(model)``: the model's
forward and its backward (AOTAutograd's backward graph, which autograd runs
when ``update_params`` calls ``backward``) are what gets compiled, and what
CUDA graphs capture. Importing ``clustr_mm`` installs this (the change
``eager_optimizer_step``, README "What importing clustr_mm changes"); it
acts only on runs whose config sets ``compile``.
"""
import functools

import torch
from mmengine.optim import OptimWrapperDict
from mmengine.runner import Runner

_FLAG = '_clustr_mm_eager_step'


def compile_wanted(cfg) -> bool:
    """Whether MMEngine's Runner compiles with ``cfg`` (its own rule: a
    ``compile`` key that is neither missing, None nor False; ``dict()``
    compiles with torch's defaults)."""
    value = cfg.get('compile', None)
    return value is not None and value is not False


def eager_optimizer_steps(optim_wrapper) -> None:
    """Make dynamo run each wrapper's ``update_params`` eagerly (a graph
    break at the call, nothing inside it traced); idempotent."""
    wrappers = (list(optim_wrapper.values())
                if isinstance(optim_wrapper, OptimWrapperDict)
                else [optim_wrapper])
    for wrapper in wrappers:
        if getattr(wrapper.update_params, _FLAG, False):
            continue
        eager = torch.compiler.disable(wrapper.update_params, recursive=True)
        setattr(eager, _FLAG, True)
        wrapper.update_params = eager


def keep_optimizer_steps_eager() -> None:
    """Wrap ``Runner._maybe_compile`` (called by ``Runner.train`` once the
    optimizer wrapper is built, just before it compiles ``train_step``) so
    that a compiled run leaves its optimizer step eager; idempotent."""
    original = getattr(Runner, '_maybe_compile', None)
    if original is None or getattr(original, _FLAG, False):
        return

    @functools.wraps(original)
    def _maybe_compile(self, target):
        if target == 'train_step' and compile_wanted(self.cfg):
            eager_optimizer_steps(self.optim_wrapper)
        return original(self, target)

    setattr(_maybe_compile, _FLAG, True)
    Runner._maybe_compile = _maybe_compile
