"""The GPU tier: ``pytest -m cuda`` (docs/development.md). Every test here
is marked ``cuda`` and skipped, with the reason, where torch sees no CUDA
device (tests/conftest.py).

* the fused DPC-kNN kernels (not the interpreter) against the reference at
  ClusTR-S's sizes, in 'ieee' and 'tf32x3';
* ClusTR-S and PaCa-S forward and backward under bf16 and fp16 autocast;
* ``with_cp`` gradients; mmcv's ``nms`` and ``RoIAlign`` CUDA vs CPU;
* one Mask R-CNN iteration through ``tools/train.py`` and
  ``tools/dist_train.sh CONFIG 1`` over NCCL;
* the CUDA side of every test that the CPU-only checks skip where CUDA is
  present (``map_location='cuda'``, ``--amp`` on a GPU, the benchmark's and
  nan_check's GPU modes).
"""
import json

import pytest
import torch
from conftest import free_port, run_tool
from fused_cases import (EXACT_224, ID_SLACK_PCT, WINDOW_800,
                         fused_agreement, needs_triton, windows)
from mmengine.registry import MODELS

import clustr_mm  # noqa: F401

MASK_RCNN = 'configs/clustr/mask-rcnn_clustr-t_fpn_embedded-coco.py'
PACA_CLS = 'configs/paca/paca-t_embedded-imagenet.py'
ONE_ITER = ['train_cfg.max_epochs=1', 'train_cfg.val_interval=10',
            'train_dataloader.dataset.indices=2',
            'train_dataloader.batch_size=2']


@pytest.fixture
def ieee_matmul():
    """The reference's GEMMs in IEEE fp32 (no TF32), as it is meant."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


# --------------------------------------------------------------------------
# The fused kernels at ClusTR-S's sizes.
FUSED_CASES = {f'exact-224-{k}': (hw, None, sr, c)
               for k, (hw, c, sr) in EXACT_224.items()}
FUSED_CASES['window-800x1344-s1'] = (WINDOW_800[0], WINDOW_800[1],
                                     WINDOW_800[3], WINDOW_800[2])
# each case has at least ID_SAMPLE ids (fused_cases.ID_SLACK_PCT)
ID_SAMPLE = 12_000


@pytest.mark.cuda
@needs_triton
@pytest.mark.parametrize('prune', [False, True], ids=['full', 'pruned'])
@pytest.mark.parametrize('precision', ['ieee', 'tf32x3'])
@pytest.mark.parametrize('case', sorted(FUSED_CASES))
def test_fused_kernels_match_reference(case, precision, prune, ieee_matmul):
    """Values within the derived bound, ids equal except the reference's
    near-ties (dpc_knn_agreement), and no further from the clustering in
    fp64 than an fp32 evaluation of the same formula is (the reference, or
    it with its sums in another order: ``fused_agreement``), on at least
    ID_SAMPLE token ids (batch 2 or more); pass 2 in full and pruned.
    (Against the fp32 reference alone, 2026-11-28 on an H200, 196 x 256
    tokens: 14 ids changed in 'ieee' and 9 in 'tf32x3', all at near-ties,
    where the reordered references changed none.)"""
    from clustr_mm.ops.dpc_knn import fused
    hw, ws, sr, c = FUSED_CASES[case]
    if prune and not fused.kernel_config(torch.device('cuda'), c, precision,
                                         prune).prune_denser:
        pytest.skip(f'no pruned layout for {c} channels in {precision} on '
                    'this GPU (fused.kernel_config)')
    batch = max(2, -(-ID_SAMPLE // (hw[0] * hw[1])))
    x, counts, consts = windows(hw, ws, sr, c, batch, device='cuda')
    report = fused_agreement(x, counts, consts, precision, prune=prune)
    print(f'[agreement] {case}-{precision}-{"pruned" if prune else "full"}: '
          f'{json.dumps(report)}')
    assert report['agree'], report
    assert (report['fused_exact_pct']
            <= report['fp32_exact_pct'] + ID_SLACK_PCT), report


# --------------------------------------------------------------------------
# Mixed precision: forward and backward against fp32.
# Relative L2 error of each output map (the largest) and of all gradients
# together against fp32, batch 2 at the test's size, bounded per model and
# dtype at ~3x the largest of the H200 measurements (2026-11-26/27, and
# 2026-11-28 with today's kernels: the values beside each bound). The
# gradients of ClusTR-S exact move most between runs (its clustering sees
# other tokens under autocast, and an id that flips moves a whole cluster).
BF16, FP16 = torch.bfloat16, torch.float16
AMP_BOUNDS = {  # (outputs, gradients); measured (outputs, gradients)
    ('clustr-s-exact', BF16): (2.6e-2, 4.6e-3),  # 8.4e-3, 1.53e-3
    ('clustr-s-exact', FP16): (7.8e-3, 2.3e-3),  # 2.6e-3, 7.5e-4
    ('clustr-s-window', BF16): (2.3e-2, 2.4e-3),  # 7.6e-3, 7.9e-4
    ('clustr-s-window', FP16): (2.9e-3, 3.4e-4),  # 9.5e-4, 1.13e-4
    ('paca-s', BF16): (2.4e-2, 3.7e-3),  # 8.0e-3, 1.22e-3
    ('paca-s', FP16): (3.0e-3, 4.5e-4),  # 9.9e-4, 1.48e-4
}
AMP_MODELS = {
    'clustr-s-exact': dict(type='ClusTR', arch='small'),
    'clustr-s-window': dict(type='ClusTR', arch='small',
                            clustering_mode='window', window_size=8),
    'paca-s': dict(type='PaCaViT', arch='small'),
}


def amp_errors(name, device, dtype, size, batch=2):
    """(output errors, gradient error) of one forward + backward under
    ``dtype`` autocast against fp32, same weights and images; asserts all
    finite."""
    torch.manual_seed(0)
    model = MODELS.build(AMP_MODELS[name])
    model.init_weights()
    model = model.to(device).train()
    x = torch.randn(batch, 3, size, size, generator=torch.Generator()
                    .manual_seed(1)).to(device)
    results = []
    for amp in (False, True):
        model.zero_grad()
        torch.manual_seed(2)
        with torch.autocast(device, dtype=dtype, enabled=amp):
            outs = model(x)
            loss = sum(o.float().square().mean() for o in outs)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()
                           if p.grad is not None])
        assert all(torch.isfinite(o).all() for o in outs), (name, amp)
        assert torch.isfinite(grads).all(), (name, amp)
        results.append(([o.detach().float() for o in outs], grads))
    (ref, ref_g), (got, got_g) = results
    outs = [float((g - r).norm() / r.norm()) for r, g in zip(ref, got)]
    return outs, float((got_g - ref_g).norm() / ref_g.norm())


@pytest.mark.cuda
@pytest.mark.parametrize('device', ['cuda'])
@pytest.mark.parametrize('dtype', [BF16, FP16], ids=['bf16', 'fp16'])
@pytest.mark.parametrize('name', sorted(AMP_MODELS))
def test_amp_forward_backward_near_fp32(name, dtype, device):
    """Finite, and within AMP_BOUNDS (outputs, all gradients together) of
    fp32, at 224 (ClusTR's clustering runs the fused op there).
    ``amp_errors`` also runs on the CPU (``device='cpu'``)."""
    size = 224 if device == 'cuda' else 64
    outs, grad = amp_errors(name, device, dtype, size)
    print(f'[amp] {name} {device} {dtype}: outputs {outs}, grads {grad}')
    out_bound, grad_bound = AMP_BOUNDS[name, dtype]
    assert max(outs) < out_bound, outs
    assert grad < grad_bound, grad


def largest_difference(got, want):
    """The largest absolute difference over tensor pairs, printed beside an
    absolute bound (rtol=0) so a GPU run gives its measured value
    (docs/reliability.md)."""
    return '%.3g' % max(float((g.detach().double() - w.detach().double())
                              .abs().max()) for g, w in zip(got, want))


# --------------------------------------------------------------------------
# Gradient checkpointing.
@pytest.mark.cuda
@pytest.mark.parametrize('name', ['clustr-exact', 'clustr-window',
                                  'paca-conv'])
def test_with_cp_gradients_on_cuda(name):
    """As ``test_stage``'s CPU test. On CUDA, index_add (the cluster merge)
    sums with atomics in any order, so the recomputed forward equals the
    first up to fp32 round-off, not bitwise."""
    from test_stage import build, loss_and_grads
    plain = build(name, drop_path_rate=0.2).cuda().train()
    cp = build(name, drop_path_rate=0.2, with_cp=True).cuda().train()
    x = torch.randn(2, 3, 64, 40).cuda()
    outs, grads = loss_and_grads(plain, x)
    cp_outs, cp_grads = loss_and_grads(cp, x)
    assert set(grads) == set(cp_grads)
    print(f'[with_cp] {name}: largest differences: outputs '
          f'{largest_difference(cp_outs, outs)}, gradients '
          f'{largest_difference(cp_grads.values(), grads.values())}')
    # ~3x the largest differences an H200 measured (2026-11-28): outputs
    # 4.8e-7, gradients 3.7e-8 (ClusTR window; PaCa: 0, it has no atomics)
    for a, b in zip(outs, cp_outs):
        torch.testing.assert_close(b, a, rtol=0, atol=1.5e-6)
    for n in grads:
        torch.testing.assert_close(cp_grads[n], grads[n], rtol=0,
                                   atol=1.2e-7, msg=n)


# --------------------------------------------------------------------------
# mmcv's CUDA ops.
@pytest.mark.cuda
def test_mmcv_nms_and_roi_align_cuda_equal_cpu():
    from mmcv.ops import RoIAlign, nms
    gen = torch.Generator().manual_seed(0)
    xy = torch.rand(300, 2, generator=gen) * 200
    boxes = torch.cat([xy, xy + 10 + torch.rand(300, 2, generator=gen) * 60],
                      1)
    scores = torch.rand(300, generator=gen)
    _, keep_cpu = nms(boxes, scores, iou_threshold=0.5)
    _, keep_gpu = nms(boxes.cuda(), scores.cuda(), iou_threshold=0.5)
    assert 10 < len(keep_cpu) < 300
    assert torch.equal(keep_gpu.cpu(), keep_cpu)
    feat = torch.randn(2, 8, 32, 32, generator=gen)
    rois = torch.cat([torch.randint(0, 2, (40, 1), generator=gen).float(),
                      boxes[:40] / 8], 1)
    align = RoIAlign((7, 7), spatial_scale=0.25, sampling_ratio=2,
                     aligned=True)
    outs = []
    for device in ('cpu', 'cuda'):
        # detach: on the CPU `.to` returns `feat` itself, which must not
        # become a grad-requiring leaf that the CUDA copy would hang off
        f = feat.to(device).detach().requires_grad_()
        out = align(f, rois.to(device))
        out.square().sum().backward()
        outs.append((out.detach().cpu(), f.grad.cpu()))
    print(f'[mmcv] RoIAlign CUDA vs CPU, largest differences: outputs '
          f'{largest_difference([outs[1][0]], [outs[0][0]])}, input '
          f'gradients {largest_difference([outs[1][1]], [outs[0][1]])}')
    # ~3x the largest differences an H200 measured (2026-11-28): outputs
    # 1.64e-6, input gradients 1.75e-4 (CUDA sums them with atomics)
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=0, atol=5e-6)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=0, atol=5.2e-4)


# --------------------------------------------------------------------------
# The tools on a GPU.
@pytest.mark.slow
@pytest.mark.cuda
def test_mask_rcnn_iteration_through_train_py(tiny_data, tmp_path):
    out = run_tool(['tools/train.py', MASK_RCNN, '--work-dir', str(tmp_path),
                    '--cfg-options', *ONE_ITER]).stdout
    assert (tmp_path / 'epoch_1.pth').exists(), out[-3000:]
    ckpt = torch.load(tmp_path / 'epoch_1.pth', map_location='cpu',
                      weights_only=False)
    assert ckpt['meta']['iter'] == 1, ckpt['meta']


@pytest.mark.slow
@pytest.mark.cuda
def test_dist_train_one_gpu_over_nccl(tiny_data, tmp_path):
    out = run_tool(['bash', 'tools/dist_train.sh', MASK_RCNN, '1',
                    '--work-dir', str(tmp_path), '--cfg-options',
                    *ONE_ITER], python=False,
                   env={'PORT': str(free_port())}).stdout
    assert 'launcher pytorch, world size 1 (nccl)' in out, out[-3000:]
    assert (tmp_path / 'epoch_1.pth').exists()


@pytest.mark.cuda
def test_cuda_map_location(tmp_path):
    """The GPU side of test_official_weights'
    test_cuda_map_location_without_cuda."""
    from clustr_mm.checkpoints.loading import load_checkpoint_file
    path = tmp_path / 'w.pth'
    torch.save({'w': torch.ones(1)}, path)
    assert load_checkpoint_file(str(path), map_location='cuda')[
        'w'].device.type == 'cuda'


@pytest.mark.cuda
def test_amp_wrapper_on_a_gpu():
    """The GPU side of test_reliability's test_cpu_amp_wrapper_trains_in_bf16:
    MMEngine's AmpOptimWrapper, fp16 autocast with dynamic loss scaling by
    default, bf16 on request."""
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper

    from clustr_mm.engine.amp import use_amp
    for dtype, expected in ((None, torch.float16),
                            ('bfloat16', torch.bfloat16)):
        model = torch.nn.Linear(4, 2).cuda()
        cfg = Config(dict(optim_wrapper=dict(
            type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1))))
        assert use_amp(cfg, dtype) == 'AmpOptimWrapper'
        wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
        before = model.weight.detach().clone()
        with wrapper.optim_context(model):
            out = model(torch.randn(3, 4).cuda())
        assert out.dtype == expected
        wrapper.update_params(out.float().square().mean())
        assert model.weight.dtype == torch.float32
        assert not torch.equal(model.weight, before)


@pytest.mark.slow
@pytest.mark.cuda
def test_amp_trains_on_a_gpu(tiny_data, tmp_path):
    """The GPU side of test_tools' test_amp_trains_in_bf16_on_the_cpu."""
    out = run_tool(['tools/train.py', PACA_CLS, '--amp', '--work-dir',
                    str(tmp_path), '--cfg-options', 'train_cfg.max_epochs=1',
                    'train_cfg.val_interval=100']).stdout
    assert '[train] --amp: AmpOptimWrapper' in out, out[-3000:]
    assert (tmp_path / 'epoch_1.pth').exists()


@pytest.mark.slow
@pytest.mark.cuda
def test_benchmark_on_a_gpu(tmp_path):
    """The GPU side of test_analysis'
    test_benchmark_cuda_without_gpu_fails_clearly, with the training step
    and the profile: ClusTR-S's clustering runs the fused op (its row's
    precision is tf32x3), the profile's table lists CUDA kernels only (no
    aten op) and times each stage and its clustering. (The rows are read
    from --out: the parent prints a table, the children's RESULT lines stay
    in the parent.)"""
    out = tmp_path / 'bench.json'
    proc = run_tool(['tools/analysis/benchmark.py', '--device', 'cuda',
                     '--models', 'paca-t', 'clustr-s-exact', '--sizes', '64',
                     '--runs', '2', '--amp', 'bf16', '--train-step',
                     '--profile', '--out', str(out)], timeout=600)
    rows = json.loads(out.read_text())
    assert [r['model'] for r in rows] == ['paca-t', 'clustr-s-exact'], \
        proc.stdout[-3000:]
    for r in rows:
        assert 'error' not in r, r
        assert r['device'] == 'cuda' and r['infer_img_s'] > 0, r
        assert r['driver'] and r['triton'], r  # the row's provenance
        assert r['train_img_s'] > 0 and r['peak_train_mem_mb'] > 0, r
        names = [e['name'] for e in r['profile']['top']]
        assert not any(n.startswith('aten::') for n in names), names
        assert {f'stage{i}' for i in (1, 2, 3, 4)} <= set(
            r['profile']['ranges']), r['profile']['ranges']
    clustr = rows[1]
    assert clustr['precision'] == 'tf32x3', clustr
    assert clustr['profile']['ranges']['stage1.clustering']['ms'] > 0


@pytest.mark.slow
@pytest.mark.cuda
def test_nan_check_fp16_on_a_gpu(tiny_data, tmp_path):
    """The GPU side of test_reliability's
    test_nan_check_refuses_fp16_without_gpu."""
    out = run_tool(['tools/analysis/nan_check.py',
                    'configs/clustr/clustr-t_embedded-imagenet.py', '--amp',
                    'fp16', '--iters', '10', '--work-dir',
                    str(tmp_path)]).stdout
    line = [ln for ln in out.splitlines() if ln.startswith('[nan-check] {')]
    result = json.loads(line[-1].split(' ', 1)[1])
    assert result['ok'] and result['checked'] == 10, result
    assert result['linear_dtype'] == 'torch.float16', result
