"""Train a config for N iterations and fail at the first non-finite number.

    python tools/analysis/nan_check.py CONFIG [--iters 100] [--work-dir DIR]
        [--amp bf16|fp16] [--cfg-options k=v ...]

The run uses the config's own model, data pipeline, optimizer wrapper and
schedulers (see ``clustr_mm/engine/short_run.py``; epoch-based configs get
enough epochs, validation and checkpoints are off). Every iteration checks

* the total loss before backward,
* every parameter gradient before the optimizer step,
* every parameter after the step,
* every logged loss component (keys containing 'loss'),

and stops at the first NaN/Inf with a message naming the (1-based)
iteration and what was not finite. Prints one ``[nan-check] {json}`` line
(with the device, torch, and the driver, CUDA and Triton versions);
exits 0 when all iterations were finite, 1 otherwise.

Gradients are not checked under ``AmpOptimWrapper`` (fp16 loss scaling makes
infinite scaled gradients a normal, skipped step); losses and weights still
are.

``--amp`` trains under autocast as ``tools/train.py --amp`` does: on a GPU
through MMEngine's ``AmpOptimWrapper`` (``dtype`` bfloat16 or float16,
dynamic loss scaling), on the CPU (bf16 only: ``AmpOptimWrapper`` refuses a
machine without an accelerator) through ``CPUAmpOptimWrapper``
(``clustr_mm/engine/amp.py``). The summary
gives the dtype the first ``nn.Linear`` produced during training
(``linear_dtype``), which shows the autocast was in force.
"""
import argparse
import json
import os.path as osp
import sys
import time

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))  # provenance.py

import torch  # noqa: E402
from mmengine.hooks import Hook  # noqa: E402
from mmengine.optim import AmpOptimWrapper, OptimWrapperDict  # noqa: E402

import clustr_mm  # noqa: E402,F401
from clustr_mm.engine.cli_args import positive_int  # noqa: E402
from clustr_mm.engine.amp import use_amp  # noqa: E402
from clustr_mm.engine.launch import add_common_args, load_config  # noqa: E402
from clustr_mm.engine.short_run import run_short  # noqa: E402
from provenance import software  # noqa: E402


class NonFiniteError(FloatingPointError):
    """A loss, gradient or weight was NaN/Inf; ``iteration`` is 1-based."""

    def __init__(self, iteration: int, what: str):
        super().__init__(f'iteration {iteration}: {what}')
        self.iteration = iteration


def _bad(named, limit=5):
    names = [n for n, t in named if not torch.isfinite(t).all()]
    if not names:
        return None
    more = f' (+{len(names) - limit} more)' if len(names) > limit else ''
    return ', '.join(names[:limit]) + more


class FiniteCheckHook(Hook):
    """Check loss, gradients and weights of every training iteration."""

    priority = 'VERY_HIGH'

    def __init__(self):
        self.checked = 0
        self.last_loss = None
        self.linear_dtype = None

    def before_train(self, runner) -> None:
        self.runner = runner
        model = runner.model
        self.names = {id(p): n for n, p in model.named_parameters()}
        wrapper = runner.optim_wrapper
        wrappers = (list(wrapper.values())
                    if isinstance(wrapper, OptimWrapperDict) else [wrapper])
        for w in wrappers:
            self._wrap(w)
        linear = next((m for m in model.modules()
                       if isinstance(m, torch.nn.Linear)), None)
        if linear is not None:
            linear.register_forward_hook(self._record_dtype)

    def _record_dtype(self, module, args, out) -> None:
        if module.training and self.linear_dtype is None:
            self.linear_dtype = str(out.dtype)

    def _iteration(self) -> int:
        return self.runner.iter + 1

    def _params(self, wrapper):
        return [(self.names.get(id(p), '?'), p)
                for group in wrapper.optimizer.param_groups
                for p in group['params']]

    def _wrap(self, wrapper) -> None:
        backward, step = wrapper.backward, wrapper.step
        check_grads = not isinstance(wrapper, AmpOptimWrapper)

        def checked_backward(loss, **kwargs):
            if not torch.isfinite(loss).all():
                raise NonFiniteError(self._iteration(),
                                     f'loss is {loss.detach().tolist()}')
            self.last_loss = float(loss.detach())
            return backward(loss, **kwargs)

        def checked_step(**kwargs):
            params = self._params(wrapper)
            if check_grads:
                bad = _bad((n, p.grad) for n, p in params
                           if p.grad is not None)
                if bad:
                    raise NonFiniteError(self._iteration(),
                                         f'non-finite gradient of {bad}')
            out = step(**kwargs)
            bad = _bad((n, p.detach()) for n, p in params)
            if bad:
                raise NonFiniteError(self._iteration(),
                                     f'non-finite weights after the step: {bad}')
            return out

        wrapper.backward, wrapper.step = checked_backward, checked_step

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        bad = _bad((k, v) for k, v in (outputs or {}).items()
                   if 'loss' in k and isinstance(v, torch.Tensor))
        if bad:
            raise NonFiniteError(self._iteration(), f'non-finite {bad}')
        self.checked = runner.iter + 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument('--iters', type=positive_int, default=100,
                        help='training iterations to check (default 100)')
    parser.add_argument('--amp', choices=('bf16', 'fp16'),
                        help='train under autocast (fp16: GPU only)')
    args = parser.parse_args(argv)
    cfg = load_config(args)
    if args.amp == 'fp16' and not torch.cuda.is_available():
        raise SystemExit('--amp fp16 needs a GPU (MMEngine\'s AmpOptimWrapper '
                         'with loss scaling); on the CPU use --amp bf16')
    if args.amp:
        try:
            use_amp(cfg, 'bfloat16' if args.amp == 'bf16' else 'float16')
        except ValueError as err:
            raise SystemExit(str(err))
    hook = FiniteCheckHook()
    # what applies, not only what was asked: the device, and the optimizer
    # wrapper (mixed precision) that --amp resolved to there
    cuda = torch.cuda.is_available()
    summary = dict(config=args.config, iters=args.iters, amp=args.amp,
                   device=torch.cuda.get_device_name() if cuda else 'cpu',
                   torch=torch.__version__,
                   **software('cuda' if cuda else 'cpu'),
                   optim_wrapper=cfg.optim_wrapper.get('type',
                                                       'OptimWrapper'),
                   amp_dtype=cfg.optim_wrapper.get('dtype'))
    start = time.time()
    try:
        run_short(cfg, args.iters, [hook], work_dir=args.work_dir)
        ok = hook.checked >= args.iters
        if not ok:
            summary['error'] = f'only {hook.checked} iterations ran'
    except (FloatingPointError, RuntimeError) as err:
        # ours, or the backbones' device-side finiteness checks
        # (graph_safety.assert_finite raises RuntimeError)
        if not isinstance(err, FloatingPointError) and not any(
                key in str(err)
                for key in ('non-finite', 'NaN or Inf', 'NaN/Inf')):
            raise
        ok = False
        if isinstance(err, NonFiniteError):
            summary.update(error=str(err), iteration=err.iteration)
        else:
            iteration = hook.runner.iter + 1
            summary.update(error=f'iteration {iteration}: {err}',
                           iteration=iteration)
    summary.update(ok=ok, checked=hook.checked, last_loss=hook.last_loss,
                   linear_dtype=hook.linear_dtype,
                   seconds=round(time.time() - start, 1))
    print('[nan-check] ' + json.dumps(summary), flush=True)
    if not ok:
        print(f'[nan-check] FAILED: {args.config}: '
              f'{summary.get("error")}', flush=True)
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
