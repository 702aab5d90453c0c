"""tools/slurm_train.sh and tools/slurm_test.sh hand srun what a Slurm
cluster needs: run against a fake ``srun`` on PATH that records its
arguments (no cluster here; the GPU side of the slurm launcher is
MMEngine's). tools/dist_test.sh is run for real, on CPU processes, in
tests/test_tools.py::test_train_then_test.
"""
import os
import re
import sys

import pytest
from conftest import run_tool

pytestmark = pytest.mark.slow  # every test here starts bash

CONFIG = 'configs/clustr/mask-rcnn_clustr-t_fpn_embedded-coco.py'


@pytest.fixture
def fake_srun(tmp_path):
    """A directory with an ``srun`` that writes its arguments, one a line,
    to ``<dir>/srun.args``; returns (env, reader)."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    log = tmp_path / 'srun.args'
    srun = bin_dir / 'srun'
    srun.write_text('#!/usr/bin/env bash\n'
                    f'printf "%s\\n" "$@" > "{log}"\n'
                    'echo "srun: would run $# arguments"\n')
    srun.chmod(0o755)
    env = {'PATH': f'{bin_dir}{os.pathsep}{os.environ["PATH"]}',
           'GPUS': '16', 'GPUS_PER_NODE': '8', 'CPUS_PER_TASK': '3',
           'SRUN_ARGS': '--quotatype=auto --time=1:00:00'}
    return env, lambda: log.read_text().splitlines()


def _srun_part(partition, job, gpus, per_node, cpus):
    return ['-p', partition, f'--job-name={job}', f'--gres=gpu:{per_node}',
            f'--ntasks={gpus}', f'--ntasks-per-node={per_node}',
            f'--cpus-per-task={cpus}', '--kill-on-bad-exit=1']


def test_slurm_train_hands_srun_the_job(fake_srun, tmp_path):
    env, args = fake_srun
    out = run_tool(['bash', 'tools/slurm_train.sh', 'gpu-a100', 'clustr-det',
                    CONFIG, str(tmp_path / 'wd'), '--amp', '--cfg-options',
                    'train_cfg.max_epochs=2'], python=False, env=env)
    assert 'srun: would run' in out.stdout
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert args() == [
        *_srun_part('gpu-a100', 'clustr-det', 16, 8, 3),
        '--quotatype=auto', '--time=1:00:00',  # SRUN_ARGS, split
        sys.executable, '-u', f'{root}/tools/train.py', CONFIG,
        f'--work-dir={tmp_path / "wd"}', '--launcher=slurm',
        '--amp', '--cfg-options', 'train_cfg.max_epochs=2']


def test_slurm_train_defaults(fake_srun):
    """Without WORK_DIR and the GPU variables: work_dirs/<config name>, 8
    GPUs on one node, 5 CPUs per task, no extra srun arguments."""
    env, args = fake_srun
    for name in ('GPUS', 'GPUS_PER_NODE', 'CPUS_PER_TASK', 'SRUN_ARGS'):
        env[name] = ''
    run_tool(['bash', 'tools/slurm_train.sh', 'p', 'j', CONFIG],
             python=False, env=env)
    got = args()
    assert got[:8] == _srun_part('p', 'j', 8, 8, 5)
    assert got[8] == sys.executable
    assert got[11:] == [
        CONFIG, '--work-dir=work_dirs/mask-rcnn_clustr-t_fpn_embedded-coco',
        '--launcher=slurm']


def test_slurm_test_hands_srun_the_job(fake_srun, tmp_path):
    env, args = fake_srun
    env['GPUS'] = '4'
    env['GPUS_PER_NODE'] = '4'
    ckpt = str(tmp_path / 'epoch_12.pth')
    run_tool(['bash', 'tools/slurm_test.sh', 'eval', 'clustr-test', CONFIG,
              ckpt, '--work-dir', str(tmp_path / 'out')], python=False,
             env=env)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert args() == [
        *_srun_part('eval', 'clustr-test', 4, 4, 3),
        '--quotatype=auto', '--time=1:00:00',
        sys.executable, '-u', f'{root}/tools/test.py', CONFIG, ckpt,
        '--launcher=slurm', '--work-dir', str(tmp_path / 'out')]


@pytest.mark.parametrize('script, argv', [
    ('tools/slurm_train.sh', ['p', 'j']),
    ('tools/slurm_test.sh', ['p', 'j', CONFIG]),
])
def test_slurm_scripts_refuse_missing_arguments(fake_srun, script, argv):
    env, _ = fake_srun
    proc = run_tool(['bash', script, *argv], python=False, env=env,
                    check=False)
    assert proc.returncode != 0
    assert f'usage: bash {script} PARTITION JOB_NAME CONFIG' in proc.stdout


# tools/run_gpu_checks.sh step 54 (issue 54's rows in one GPU call): what it
# runs, by issue 54's items (a)-(f), as (tool, words its command holds)
PRESET = {
    'a': ('benchmark.py', ['--sizes 800x1344', '--batch 2', '--amp bf16',
                           '--train-step', 'clustr-s-window pvtv2-b2 swin-t']),
    'b': ('train_speed.py', ['mask-rcnn_clustr-s_fpn_1x_coco.py',
                             'mask-rcnn_paca-s_fpn_ms-1x_coco.py',
                             'mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py',
                             '--amp', '--input-size 1333x800']),
    'c': ('benchmark.py', ['--sizes 224', '--batch 128', '--amp bf16',
                           '--train-step', 'clustr-s-exact pvtv2-b2']),
    'd-seg': ('train_speed.py', ['upernet_clustr-s_', 'upernet_swin-t_',
                                 'upernet_pvtv2-b2_', '--amp']),
    'd-pose': ('train_speed.py', ['td-hm_clustr-s_mta-', 'td-hm_swin-t_mta-',
                                  'td-hm_pvtv2-b2_mta-', '--amp']),
    'e': ('nan_check.py', ['--amp fp16', '--iters 200']),
    'f': ('train_speed.py', ['upernet_clustr-s_', '--amp',
                             'compile.mode=reduce-overhead',
                             'compile.dynamic=False']),
}
PUBLISHED = ['issue54_versions.json', 'bench-800x1344.json',
             'mask-rcnn_train-speed_amp.jsonl', 'bench-224_tf32x3.json',
             'nan-check_fp16.jsonl', 'upernet-512_train-speed_amp.jsonl',
             'pose-wholebody-256x192_train-speed_amp.jsonl',
             'upernet-512_train-speed_amp_compile-reduce-overhead.jsonl']


def _gpu_checks_stub(tmp_path):
    """A PYTHON for run_gpu_checks.sh that records each call (one line) and
    does nothing else: every check passes, a tool writes a row to its
    --out, nan_check.py prints its summary, the versions script prints {}."""
    calls = tmp_path / 'calls'
    stub = tmp_path / 'python'
    stub.write_text(
        '#!/bin/sh\n'
        f'echo "$*" >> "{calls}"\n'
        'prev=\n'
        'for a in "$@"; do\n'
        '  [ "$prev" = --out ] && echo \'{"stub": 1}\' > "$a"\n'
        '  prev=$a\n'
        'done\n'
        'case "$*" in\n'
        '  *nan_check.py*) echo \'[nan-check] {"ok": true}\' ;;\n'
        '  -) echo \'{}\' ;;\n'
        'esac\n'
        'exit 0\n')
    stub.chmod(0o755)
    return stub, calls


def _resolves(word):
    """Whether a config path of a command is a file: ours, or an installed
    library's ``scope::path``."""
    from importlib.util import find_spec
    from pathlib import Path
    from conftest import ROOT
    if '::' in word:
        scope, _, rel = word.partition('::')
        spec = find_spec(scope)
        return spec is not None and (
            Path(spec.origin).parent / '.mim' / 'configs' / rel).is_file()
    return (ROOT / word).is_file()


def test_gpu_checks_issue_54_preset_names_what_exists(tmp_path):
    """CLUSTR_MM_GPU_STEPS=54 runs issue 54's items (a)-(f) with tools,
    configs and benchmark models that exist (a stub Python records the
    calls: no GPU needed), and copies each result to CLUSTR_MM_RESULTS as
    <date>_<device>_<name>."""
    from conftest import ROOT, load_tool
    models = load_tool('benchmark_common').MODELS
    stub, calls = _gpu_checks_stub(tmp_path)
    results = tmp_path / 'results'
    proc = run_tool(['bash', 'tools/run_gpu_checks.sh', str(tmp_path / 'o')],
                    env={'PYTHON': str(stub), 'CLUSTR_MM_GPU_STEPS': '54',
                         'CLUSTR_MM_RESULTS': str(results)},
                    check=False, python=False, timeout=120)
    assert proc.returncode == 0, proc.stdout
    tools = [c for c in calls.read_text().splitlines()
             if c.startswith('tools/')]
    for call in tools:
        words = call.split()
        assert (ROOT / words[0]).is_file(), call
        configs = [w for w in words
                   if w.endswith('.py') and w != words[0]]
        for config in configs:
            assert _resolves(config), (config, call)
        if '--models' in words:
            named = words[words.index('--models') + 1:]
            named = named[:next((i for i, w in enumerate(named)
                                 if w.startswith('--')), len(named))]
            assert named and set(named) <= set(models), call
    for item, (tool, words) in PRESET.items():
        assert any(c.split()[0].endswith('/' + tool)
                   and all(w in c for w in words) for c in tools), \
            (item, tools)
    compiled = [c for c in tools if 'compile.' in c]
    assert len(compiled) == 1, compiled  # (d)'s rows stay eager
    # <date>_<device>_<name>: the stub names no device, so 'gpu'
    found = [p.name.split('_', 2) for p in results.iterdir()]
    assert sorted(name for _, _, name in found) == sorted(PUBLISHED), found
    assert all(re.fullmatch(r'\d{4}-\d\d-\d\d', date) and device == 'gpu'
               for date, device, _ in found), found


def test_gpu_checks_budget_skips_what_does_not_fit(tmp_path):
    """CLUSTR_MM_GPU_BUDGET: a step of 54 whose estimate does not fit in
    what is left is skipped, said so, and the run exits non-zero; a
    budget that is not whole seconds is refused before any work."""
    stub, calls = _gpu_checks_stub(tmp_path)
    proc = run_tool(['bash', 'tools/run_gpu_checks.sh', str(tmp_path / 'o')],
                    env={'PYTHON': str(stub), 'CLUSTR_MM_GPU_STEPS': '54',
                         'CLUSTR_MM_GPU_BUDGET': '50',
                         'CLUSTR_MM_RESULTS': str(tmp_path / 'r')},
                    check=False, python=False, timeout=120)
    assert proc.returncode == 1, proc.stdout
    assert 'skipped 54a (800x1344 img/s): about 60 s wanted' in proc.stdout
    assert 'skipped 54f' in proc.stdout
    ran = calls.read_text()
    assert '--sizes 224' in ran and '800x1344' not in ran  # (c) fits in 45 s
    assert 'compile.mode' not in ran
    proc = run_tool(['bash', 'tools/run_gpu_checks.sh', str(tmp_path / 'o')],
                    env={'PYTHON': str(stub), 'CLUSTR_MM_GPU_BUDGET': '8m'},
                    check=False, python=False, timeout=120)
    assert proc.returncode == 2, proc.stdout
    assert "CLUSTR_MM_GPU_BUDGET must be whole seconds, got '8m'" \
        in proc.stdout
