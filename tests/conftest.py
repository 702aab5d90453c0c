"""Shared fixtures: the repo root, the tiny data, and running the real tools.

A test that starts a tool (:func:`run_tool`) or any other process must be
marked ``@pytest.mark.slow`` (markers: pytest.ini), so that
``pytest -m "not slow"`` stays the fast loop: :func:`run_tool` refuses to run
in an unmarked test, and an unmarked test that starts a process fails.
A test marked ``cuda`` (the GPU tier) is skipped, with the reason, where
torch sees no CUDA device.

Under pytest-xdist (``tools/run_tests.sh`` runs one worker per core) each
worker gets an equal share of the cores, and the session fixtures that train
(:func:`learning_run`, :func:`short_run`) or write the data run once for all
workers: the first worker to ask does the work under a file lock, the others
wait and read its result.
"""
import fcntl
import importlib.util
import json
import multiprocessing.process
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# torch's (major, minor), for version-gated tests
TORCH = tuple(int(v) for v in torch.__version__.split('+')[0].split('.')[:2])

# The model configs: every configs/<folder>/*.py but mmdeploy's deploy
# configs (configs/deploy/, no model) and private folders ('_...').
MODEL_CONFIGS = sorted(
    p for p in (ROOT / 'configs').glob('*/*.py')
    if p.parent.name != 'deploy' and not p.parent.name.startswith('_'))

# What each config is for, as the metafiles state it (not its file name):
# ``TRAINING_DATA[path]`` is its 'Training Data' ('ImageNet-1k', 'COCO',
# 'ADE20K (embedded tiny data)', ...).
def _training_data():
    import yaml
    return {model['Config']: model['Metadata']['Training Data']
            for metafile in sorted((ROOT / 'configs').glob('*/metafile.yml'))
            for model in yaml.safe_load(metafile.read_text())['Models']}


TRAINING_DATA = _training_data()
EMBEDDED_MARK = ' (embedded tiny data)'


def is_embedded(path) -> bool:
    """Whether a config trains on the embedded tiny data (its metafile
    entry says so)."""
    rel = str(Path(path).resolve().relative_to(ROOT)) if Path(
        path).is_absolute() else str(path)
    return TRAINING_DATA[rel].endswith(EMBEDDED_MARK)


# pytest-xdist: this worker's share of the cores (all of them without xdist)
WORKERS = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
THREADS = max(1, (os.cpu_count() or 1) // WORKERS)
if WORKERS > 1:
    torch.set_num_threads(THREADS)

RELEASE_TIER = 'CLUSTR_MM_RELEASE_TIER'
NO_CUDA = ('needs a CUDA device (the GPU tier, pytest -m cuda); '
           'torch.cuda.is_available() is False here')


def pytest_collection_modifyitems(config, items):
    """Skip the GPU tier where there is no CUDA device and the release tier
    unless asked for; under xdist, order the tests for the workers
    (:func:`_dispatch_rank`)."""
    if 'PYTEST_XDIST_WORKER' in os.environ:
        items.sort(key=_dispatch_rank)  # stable: files keep their order
    from clustr_mm.registry import switch
    if not switch(RELEASE_TIER, False):
        skip = pytest.mark.skip(reason=f'the release tier: opt in with '
                                f'{RELEASE_TIER}=1')
        for item in items:
            if item.get_closest_marker('release'):
                item.add_marker(skip)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_CUDA)
    for item in items:
        if item.get_closest_marker('cuda'):
            item.add_marker(skip)


def _dispatch_rank(item) -> int:
    """Longest first, so that no worker is left with a long test at the end
    (tools/run_tests.sh hands tests out one at a time, --maxschedchunk 1):
    the tests marked longest (the detection learning runs, 5-6 min each),
    the other slow tests, the
    slow tests that wait for a learning run's checkpoint (after it is made),
    then the fast ones."""
    if item.get_closest_marker('longest'):
        return 0
    if item.get_closest_marker('slow'):
        waits = LEARNING_STACK and 'learning_run' in item.fixturenames
        return 2 if waits else 1
    return 3


_current_test = None


@pytest.fixture(autouse=True)
def _remember_test(request):
    """The running test's node, for :func:`run_tool`'s marker check."""
    global _current_test
    _current_test = request.node
    yield
    _current_test = None


# What the slow marker is for (pytest.ini): another Python process, a shell
# running a tool, a launcher. Libraries' own probes of the machine (gcc
# --version in MMEngine's environment report, ldconfig, fc-list) are not.
_TOOLS = ('python', 'bash', 'sh', 'torchrun', 'srun', 'mim', 'pip')


def _starts_a_tool(program) -> bool:
    program = str(program).split()[0] if str(program).strip() else ''
    name = os.path.basename(program)
    return (program == sys.executable or name.startswith(_TOOLS)
            or program.startswith(str(ROOT / 'tools')))


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(request, monkeypatch):
    """Fail a test not marked ``slow`` that starts a Python process, a shell
    or a launcher (subprocess) or a multiprocessing process: the fast loop
    must stay fast, and its tests in one process."""
    if request.node.get_closest_marker('slow'):
        yield
        return
    started = request.node.started_processes = []

    def refuse(what):
        started.append(what)
        raise RuntimeError(
            f'{request.node.nodeid} is not marked slow but starts {what}: '
            'mark it @pytest.mark.slow (pytest.ini) or keep it in-process')

    execute = subprocess.Popen._execute_child

    def guarded_execute(self, args, executable, *rest, **kwargs):
        program = args if isinstance(args, (str, bytes, os.PathLike)) \
            else args[0]
        if _starts_a_tool(program):
            refuse(f'the process {program!r}')
        return execute(self, args, executable, *rest, **kwargs)

    def guarded_start(process):
        refuse(f'a multiprocessing process ({process.name})')

    monkeypatch.setattr(subprocess.Popen, '_execute_child', guarded_execute)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, 'start',
                        guarded_start)
    yield
    if started:  # also when the refusal was swallowed (a thread, an except)
        pytest.fail(f'{request.node.nodeid} started {started[0]} '
                    'without the slow marker')


def free_port() -> int:
    """A TCP port nobody listens on now, for a launcher's master port (tests
    running side by side under xdist must not share one)."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _shared_dir(tmp_path_factory) -> Path:
    """The session's temporary folder that every xdist worker sees."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if 'PYTEST_XDIST_WORKER' in os.environ else base


def run_once(tmp_path_factory, name, work):
    """``work()``'s JSON-able result, computed by the first worker of the
    session to ask under a file lock and read back by the others (a failure
    too: the others fail with its message instead of repeating it)."""
    shared = _shared_dir(tmp_path_factory)
    done, failed = shared / f'{name}.json', shared / f'{name}.failed'
    with open(shared / f'{name}.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists() and not failed.exists():
            try:
                done.write_text(json.dumps(work()))
            except (Exception, pytest.fail.Exception) as err:
                failed.write_text(f'{type(err).__name__}: {err}')
                raise
    if failed.exists():
        pytest.fail(f'{name} failed in another worker: {failed.read_text()}')
    return json.loads(done.read_text())


@pytest.fixture(scope='session')
def tiny_data(tmp_path_factory):
    """The embedded datasets in ROOT/data, generated if missing (idempotent)."""
    run_once(tmp_path_factory, 'tiny-data', lambda: run_tool(
        ['tools/data/make_tiny_data.py', '--out', 'data'], timeout=300)
        .returncode)
    return ROOT / 'data'


def tool_env(env=None):
    """The environment of a tool the tests start: this worker's threads
    (a run compared with another must use the same number), then ``env``."""
    full = dict(os.environ, PYTHONUNBUFFERED='1', PYTHON=sys.executable,
                OMP_NUM_THREADS=str(min(2, THREADS)))
    full.update(env or {})
    return full


def run_tool(args, timeout=600, env=None, check=True, python=True):
    """Run a repo tool as a user would (cwd = repo root); return the output."""
    if _current_test is not None and not _current_test.get_closest_marker(
            'slow'):
        pytest.fail(f'{_current_test.nodeid} starts a tool ({args[0]}): '
                    'mark it @pytest.mark.slow so `pytest -m "not slow"` '
                    'stays fast')
    cmd = [sys.executable, *args] if python else list(args)
    proc = subprocess.run(cmd, cwd=ROOT, env=tool_env(env), timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if check and proc.returncode != 0:
        pytest.fail(f'{" ".join(map(str, args))} exited {proc.returncode}:\n'
                    f'{proc.stdout[-6000:]}')
    return proc


# The short tools/train.py run of each embedded config that the end-to-end
# tests share (test_tools trains and tests it, the inferencer and fine-tune
# tests load its checkpoint): config -> cfg-options keeping it to seconds.
EPOCH_1 = ['train_cfg.max_epochs=1', 'train_cfg.val_interval=1']
ITER_4 = ['train_cfg.max_iters=4', 'train_cfg.val_interval=4',
          'default_hooks.checkpoint.interval=4']
SHORT_RUN = {
    'configs/clustr/clustr-t_embedded-imagenet.py': EPOCH_1,
    'configs/paca/paca-t_embedded-imagenet.py': EPOCH_1,
    'configs/clustr/mask-rcnn_clustr-t_fpn_embedded-coco.py': EPOCH_1,
    'configs/paca/retinanet_paca-t_embedded-coco.py': EPOCH_1,
    'configs/clustr/fpn_clustr-t_embedded-ade20k.py': ITER_4,
    'configs/paca/upernet_paca-t_embedded-ade20k.py': ITER_4,
    'configs/clustr/td-hm_clustr-t_embedded-coco-wholebody.py': EPOCH_1,
}


# The learning runs the tests share (test_tools: test_detection_learns and
# the *_learns_beyond_an_image_blind_predictor tests), seed 0, from random
# weights: the embedded Mask R-CNN and RetinaNet configs for
# DETECTION_EPOCHS epochs of 8 iterations (warm-up over 20 iterations, then
# the configs' constant lr: their steps come later), the embedded UperNet
# for its 40 iterations.
DETECTION_EPOCHS = 4
LEARNING_RUN = {
    **{config: ('coco/bbox_mAP_50',
                [f'train_cfg.max_epochs={DETECTION_EPOCHS}'])
       for config in ['configs/clustr/mask-rcnn_clustr-t_fpn_embedded-coco.py',
                      'configs/paca/mask-rcnn_paca-t_fpn_embedded-coco.py',
                      'configs/paca/retinanet_paca-t_embedded-coco.py']},
    'configs/paca/upernet_paca-t_embedded-ade20k.py': ('mIoU', []),
}
# The seeds of the learning tests: 0 in CI (each family's shared run), 1 and
# 2 in the release tier (CLUSTR_MM_RELEASE_TIER=1). Each test's margin is
# below the smallest gap measured over the three.
LEARNING_SEEDS = [0, *(pytest.param(s, marks=pytest.mark.release)
                       for s in (1, 2))]
# Where the learning test runs (every stack but torch 2.1's), a config's
# learning run also stands for its short run: the inferencer tests load the
# trained detector instead of training a second, barely trained one.
LEARNING_STACK = TORCH >= (2, 2)


@pytest.fixture(scope='session')
def learning_run(tiny_data, tmp_path_factory):
    """``learning_run(config, seed=0)``: (work dir, last checkpoint,
    learning_check's result) of the :data:`LEARNING_RUN` of ``config``, run
    on first use and shared by every test of the session (every xdist
    worker)."""
    def get(config, seed=0):
        name = Path(config).stem + '-learning' + (f'-{seed}' if seed else '')

        def work():
            work_dir = _shared_dir(tmp_path_factory) / name
            work_dir.mkdir()
            metric, options = LEARNING_RUN[config]
            result = learning_result(config, metric, 0, work_dir, options,
                                     seed=seed)
            return str(work_dir), _last_checkpoint(work_dir), result

        work_dir, ckpt, result = run_once(tmp_path_factory, name, work)
        return Path(work_dir), ckpt, result

    return get


@pytest.fixture(scope='session')
def short_run(tiny_data, tmp_path_factory, learning_run):
    """``short_run(config)``: (work dir, last checkpoint) of the
    :data:`SHORT_RUN` training of ``config`` with tools/train.py (or of its
    learning run, see :data:`LEARNING_STACK`), run on first use and shared by
    every test of the session (every xdist worker)."""
    def get(config):
        if config in LEARNING_RUN and LEARNING_STACK:
            return learning_run(config)[:2]
        name = Path(config).stem

        def work():
            work_dir = _shared_dir(tmp_path_factory) / name
            work_dir.mkdir()
            # seeded: the shipped configs draw a seed per run, and the tests
            # that load these checkpoints must not depend on the draw
            run_tool(['tools/train.py', config, '--work-dir', str(work_dir),
                      '--cfg-options', 'randomness.seed=0',
                      *SHORT_RUN[config]])
            return str(work_dir), _last_checkpoint(work_dir)

        work_dir, ckpt = run_once(tmp_path_factory, name, work)
        return Path(work_dir), ckpt

    return get


def _last_checkpoint(work_dir) -> str:
    ckpt = (Path(work_dir) / 'last_checkpoint').read_text().strip()
    assert Path(ckpt).is_file(), ckpt
    return ckpt


_PARSED_CONFIGS = {}


def load_config(path):
    """``Config.fromfile(path)``, parsed once per session (a config with its
    library bases takes about a second; several test files read every
    shipped config): each call returns its own deep copy to change."""
    import copy

    from mmengine.config import Config
    key = str(Path(ROOT, path).resolve())
    if key not in _PARSED_CONFIGS:
        _PARSED_CONFIGS[key] = Config.fromfile(key)
    return copy.deepcopy(_PARSED_CONFIGS[key])


def logged_losses(work_dir):
    """(iter, loss) pairs of the newest run in ``work_dir`` (its scalars)."""
    runs = sorted(p for p in Path(work_dir).iterdir() if p.is_dir())
    lines = (runs[-1] / 'vis_data' / 'scalars.json').read_text().splitlines()
    return [(r['iter'], r['loss']) for r in map(json.loads, lines)
            if 'loss' in r]


def load_tool(name, folder='analysis'):
    """The module of ``tools/<folder>/<name>.py``, to call its functions."""
    path = ROOT / 'tools' / folder / f'{name}.py'
    spec = importlib.util.spec_from_file_location(f'_tool_{name}', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def learning_result(config, metric, min_gain, work_dir, options=(), seed=0):
    """``learning_check.py``'s result (start/end metric, and all metrics in
    ``start_metrics``/``end_metrics``) for ``config``, seeded (``seed``):
    the shipped configs draw a seed per run, and a check of learning must
    not depend on the draw. ``options``: further ``--cfg-options``."""
    out = run_tool(['tools/analysis/learning_check.py', config,
                    '--metric', metric, '--min-gain', str(min_gain),
                    '--work-dir', str(work_dir),
                    '--cfg-options', f'randomness.seed={seed}', *options],
                   # a training run: give a busy CI machine room (a run
                   # killed by the timeout would fail the test, not learn)
                   timeout=1800, check=False).stdout
    line = [ln for ln in out.splitlines() if ln.startswith('[learning] ')]
    assert line, out[-3000:]
    return json.loads(line[-1][len('[learning] '):])
