"""``import clustr_mm`` changes MMEngine and torch process-wide (README, "What
importing clustr_mm changes"); ``CLUSTR_MM_SKIP`` leaves each change out."""
import json
import os
import subprocess
import sys

import pytest

from clustr_mm.registry import PROCESS_WIDE_CHANGES, change_wanted

pytestmark = pytest.mark.torch21

# What each change touches, read before and after `import clustr_mm`.
PROBE = r'''
import json, sys, torch
from mmengine.fileio import io as mm_io
from mmengine.registry import Registry
from mmengine.runner import Runner
from mmengine.runner.checkpoint import CheckpointLoader
ser = torch.serialization

def wrappers():
    fn, flags = Registry.import_from_location, set()
    while fn is not None:
        flags |= {k for k in ('_clustr_mm_checked', '_clustr_mm_heads')
                  if getattr(fn, k, False)}
        fn = getattr(fn, '__wrapped__', None)
    return flags

def state():
    return dict(
        checkpoint_loaders=[sorted((k, v.__module__) for k, v in
                                   CheckpointLoader._schemes.items()),
                            len(ser.get_safe_globals())
                            if hasattr(ser, 'get_safe_globals') else None],
        atomic_writes=mm_io.backends['local'].__name__,
        scope_check='_clustr_mm_checked' in wrappers(),
        lazy_heads='_clustr_mm_heads' in wrappers(),
        eager_optimizer_step=getattr(Runner._maybe_compile,
                                     '_clustr_mm_eager_step', False))

before = state()
import clustr_mm
from mmengine.registry import MODELS
model = MODELS.build(dict(type='ClusTR', arch='tiny'))  # the backbones work
after = state()
print('RESULT ' + json.dumps(
    {k: after[k] != before[k] for k in before}))
'''


def changed(skip):
    env = dict(os.environ)
    env.pop('CLUSTR_MM_SKIP', None)
    if skip is not None:
        env['CLUSTR_MM_SKIP'] = skip
    proc = subprocess.run([sys.executable, '-c', PROBE], env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=300)
    lines = [ln for ln in proc.stdout.splitlines()
             if ln.startswith('RESULT ')]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:]
    return json.loads(lines[-1][len('RESULT '):])


@pytest.mark.slow
def test_every_change_is_made_by_default_and_each_can_be_skipped():
    assert changed(None) == dict.fromkeys(PROCESS_WIDE_CHANGES, True)
    assert changed('all') == dict.fromkeys(PROCESS_WIDE_CHANGES, False)
    assert changed('atomic_writes, scope_check') == dict(
        checkpoint_loaders=True, atomic_writes=False, scope_check=False,
        lazy_heads=True, eager_optimizer_step=True)


def test_skip_variable_is_checked(monkeypatch):
    monkeypatch.setenv('CLUSTR_MM_SKIP', 'atomic_writes,loaders')
    with pytest.raises(ValueError, match=r"CLUSTR_MM_SKIP='atomic_writes,"
                       r"loaders' names \['loaders'\]; expected"):
        change_wanted('atomic_writes')
    monkeypatch.setenv('CLUSTR_MM_SKIP', 'all')
    assert not any(change_wanted(c) for c in PROCESS_WIDE_CHANGES)
    monkeypatch.delenv('CLUSTR_MM_SKIP')
    assert all(change_wanted(c) for c in PROCESS_WIDE_CHANGES)
    with pytest.raises(ValueError, match='unknown change'):
        change_wanted('everything')
