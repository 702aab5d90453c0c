"""Test-only hook that leaks ``LEAK_MIB`` MiB of host memory per iteration.

It shows that ``tools/analysis/memory_soak.py`` sees a leak of that size.
Imported by ``tests/configs/clustr-t_embedded-imagenet_leaking.py`` through
``custom_imports`` (the tests put ``tests/configs`` on ``PYTHONPATH``).
"""
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

LEAK_MIB = 2


@HOOKS.register_module(force=True)
class LeakHook(Hook):

    def __init__(self):
        self.kept = []

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        # ones(), not empty(): untouched pages would not count in the RSS.
        self.kept.append(torch.ones(LEAK_MIB * 1024 * 1024 // 4))
