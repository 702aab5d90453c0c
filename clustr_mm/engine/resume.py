"""Pick the checkpoint ``--resume`` continues from, and what it must restore
before the runner is built.

MMEngine restores the seed recorded in a checkpoint only after the data
loaders exist, so with ``randomness.seed=None`` (the configs' default) the
resumed run's sampler draws a new seed and shuffles differently from the
uninterrupted run. The seed is therefore read here and put into the config
before the runner (and its samplers) is built.
"""
import os
import os.path as osp
import re
import zipfile
from typing import List, Optional, Tuple

from clustr_mm.checkpoints.safe_pickle import safe_load


def checkpoints_newest_first(work_dir: str) -> List[str]:
    """``epoch_N.pth``/``iter_N.pth`` in ``work_dir``, newest first; the one
    the ``last_checkpoint`` pointer names goes first (a run killed between a
    checkpoint and the pointer leaves a newer file: writes are atomic)."""
    found = sorted(
        ((int(m.group(2)), m.group(1) == 'iter', name)
         for name in (os.listdir(work_dir) if osp.isdir(work_dir) else [])
         for m in [re.fullmatch(r'(epoch|iter)_(\d+)\.pth', name)] if m),
        reverse=True)
    paths = [osp.join(work_dir, name) for *_, name in found]
    pointer = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(pointer):
        with open(pointer) as f:
            named = f.read().strip()
        if osp.isfile(named) and not any(osp.samefile(named, p)
                                         for p in paths):
            paths.insert(0, named)
    return paths


def read_resume_meta(path: str) -> dict:
    """The ``meta`` of a runner checkpoint; a clear error naming ``path``
    when it cannot be read or was not written by a training run."""
    if osp.isdir(path) or not zipfile.is_zipfile(path):
        raise ValueError(f'{path} cannot be read as a checkpoint: not a '
                         'torch.save archive (truncated, or another format)')
    try:
        checkpoint = safe_load(path, map_location='cpu')
    except Exception as err:  # torch/pickle/zip raise many types here
        reason = str(err).strip().splitlines()[0][:200]
        raise ValueError(f'{path} cannot be read as a checkpoint '
                         f'({type(err).__name__}: {reason})') from err
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    if not isinstance(meta, dict) or 'iter' not in meta:
        raise ValueError(
            f'{path} is not a checkpoint of a training run (no meta.iter): '
            'resume needs a file saved by tools/train.py; to start from '
            'its weights use --cfg-options load_from=PATH instead')
    return meta


def choose_resume_checkpoint(work_dir: str, log=print
                             ) -> Tuple[Optional[str], Optional[dict]]:
    """(path, meta) of the newest readable checkpoint in ``work_dir``;
    unreadable newer ones are skipped with a warning naming them."""
    candidates = checkpoints_newest_first(work_dir)
    for path in candidates:
        try:
            return path, read_resume_meta(path)
        except ValueError as err:
            log(f'[train] WARNING --resume: skipping {err}; trying the '
                'previous checkpoint')
    if candidates:
        raise ValueError(
            f'--resume: none of the checkpoints in {work_dir} can be read '
            f'({", ".join(map(osp.basename, candidates))}); pass one with '
            '--resume PATH or start without --resume')
    return None, None


def explain_unreadable(path: str, err: ValueError) -> ValueError:
    """The error for an explicit ``--resume PATH`` that cannot be used,
    listing the other checkpoints next to it."""
    others = [p for p in checkpoints_newest_first(osp.dirname(path) or '.')
              if not osp.samefile(p, path)]
    names = ', '.join(map(osp.basename, others))
    hint = f'; other checkpoints there: {names}' if others else ''
    return ValueError(f'--resume: {err}. Pick another with --resume PATH'
                      f'{hint}')


def checkpoint_in_folder(folder: str, log=print
                         ) -> Tuple[str, dict]:
    """(path, meta) for ``--resume FOLDER``: its latest checkpoint as
    ``--resume`` alone picks one in the work dir
    (:func:`choose_resume_checkpoint`: the newest readable ``epoch_N.pth``
    / ``iter_N.pth``, or the file MMEngine's ``last_checkpoint`` names),
    else the newest other ``*.pth``. A
    ValueError naming the folder when it holds none, or when the choice is
    ambiguous (``epoch_N`` and ``iter_N`` files without a pointer; other
    ``*.pth`` files written in the same second)."""
    has_pointer = osp.isfile(osp.join(folder, 'last_checkpoint'))
    named = [p for p in checkpoints_newest_first(folder)]
    kinds = {m.group(1) for p in named
             for m in [re.fullmatch(r'(epoch|iter)_\d+\.pth',
                                    osp.basename(p))] if m}
    if len(kinds) == 2 and not has_pointer:
        raise ValueError(
            f'--resume {folder}: the folder holds both epoch_N.pth and '
            'iter_N.pth checkpoints and no last_checkpoint file, so which is '
            'the latest cannot be told; pass one with --resume PATH ('
            f'{", ".join(map(osp.basename, named[:4]))}'
            f'{", ..." if len(named) > 4 else ""})')
    if named:
        path, meta = choose_resume_checkpoint(folder, log)
        return path, meta
    others = sorted(
        (osp.getmtime(osp.join(folder, name)), name)
        for name in os.listdir(folder) if name.endswith('.pth')
        and osp.isfile(osp.join(folder, name)))
    if not others:
        raise ValueError(
            f'--resume {folder}: the folder holds no checkpoint (no '
            'last_checkpoint file, epoch_N.pth, iter_N.pth or other .pth '
            'file); pass the checkpoint file with --resume PATH')
    if len(others) > 1 and int(others[-1][0]) == int(others[-2][0]):
        raise ValueError(
            f'--resume {folder}: {others[-1][1]} and {others[-2][1]} are '
            'equally new and there is no last_checkpoint file; pass one '
            'with --resume PATH')
    path = osp.join(folder, others[-1][1])
    if len(others) > 1:
        log(f'[train] --resume {folder}: taking the newest .pth file, '
            f'{others[-1][1]} (others: '
            f'{", ".join(name for _, name in others[-2::-1])})')
    try:
        return path, read_resume_meta(path)
    except ValueError as err:
        raise explain_unreadable(path, err) from None
