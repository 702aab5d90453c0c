"""End-to-end runs of tools/train.py, tools/test.py, dist_train.sh and
dist_test.sh (marked slow), and the tools' argument checks (in-process)."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import image_blind
from conftest import (DETECTION_EPOCHS, LEARNING_SEEDS, LEARNING_STACK,
                      ROOT, SHORT_RUN, free_port, learning_result, load_tool,
                      logged_losses, run_tool, tool_env)

import clustr_mm  # noqa: F401  (allow-lists runner checkpoint types)

PACA_CLS = 'configs/paca/paca-t_embedded-imagenet.py'
ONE_THREAD = {'OMP_NUM_THREADS': '1'}

# Every task family, each backbone at least once: name -> (config, cfg-options
# that keep the run to seconds (conftest.SHORT_RUN, the session's shared
# runs), metric of test.py)
FAMILIES = {
    name: (config, SHORT_RUN[config], metric) for name, config, metric in [
        ('cls-clustr', 'configs/clustr/clustr-t_embedded-imagenet.py',
         'accuracy/top1'),
        ('cls-paca', 'configs/paca/paca-t_embedded-imagenet.py',
         'accuracy/top1'),
        ('mask-rcnn-clustr',
         'configs/clustr/mask-rcnn_clustr-t_fpn_embedded-coco.py',
         'coco/segm_mAP'),
        ('retinanet-paca', 'configs/paca/retinanet_paca-t_embedded-coco.py',
         'coco/bbox_mAP'),
        ('fpn-clustr', 'configs/clustr/fpn_clustr-t_embedded-ade20k.py',
         'mIoU'),
        ('upernet-paca', 'configs/paca/upernet_paca-t_embedded-ade20k.py',
         'mIoU'),
        ('pose-clustr',
         'configs/clustr/td-hm_clustr-t_embedded-coco-wholebody.py',
         'coco-wholebody/AP'),
    ]}


# The upper end of each metric: COCO-style AP is a fraction, mmpretrain's
# accuracy and mmseg's mIoU are percentages.
METRIC_SCALE = {'accuracy/top1': 100.0, 'coco/segm_mAP': 1.0,
                'coco/bbox_mAP': 1.0, 'mIoU': 100.0, 'coco-wholebody/AP': 1.0}
# tools/dist_test.sh is checked against tools/test.py on this family's run.
DIST_TEST_FAMILY = 'fpn-clustr'


def _last_checkpoint(work_dir):
    return (work_dir / 'last_checkpoint').read_text().strip()


def _metrics(output):
    line = [ln for ln in output.splitlines() if ln.startswith('[test] ')]
    assert line, output[-3000:]
    return dict(re.findall(r'([\w/.-]+)=([-\d.e]+)', line[-1].split(': ', 1)[1]))


@pytest.mark.parametrize('family', [
    # the detection run also runs on the torch 2.1 stack (mmcv ops, RoIAlign)
    pytest.param(f, marks=pytest.mark.torch21) if f == 'mask-rcnn-clustr'
    else f for f in sorted(FAMILIES)])
@pytest.mark.slow
def test_train_then_test(family, short_run):
    config, _, metric = FAMILIES[family]
    if config == DETECTION['clustr'] and LEARNING_STACK:
        pytest.skip('test_detection_learns trains this config and checks '
                    "tools/test.py's metrics on this stack")
    work_dir, ckpt = short_run(config)
    out = run_tool(['tools/test.py', config, ckpt, '--work-dir',
                    str(work_dir)]).stdout
    metrics = _metrics(out)
    assert metric in metrics, metrics
    # each metric on its library's scale: COCO AP 0-1, accuracy/mIoU 0-100
    assert 0.0 <= float(metrics[metric]) <= METRIC_SCALE[metric], metrics
    if family == DIST_TEST_FAMILY:
        # two gloo processes, each evaluating half of the images: the same
        # metrics, printed by both ranks
        dist = run_tool(['bash', 'tools/dist_test.sh', config, ckpt, '2',
                         '--work-dir', str(work_dir / 'dist')], python=False,
                        env={'PORT': str(free_port()), **ONE_THREAD}).stdout
        printed = [ln for ln in dist.splitlines() if ln.startswith('[test] ')]
        assert len(printed) == 2, dist[-3000:]
        for line in printed:
            assert _metrics(line) == metrics, (line, metrics)
        assert float(metrics['aAcc']) > 0  # a real result, not an empty one


@pytest.mark.slow
def test_dist_train_two_cpu_processes(tiny_data, tmp_path):
    """Mask R-CNN ClusTR-T in two gloo processes (16 images / (2 processes x
    batch 2) = 4 iterations), with gradient checkpointing in the backbone
    (docs/benchmarks.md); one thread per process: two processes share the
    CI machine's two cores."""
    config, options, _ = FAMILIES['mask-rcnn-clustr']
    options = options + ['train_cfg.val_interval=10',
                         'model.backbone.with_cp=True']
    out = run_tool(['bash', 'tools/dist_train.sh', config, '2',
                    '--work-dir', str(tmp_path), '--cfg-options', *options],
                   python=False,
                   env={'PORT': str(free_port()), **ONE_THREAD}).stdout
    assert 'launcher pytorch, world size 2' in out, out[-3000:]
    assert _last_checkpoint(tmp_path).endswith('epoch_1.pth')
    state = torch.load(_last_checkpoint(tmp_path), map_location='cpu')
    assert state['meta']['iter'] == 4, state['meta']


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_result(tiny_data, tmp_path):
    """SIGKILL during epoch 2, resumed from epoch_1.pth: the losses and the
    final weights of the uninterrupted run; a missing checkpoint refused."""
    config = 'configs/clustr/clustr-t_embedded-imagenet.py'
    opts = ['--cfg-options', 'train_cfg.max_epochs=3',
            'train_cfg.val_interval=100', 'randomness.seed=0',
            'default_hooks.checkpoint.interval=1',
            'default_hooks.checkpoint.max_keep_ckpts=3',
            'default_hooks.logger.interval=1']
    full, killed = tmp_path / 'full', tmp_path / 'killed'
    # one thread in all three runs: equal losses need equal reductions
    run_tool(['tools/train.py', config, '--work-dir', str(full), *opts],
             env=ONE_THREAD)

    proc = subprocess.Popen(
        [sys.executable, 'tools/train.py', config, '--work-dir', str(killed),
         *opts], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env=tool_env(ONE_THREAD))
    deadline = time.time() + 300
    while not (killed / 'epoch_1.pth').exists() and time.time() < deadline:
        assert proc.poll() is None, 'training ended before it could be killed'
        time.sleep(0.05)
    proc.kill()  # SIGKILL during epoch 2: no clean-up code runs
    proc.wait()
    assert not (killed / 'epoch_3.pth').exists()

    # resumed from the explicit path, through the restricted unpickler
    # (forced: the fallback where torch cannot allow-list the runner's
    # types; test_sigterm_... resumes from last_checkpoint)
    out = run_tool(['tools/train.py', config, '--work-dir', str(killed),
                    '--resume', str(killed / 'epoch_1.pth'), *opts],
                   env={'CLUSTR_MM_SAFE_LOAD': 'restricted',
                        **ONE_THREAD}).stdout
    assert 'resumed epoch: 1' in out, out[-3000:]
    resumed = logged_losses(killed)
    assert resumed and resumed[0][0] > 4  # continued after epoch 1 (4 iters)
    assert resumed == [p for p in logged_losses(full) if p[0] >= resumed[0][0]]
    a = torch.load(full / 'epoch_3.pth', map_location='cpu')['state_dict']
    b = torch.load(killed / 'epoch_3.pth', map_location='cpu')['state_dict']
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.load(killed / 'epoch_3.pth',
                      map_location='cpu')['meta']['epoch'] == 3
    bad = run_tool(['tools/train.py', config, '--resume',
                    str(tmp_path / 'missing.pth'), '--work-dir', str(killed),
                    *opts], check=False)
    assert bad.returncode != 0 and 'no checkpoint at' in bad.stdout


# Classification learns beyond its frozen-backbone baseline (issue 40, item
# 1): top-1 on the embedded ImageNet's 16 validation images after the
# config's 8 epochs (32 iterations), one thread, 2026-11-27, torch 2.14.1:
# trained 75.0 / 75.0 / 75.0 for seeds 0 / 1 / 2; the same run with the
# backbone frozen at its random init (frozen_stages=4, only the head
# trains) 37.5 / 62.5 / 43.75. The smallest gap is 12.5 (seed 1); the test
# (seed 0) asks for one image more than the baseline: 6.25.
CLS_BASELINE_MARGIN = 6.25


@pytest.mark.parametrize('seed', LEARNING_SEEDS)
@pytest.mark.slow
def test_classification_learns_beyond_a_frozen_backbone(seed, tiny_data,
                                                        tmp_path):
    config = 'configs/clustr/clustr-t_embedded-imagenet.py'
    trained = learning_result(config, 'accuracy/top1', 0, tmp_path / 'a',
                              seed=seed)
    frozen = learning_result(config, 'accuracy/top1', 0, tmp_path / 'b',
                             ['model.backbone.frozen_stages=4'], seed=seed)
    assert frozen['weight_change']['backbone'] == 0.0, frozen
    assert trained['weight_change']['backbone'] > 0.01, trained
    assert trained['end'] >= frozen['end'] + CLS_BASELINE_MARGIN, (
        trained['end'], frozen['end'])


# Semantic FPN learns beyond an image-blind predictor (issue 40, item 1):
# mIoU on the embedded ADE20K's 8 validation images after the config's 40
# iterations, one thread, 2026-11-27: seeds 0 / 1 / 2 39.1 / 65.0 / 55.5
# (docs/embedded_data.md). Baseline, measured in the test: the per-pixel
# most frequent training class (tests/image_blind.py), 24.34. The smallest
# gap is 14.8 (seed 0, the test's); the margin is half of it. (The same run
# with the backbone frozen at its random init, 48.0 / 55.1 / 52.9, is no
# baseline here: it beats the trained run at seed 0.)
FPN_MARGIN = 7.0


@pytest.mark.parametrize('seed', LEARNING_SEEDS)
@pytest.mark.slow
def test_segmentation_learns_on_embedded_data(seed, tiny_data, tmp_path):
    """The embedded ADE20K run takes mIoU far above the untrained model's
    and beyond what a predictor blind to the image scores."""
    result = learning_result('configs/clustr/fpn_clustr-t_embedded-ade20k.py',
                             'mIoU', 20, tmp_path, seed=seed)
    assert result['end'] >= result['start'] + 20, result
    blind = image_blind.segmentation(tiny_data)
    assert result['end'] >= blind + FPN_MARGIN, (blind, result)


# Detection learns: conftest.LEARNING_RUN, the embedded Mask R-CNN configs.
DETECTION = {
    'clustr': 'configs/clustr/mask-rcnn_clustr-t_fpn_embedded-coco.py',
    'paca': 'configs/paca/mask-rcnn_paca-t_fpn_embedded-coco.py',
}
# On COCO's 0-1 scale. Measured after 4 epochs, one thread (2026-11-26,
# docs/embedded_data.md): untrained 0.000 for both; bbox mAP50 / segm mAP
# ClusTR-T seeds 0, 1, 2: 0.755 / 0.452, 0.808 / 0.524, 0.767 / 0.475;
# PaCa-T seeds 0, 1, 2: 0.698 / 0.493, 0.659 / 0.431, 0.691 / 0.479.
# Baseline, measured in the test (tests/image_blind.py): every training box
# on every validation image, 0.013 / 0.003. The margins over it are ~45 % of
# the smallest measured gap in bbox mAP50 (0.646) and ~35 % in segm mAP
# (0.428). Controls: ClusTR-T with channels-last maps
# (tests/configs/channels_last_maps.py, the RoIAlign bug) 0.007 / 0.002,
# under them; ClusTR-T with its backbone frozen at the random init
# (model.backbone.frozen_stages=4, seed 0) 0.756 / 0.528, ABOVE them: on
# this data the neck and heads learn from random backbone features, so the
# margins show the detector learns from the maps the backbone hands it (read
# as NCHW); DETECTION_BACKBONE_CHANGE below fails the frozen backbone.
DETECTION_UNTRAINED = 0.01
# The backbone must have trained: learning_check's weight_change (relative
# change of the backbone's weights over the run). A backbone frozen at its
# random weights reads 0 (and reaches the bars above: the neck and heads
# alone learn the tiny data); weight decay alone would move it by ~6e-7
# (lr 2e-4 x wd 1e-4 x 32 iterations). Measured after 4 epochs, seed 2
# (2026-11-26): ClusTR-T 0.0145, PaCa-T 0.0082; ClusTR-T with
# model.backbone.frozen_stages=4, seed 0: 0.0 (bbox mAP50 / segm mAP 0.756 /
# 0.528, above the bars). After 1 epoch, ClusTR-T seed 0: 0.0032.
DETECTION_BACKBONE_CHANGE = 0.002
DETECTION_MARGINS = {'coco/bbox_mAP_50': 0.3, 'coco/segm_mAP': 0.15}


# (the torch 2.1 stack runs test_train_then_test[mask-rcnn-clustr] instead:
# the same ops for a sixth of the time)
@pytest.mark.parametrize('seed', LEARNING_SEEDS)
@pytest.mark.parametrize('backbone', ['clustr', 'paca'])
@pytest.mark.slow
@pytest.mark.longest
def test_detection_learns(backbone, seed, learning_run, tiny_data):
    """bbox mAP50 and segm mAP from the untrained model's (its random
    weights: 0) to far above an image-blind predictor's (measured here); a
    backbone returning channels-last maps (the RoIAlign bug of 2026-11-21)
    stays under the margins (0.007 / 0.002); a backbone frozen at its
    random weights passes them and fails the backbone weight-change check
    (see DETECTION_MARGINS).
    ClusTR: tools/test.py on the saved checkpoint reports the same metrics."""
    config = DETECTION[backbone]
    work_dir, ckpt, result = learning_run(config, seed)
    start, end = result['start_metrics'], result['end_metrics']
    # the record says what ran (the seed the test set, epochs trained)
    assert result['seed'] == seed and result['epochs'] == DETECTION_EPOCHS, \
        result
    assert result['weight_change']['backbone'] >= DETECTION_BACKBONE_CHANGE, \
        result
    blind = image_blind.detection(tiny_data)
    for key, margin in DETECTION_MARGINS.items():
        assert start[key] <= DETECTION_UNTRAINED, result
        assert end[key] >= blind[key] + margin, (key, blind, result)
        assert end[key] <= 1.0, result  # COCO AP is a fraction
    if backbone == 'clustr' and seed == 0:
        out = run_tool(['tools/test.py', config, ckpt,
                        '--work-dir', str(work_dir / 'test')]).stdout
        metrics = _metrics(out)
        for key in DETECTION_MARGINS:
            assert float(metrics[key]) == pytest.approx(end[key], abs=1e-3)


# RetinaNet learns beyond an image-blind predictor: the embedded RetinaNet +
# PaCa-T config for DETECTION_EPOCHS (4) epochs (conftest.LEARNING_RUN), one
# thread, 2026-11-27, torch 2.14.1: bbox mAP50 0.152 / 0.459 / 0.259 for
# seeds 0 / 1 / 2 against the image-blind 0.013 (tests/image_blind.py). The
# smallest gap is 0.139; the margin is half of it. The backbone's weights
# moved by 0.0086 / 0.0095 / 0.0094 (learning_check's weight_change).
RETINANET_MARGIN = 0.07
RETINANET_BACKBONE_CHANGE = 0.003


@pytest.mark.slow
@pytest.mark.skipif(not LEARNING_STACK, reason='the learning runs run on the '
                    'default stack')
@pytest.mark.parametrize('seed', LEARNING_SEEDS)
def test_retinanet_learns_beyond_an_image_blind_predictor(seed, learning_run,
                                                          tiny_data):
    _, _, result = learning_run(
        'configs/paca/retinanet_paca-t_embedded-coco.py', seed)
    assert result['seed'] == seed and result['epochs'] == DETECTION_EPOCHS, \
        result
    assert result['weight_change']['backbone'] >= RETINANET_BACKBONE_CHANGE, \
        result
    key = 'coco/bbox_mAP_50'
    blind = image_blind.detection(tiny_data)[key]
    assert result['start'] <= DETECTION_UNTRAINED, result
    assert result['end'] >= blind + RETINANET_MARGIN, (blind, result)


# UperNet learns beyond an image-blind predictor: the embedded UperNet +
# PaCa-T config's 40 iterations (conftest.LEARNING_RUN), one thread,
# 2026-11-27, torch 2.14.1: mIoU 80.65 / 73.45 / 72.63 for seeds 0 / 1 / 2
# against the image-blind 24.34 (tests/image_blind.py). The smallest gap is
# 48.3; the margin is half of it. The backbone's weights moved by 0.082 /
# 0.083 / 0.081 (learning_check's weight_change).
UPERNET_MARGIN = 24.0
UPERNET_BACKBONE_CHANGE = 0.03


@pytest.mark.slow
@pytest.mark.skipif(not LEARNING_STACK, reason='the learning runs run on the '
                    'default stack')
@pytest.mark.parametrize('seed', LEARNING_SEEDS)
def test_upernet_learns_beyond_an_image_blind_predictor(seed, learning_run,
                                                        tiny_data):
    _, _, result = learning_run(
        'configs/paca/upernet_paca-t_embedded-ade20k.py', seed)
    assert result['seed'] == seed and result['iters'] == 40, result
    assert result['weight_change']['backbone'] >= UPERNET_BACKBONE_CHANGE, \
        result
    blind = image_blind.segmentation(tiny_data)
    assert result['end'] >= blind + UPERNET_MARGIN, (blind, result)


@pytest.mark.slow
def test_sigterm_and_resume_without_a_seed_match_the_uninterrupted_run(
        tiny_data, tmp_path):
    """The shipped config as is (randomness.seed None): a run stopped by
    SIGTERM during epoch 2 and resumed gives the losses of an uninterrupted
    run with the seed the first one drew (read from its checkpoint)."""
    opts = ['--cfg-options', 'train_cfg.max_epochs=3',
            'train_cfg.val_interval=100', 'default_hooks.logger.interval=1']
    killed, full = tmp_path / 'killed', tmp_path / 'full'
    proc = subprocess.Popen(
        [sys.executable, 'tools/train.py', PACA_CLS, '--work-dir',
         str(killed), *opts], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env=tool_env(ONE_THREAD))
    deadline = time.time() + 120
    while not (killed / 'epoch_1.pth').exists() and time.time() < deadline:
        assert proc.poll() is None, 'training ended before the signal'
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait() == -signal.SIGTERM
    assert not (killed / 'epoch_3.pth').exists()
    seed = torch.load(killed / 'epoch_1.pth',
                      map_location='cpu')['meta']['seed']
    out = run_tool(['tools/train.py', PACA_CLS, '--work-dir', str(killed),
                    '--resume', *opts], env=ONE_THREAD).stdout
    assert 'resumed epoch: ' in out
    run_tool(['tools/train.py', PACA_CLS, '--work-dir', str(full), *opts,
              f'randomness.seed={seed}'], env=ONE_THREAD)
    resumed = logged_losses(killed)
    assert resumed and resumed[0][0] > 4, resumed  # continued after epoch 1
    assert resumed == [p for p in logged_losses(full) if p[0] >= resumed[0][0]]


@pytest.mark.parametrize('option,iteration', [
    ('optim_wrapper.optimizer.lr=1e6', 2),
    ('model.head.loss.loss_weight=nan', 1)])
@pytest.mark.slow
def test_diverged_run_stops_before_saving(tiny_data, tmp_path, option,
                                          iteration):
    """lr 1e6: iteration 2 overflows (the backbone's stage check) or its
    loss is NaN (FailFastHook); a NaN loss weight: iteration 1's loss is NaN
    with finite activations (FailFastHook). Either way the run stops there,
    says so and writes no checkpoint (it used to train on and save NaN
    weights)."""
    proc = run_tool(['tools/train.py', PACA_CLS, '--work-dir', str(tmp_path),
                     '--cfg-options', option, 'train_cfg.max_epochs=2'],
                    check=False, env=ONE_THREAD)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert re.search(rf'(training diverged|stopped) at iteration {iteration} '
                     r'\(epoch 1\)', proc.stdout), proc.stdout[-3000:]
    if 'nan' in option:
        assert ('training diverged at iteration 1 (epoch 1): loss=nan'
                in proc.stdout)
    assert 'loss=nan' in proc.stdout or 'NaN/Inf' in proc.stdout
    assert not list(tmp_path.glob('*.pth'))


@pytest.mark.slow
def test_checkpoint_option_typo_fails_before_the_first_iteration(tmp_path):
    typo = 'default_hooks.checkpoint.max_keep_ckpt=1'
    proc = run_tool(['tools/train.py', PACA_CLS, '--work-dir', str(tmp_path),
                     '--cfg-options', typo], check=False, env=ONE_THREAD)
    assert proc.returncode != 0
    assert ("unknown option 'max_keep_ckpt' (did you mean 'max_keep_ckpts'?)"
            in proc.stdout), proc.stdout[-3000:]
    assert 'Epoch(train)' not in proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU path')
def test_amp_trains_in_bf16_on_the_cpu(tiny_data, tmp_path):
    out = run_tool(['tools/train.py', PACA_CLS, '--amp', '--work-dir',
                    str(tmp_path), '--cfg-options', 'train_cfg.max_epochs=1',
                    'train_cfg.val_interval=100'], env=ONE_THREAD).stdout
    assert '[train] --amp: CPUAmpOptimWrapper' in out
    assert logged_losses(tmp_path) and (tmp_path / 'epoch_1.pth').exists()


@pytest.mark.parametrize('size', ['64x', 'abc', '0', '64x0', '8x8x8'])
def test_benchmark_refuses_a_malformed_size(size, capsys):
    tool = load_tool('benchmark')
    with pytest.raises(SystemExit):
        tool.parse_args(['--sizes', '224', size])
    assert (f"--sizes: {size!r} is not a size: expected S or HxW"
            in capsys.readouterr().err)


def _photo(tmp_path):
    """A small JPEG to show clusters on (random pixels)."""
    import numpy as np
    from PIL import Image
    path = tmp_path / 'photo.jpg'
    Image.fromarray(np.random.default_rng(0).integers(
        0, 256, (48, 64, 3), np.uint8)).save(path)
    return path


@pytest.mark.parametrize('option,message', [
    (['--stages', '5'], r'--stages 5: the backbone has 4 stages \(0\.\.3, '
     r'or -4\.\.-1 from the end\)'),
    (['--stages', '0', '--blocks', '9'], r'--blocks 9: stage 0 has (\d) '
     r'blocks \(0\.\.\d, or -\1\.\.-1 from the end\)'),
])
def test_visualize_clusters_refuses_a_stage_or_block_out_of_range(
        tmp_path, option, message):
    tool = load_tool('visualize_clusters')
    image = _photo(tmp_path)
    with pytest.raises(SystemExit, match=message):
        tool.main([str(image), str(ROOT / 'configs/clustr/'
                                   'clustr-t_embedded-imagenet.py'),
                   '--out', str(tmp_path / 'x.png'), '--shape', '64', '64',
                   *option])
    assert not (tmp_path / 'x.png').exists()


def test_visualize_clusters_refuses_a_backbone_without_clusters(tmp_path):
    config = tmp_path / 'resnet.py'
    config.write_text("_base_ = ['mmpretrain::resnet/resnet18_8xb32_in1k.py']"
                      "\n")
    tool = load_tool('visualize_clusters')
    image = _photo(tmp_path)
    with pytest.raises(SystemExit, match='the backbone is a ResNet; clusters '
                       'can be shown for ClusTR and PaCaViT backbones only'):
        tool.main([str(image), str(config), '--out', str(tmp_path / 'x.png'),
                   '--shape', '64', '64'])


def test_get_flops_refuses_a_config_without_a_model(tmp_path):
    config = tmp_path / 'schedule.py'
    config.write_text("default_scope = 'mmpretrain'\n"
                      "train_cfg = dict(max_epochs=1)\n")
    tool = load_tool('get_flops')
    with pytest.raises(ValueError, match=r'schedule.py: the config has no '
                       r'model = dict\(\.\.\.\)'):
        tool.get_flops(str(config))


@pytest.mark.slow
def test_gpu_checks_refuse_bad_settings_before_any_work(tmp_path):
    """tools/run_gpu_checks.sh reads its settings before it starts: a step
    it does not have, no step, a wait that is not whole seconds, a baseline
    that is no file or a PYTHON that is no interpreter stop it with a
    message naming the setting; on a machine without a GPU a valid call
    stops at the CUDA check. Without PYTHON and without the default
    environment (a lent GPU machine: .venv is not copied there) it runs
    python3."""
    cases = [({'CLUSTR_MM_GPU_STEPS': '2 7'}, "no step '7' (the steps are"),
             ({'CLUSTR_MM_GPU_STEPS': ' '},
              'CLUSTR_MM_GPU_STEPS names no step'),
             ({'CLUSTR_MM_MMCV_WAIT': '5m'},
              "CLUSTR_MM_MMCV_WAIT must be whole seconds, got '5m'"),
             ({'CLUSTR_MM_BASELINE': str(tmp_path / 'no.py')},
              'is not a file'),
             ({'PYTHON': str(tmp_path / 'no-python')},
              'is not a Python interpreter here')]
    if not torch.cuda.is_available():
        cases.append(({'CLUSTR_MM_GPU_STEPS': '5 6'},
                      'torch.cuda.is_available() is False'))
    for env, message in cases:
        out = tmp_path / 'out'
        proc = run_tool(['bash', 'tools/run_gpu_checks.sh', str(out)],
                        env={'PYTHON': sys.executable, **env}, check=False,
                        python=False, timeout=120)
        assert proc.returncode == 2, (env, proc.stdout)
        assert message in proc.stdout, (env, proc.stdout)
        assert '[gpu_checks]' not in proc.stdout, (env, proc.stdout)
    bare = tmp_path / 'checkout'  # the script where no .venv is
    (bare / 'tools').mkdir(parents=True)
    shutil.copy(ROOT / 'tools' / 'run_gpu_checks.sh', bare / 'tools')
    (tmp_path / 'bin').mkdir()
    stub = tmp_path / 'bin' / 'python3'
    stub.write_text('#!/bin/sh\necho "python3 was run"; exit 3\n')
    stub.chmod(0o755)
    proc = run_tool(['bash', str(bare / 'tools' / 'run_gpu_checks.sh'),
                     str(tmp_path / 'out')], check=False, python=False,
                    env={'PYTHON': '',
                         'PATH': f'{stub.parent}:{os.environ["PATH"]}'})
    assert proc.returncode == 2 and 'python3 was run' in proc.stdout, \
        proc.stdout


@pytest.mark.slow
def test_gpu_checks_name_a_library_that_does_not_import_once(tmp_path):
    """run_gpu_checks.sh checks the task libraries before the configs that
    need them: where one does not import (mmpretrain without `modelindex`
    on a GPU image: 31 configs failed one by one, 2026-11-28) it says so
    once, skips those configs, runs the others and exits non-zero."""
    calls = tmp_path / 'calls'
    stub = tmp_path / 'python'
    stub.write_text(
        '#!/bin/sh\n'
        'case "$*" in\n'
        '  *check_scope*mmpretrain*) echo "Traceback (most recent call'
        ' last):"; echo "UnsupportedEnvironmentError: mmpretrain does not'
        ' import (No module named \'modelindex\')"; exit 1 ;;\n'
        f'  *train_speed.py*) echo "$*" >> {calls}; exit 0 ;;\n'
        'esac\n'
        'exit 0\n')
    stub.chmod(0o755)
    proc = run_tool(['bash', 'tools/run_gpu_checks.sh', str(tmp_path / 'o')],
                    env={'PYTHON': str(stub), 'CLUSTR_MM_GPU_STEPS': '6'},
                    check=False, python=False, timeout=120)
    assert proc.returncode == 1, proc.stdout
    assert ("skipped (configs of mmpretrain mmseg): UnsupportedEnvironment"
            "Error: mmpretrain does not import (No module named "
            "'modelindex')") in proc.stdout, proc.stdout
    ran = calls.read_text().splitlines()
    assert len(ran) == 1 and '--release paca-mask-rcnn-ms-1x' in ran[0], ran
