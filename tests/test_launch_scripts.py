"""tools/slurm_train.sh and tools/slurm_test.sh hand srun what a Slurm
cluster needs: run against a fake ``srun`` on PATH that records its
arguments (no cluster here; the GPU side of the slurm launcher is
MMEngine's). tools/dist_test.sh is run for real, on CPU processes, in
tests/test_tools.py::test_train_then_test.
"""
import os
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
