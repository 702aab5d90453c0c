"""Test-only hook: every rank appends its losses to ``rank{r}_losses.jsonl``.

MMEngine logs rank 0's loss only; comparing a DDP run with a single-process
run needs every rank's share of the global batch. Imported by
``tests/configs/clustr-t_embedded-imagenet_fixed-crop.py`` through
``custom_imports`` (the tests put ``tests/configs`` on ``PYTHONPATH``).
"""
import json
import os.path as osp

from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module(force=True)
class RankLossHook(Hook):

    priority = 'LOW'

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        record = dict(iter=runner.iter + 1, rank=get_rank(),
                      batch=len(data_batch['inputs']),
                      loss=float(outputs['loss']))
        path = osp.join(runner.work_dir, f'rank{get_rank()}_losses.jsonl')
        with open(path, 'a') as f:
            f.write(json.dumps(record) + '\n')
