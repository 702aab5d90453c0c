"""Official PaCa-ViT weights load wherever weights reach a model, by URL.

Files in the official layouts (a timm classifier state dict, one with a
training script's extra entries, an mmdet Mask R-CNN and an mmseg UperNet
checkpoint) are made from narrow models of ours with the inverse key mapping
of test_paca.py and served by a local HTTP server; every entry point must
load them and reproduce the source model's outputs. That mapping is not
taken on trust: tests/test_release_layouts.py checks that it writes exactly
the keys and shapes of every release file's official model (listed from the
official code in tests/data/paca_release_keys.json), and loads files made
from that list alone. Downloads that fail leave nothing in the cache and say
how to place the file by hand.
"""
import argparse
import collections
import hashlib
import http.server
import io
import multiprocessing
import os
import pickle
import re
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, run_tool
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner import Runner
from test_paca import ARCH, CLUSTERS, randomise_bn, to_official

import clustr_mm  # noqa: F401  (registers models and the checkpoint loader)
from clustr_mm.checkpoints import cache_path, download_checkpoint
from clustr_mm.checkpoints.coverage_hook import PartialLoadError
from clustr_mm.checkpoints.download import DownloadError
from clustr_mm.checkpoints.loading import load_checkpoint_file

CLS_CFG = 'configs/paca/paca-t_embedded-imagenet.py'
DET_CFG = 'configs/paca/mask-rcnn_paca-t_fpn_ms-1x_coco.py'
SEG_CFG = 'configs/paca/upernet_paca-t_embedded-ade20k.py'
DIMS = list(ARCH['embed_dims'])
BACKBONE = dict(type='PaCaViT', arch=ARCH, clustering='conv',
                num_clusters=CLUSTERS, init_cfg=None)


# --- a local server for the official files ---------------------------------
class Served:
    """What the server hands out, and how often each path was asked for."""

    def __init__(self, port):
        self.base = f'http://127.0.0.1:{port}'
        self.files, self.truncated = {}, set()
        self.hits = collections.Counter()
        self.delay = 0.0

    def put(self, path, data, truncated=False):
        self.files[path] = data
        if truncated:
            self.truncated.add(path)
        return self.base + path

    def put_checkpoint(self, path, obj):
        return self.put(path, _bytes(obj))


def _bytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.fixture(scope='module')
def server():
    state = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            served = state['served']
            served.hits[self.path] += 1
            data = served.files.get(self.path)
            if data is None:
                self.send_error(404, 'Not Found')
                return
            time.sleep(served.delay)
            self.send_response(200)
            self.send_header('Content-Length', str(len(data)))
            self.end_headers()
            if self.path in served.truncated:  # the connection drops
                data = data[:len(data) // 2]
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    state['served'] = Served(httpd.server_address[1])
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    guard = threading.Timer(900, httpd.shutdown)  # never outlives a hung run
    guard.daemon = True
    guard.start()
    yield state['served']
    guard.cancel()
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def torch_home(tmp_path, monkeypatch):
    home = tmp_path / 'torch_home'
    monkeypatch.setenv('TORCH_HOME', str(home))
    return home


@pytest.fixture
def conversions(monkeypatch):
    """The loader's conversion log lines (MMEngine's logger does not go
    through pytest's capture)."""
    from clustr_mm.checkpoints import official
    lines = []

    def record(msg, *args, **kwargs):
        lines.append(msg)
        original(msg, *args, **kwargs)

    original = official.print_log
    monkeypatch.setattr(official, 'print_log', record)
    return lines


def cache_files(home):
    root = Path(home)
    return sorted(str(p.relative_to(root)) for p in root.rglob('*')
                  if p.is_file()) if root.exists() else []


# --- models and their official files ----------------------------------------
def classifier_cfg():
    cfg = Config.fromfile(str(ROOT / CLS_CFG))
    cfg.model.backbone = dict(BACKBONE)
    cfg.model.head.in_channels = DIMS[-1]
    return cfg


def detector_cfg():
    cfg = Config.fromfile(str(ROOT / DET_CFG))
    cfg.model.backbone = dict(BACKBONE)
    cfg.model.neck.in_channels = DIMS
    for t in cfg.test_pipeline:
        if t['type'] == 'Resize':
            t['scale'] = (160, 128)
    return cfg


def segmentor_cfg():
    cfg = Config.fromfile(str(ROOT / SEG_CFG))
    cfg.model.backbone = dict(BACKBONE)
    cfg.model.decode_head.in_channels = DIMS
    cfg.model.decode_head.channels = 32
    cfg.model.auxiliary_head.in_channels = DIMS[2]
    cfg.model.auxiliary_head.channels = 16
    return cfg


def build(cfg):
    from mmengine.registry import MODELS
    init_default_scope(cfg.default_scope)
    model = MODELS.build(cfg.model)
    model.init_weights()
    with torch.no_grad():  # trained-looking weights: no zero biases
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    randomise_bn(model)
    return model.eval()


def timm_file(model, extras=False):
    """The timm release layout of an ImageClassifier (raw state dict)."""
    state = to_official(model.backbone.state_dict(), 'conv')
    state['head.weight'] = model.head.fc.weight.detach().clone()
    state['head.bias'] = model.head.fc.bias.detach().clone()
    if not extras:
        return state
    # what timm's train.py saves around it
    return {'epoch': 299, 'arch': 'pacavit_tiny_p2cconv_100_0',
            'state_dict': state, 'version': 2,
            'optimizer': {'state': {}, 'param_groups': [{'lr': 1e-5}]},
            'args': argparse.Namespace(model='pacavit_tiny', lr=1e-3,
                                       input_size=[3, 224, 224]),
            'metric': np.float64(80.9), 'best_epoch': np.int64(297)}


def downstream_file(model, classes):
    """An official mmdet / mmseg checkpoint: timm backbone keys under
    ``backbone.``, neck and heads as the library names them."""
    state = {f'backbone.{k}': v for k, v in
             to_official(model.backbone.state_dict(), 'conv').items()}
    state.update({k: v for k, v in model.state_dict().items()
                  if not k.startswith('backbone.')})
    return {'meta': {'CLASSES': classes, 'epoch': 12},
            'state_dict': state,
            'optimizer': {'state': {}, 'param_groups': [{'lr': 1e-6}]}}


def rel_diff(a, b):
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-12))


def assert_reproduces(a, b):
    a, b = list(a), list(b)
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert rel_diff(u, v) < 1e-5


@pytest.fixture(scope='module')
def cls_model():
    torch.manual_seed(0)
    return build(classifier_cfg())


IMAGES = torch.randn(2, 3, 64, 80)


# --- Pretrained init by URL -------------------------------------------------
@pytest.mark.torch21
@pytest.mark.parametrize('extras', [False, True], ids=['bare', 'train-script'])
@pytest.mark.parametrize('prefix', ['backbone.', 'backbone', None])
def test_pretrained_init_by_url(server, cls_model, extras, prefix, torch_home,
                                conversions):
    url = server.put_checkpoint(f'/rel/{extras}/IMNET_224_pacavit.pth',
                                timm_file(cls_model, extras))
    init_cfg = dict(type='Pretrained', checkpoint=url)
    if prefix:
        init_cfg['prefix'] = prefix
    init_default_scope('mmpretrain')
    from mmengine.registry import MODELS
    backbone = MODELS.build(dict(BACKBONE, init_cfg=init_cfg))
    backbone.init_weights()
    with torch.no_grad():
        assert_reproduces(backbone.eval()(IMAGES),
                          cls_model.backbone(IMAGES))
    log = '\n'.join(conversions)
    assert 'converted official PaCa-ViT weights (timm ImageNet classifier)' \
        in log
    if extras:  # the training script's entries are named, not loaded
        assert 'entries not loaded: arch, args, best_epoch, epoch, metric, ' \
            'optimizer, version' in log
    assert cache_files(torch_home) == [os.path.relpath(
        cache_path(url), torch_home)]


def test_teacher_release_file(server, conversions):
    """The ConvMixer-teacher release (IMNET_224_pacavit_convmixer_*):
    teacher keys mapped, its fixed blur kernels dropped and said so."""
    from mmengine.registry import MODELS
    teacher = dict(BACKBONE, clustering='teacher', num_clusters=(5, 6, 7, 8))
    source = MODELS.build(teacher)
    source.init_weights()
    randomise_bn(source)
    state = to_official(source.state_dict(), 'teacher')
    state['head.weight'] = torch.randn(10, DIMS[-1])
    state['head.bias'] = torch.randn(10)
    url = server.put_checkpoint('/rel/IMNET_224_pacavit_convmixer_tiny.pth',
                                state)
    target = MODELS.build(dict(teacher, init_cfg=dict(
        type='Pretrained', checkpoint=url, prefix='backbone.')))
    target.init_weights()
    with torch.no_grad():
        assert_reproduces(target.eval()(IMAGES), source.eval()(IMAGES))
    assert '3 fixed blur kernels dropped' in conversions[-1]


# --- load_from, the coverage check -------------------------------------------
def _runner(model, tmp_path, load_from, **cfg):
    return Runner(model=model, work_dir=str(tmp_path / 'wd'),
                  load_from=load_from,
                  custom_hooks=[dict(type='CheckpointCoverageHook')],
                  cfg=dict(load_from=load_from, **cfg))


def test_load_from_url_classifier(server, cls_model, tmp_path):
    url = server.put_checkpoint('/rel/cls/IMNET_224_pacavit_tiny.pth',
                                timm_file(cls_model, extras=True))
    init_default_scope('mmpretrain')
    target = build(classifier_cfg())
    _runner(target, tmp_path, url).load_or_resume()
    with torch.no_grad():
        assert_reproduces(target(IMAGES, mode='tensor'),
                          cls_model(IMAGES, mode='tensor'))


def test_load_from_url_mmdet_mask_rcnn(server, tmp_path, conversions):
    torch.manual_seed(1)
    source = build(detector_cfg())
    url = server.put_checkpoint(
        '/rel/mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco.pth',
        downstream_file(source, ['person', 'car']))
    target = build(detector_cfg())
    _runner(target, tmp_path, url).load_or_resume()
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        feats_a, feats_b = source.extract_feat(x), target.extract_feat(x)
        assert_reproduces(feats_b, feats_a)
        assert_reproduces(target.rpn_head(feats_b)[0],
                          source.rpn_head(feats_a)[0])
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key
    assert 'converted official PaCa-ViT weights (mmdet detector)' in \
        conversions[-1]


def test_load_from_url_mmseg_upernet(server, tmp_path):
    torch.manual_seed(2)
    source = build(segmentor_cfg())
    url = server.put_checkpoint(
        '/rel/upernet_pacavit_tiny_p2cconv_100_0_512x512_160k_ade20k.pth',
        downstream_file(source, ['wall', 'floor']))
    converted = load_checkpoint_file(url)
    assert converted['meta']['CLASSES'] == ['wall', 'floor']
    assert 'decode_head.conv_seg.weight' in converted['state_dict']
    target = build(segmentor_cfg())
    _runner(target, tmp_path, url).load_or_resume()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert_reproduces([target(x, mode='tensor')],
                          [source(x, mode='tensor')])


def _clustr_classifier_file(path):
    init_default_scope('mmpretrain')
    from mmengine.registry import MODELS
    other = MODELS.build(dict(
        type='ImageClassifier',
        backbone=dict(type='ClusTR', arch=dict(
            embed_dims=(8, 16, 32, 64), depths=(1, 1, 1, 1),
            num_heads=(1, 1, 2, 4), mlp_ratios=(2, 2, 2, 2))),
        neck=dict(type='GlobalAveragePooling'),
        head=dict(type='LinearClsHead', num_classes=10, in_channels=64)))
    torch.save({'state_dict': other.state_dict(), 'meta': {'epoch': 1}},
               path)


def test_partial_load_refused_and_overridable(tmp_path):
    wrong = tmp_path / 'epoch_1.pth'
    _clustr_classifier_file(wrong)
    target = build(classifier_cfg())
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(PartialLoadError) as err:
        _runner(target, tmp_path, str(wrong)).load_or_resume()
    message = str(err.value)
    assert re.search(r'epoch_1\.pth leaves \d+ of \d+ tensors of '
                     r'ImageClassifier \(\d+\.\d% of its weights\) unloaded',
                     message), message
    assert 'with another shape' in message and 'loaded' in message
    assert '--allow-partial-load' in message
    assert 'allow_partial_load = True' in message
    for key, value in target.state_dict().items():  # nothing was copied
        assert torch.equal(value, before[key]), key
    # the override: loads what fits, leaves the rest, warns with the counts
    runner = _runner(target, tmp_path, str(wrong), allow_partial_load=True)
    warnings = []
    runner.logger.warning = warnings.append
    runner.load_or_resume()
    assert any(re.search(r'epoch_1\.pth leaves \d+ of \d+ tensors .* '
                         r'unloaded.* Loading it anyway '
                         r'\(allow_partial_load\)', w) for w in warnings), \
        warnings
    source = torch.load(wrong, map_location='cpu')['state_dict']
    loaded = 0
    for key, value in target.state_dict().items():
        if key in source and source[key].shape == value.shape:
            assert torch.equal(value, source[key]), key
            loaded += 1
        else:
            assert torch.equal(value, before[key]), key
    assert loaded > 0  # the classifier heads have the same shape
    target.load_state_dict(before)
    # a file in neither our nor the official layout: the keys expected
    unrelated = tmp_path / 'resnet.pth'
    torch.save({'conv1.weight': torch.zeros(8, 3, 7, 7)}, unrelated)
    with pytest.raises(PartialLoadError) as err:
        _runner(target, tmp_path, str(unrelated)).load_or_resume()
    message = str(err.value)
    assert 'None of its keys fit' in message
    assert 'backbone.stem.conv1.weight' in message
    assert 'patch_embed.proj.0.weight' in message


def test_coverage_check_accepts_a_complete_checkpoint(tmp_path, cls_model):
    path = tmp_path / 'ours.pth'
    torch.save({'state_dict': cls_model.state_dict()}, path)
    target = build(classifier_cfg())
    _runner(target, tmp_path, str(path)).load_or_resume()
    for key, value in cls_model.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key


# --- downloads ---------------------------------------------------------------
@pytest.mark.torch21
def test_same_file_name_different_urls(server, torch_home):
    a = server.put_checkpoint('/a/epoch_300.pth', {'w': torch.ones(2)})
    c = server.put_checkpoint('/c/epoch_300.pth', {'w': torch.zeros(2)})
    assert load_checkpoint_file(a)['w'].tolist() == [1, 1]
    assert load_checkpoint_file(c)['w'].tolist() == [0, 0]
    assert load_checkpoint_file(a)['w'].tolist() == [1, 1]  # from the cache
    assert server.hits['/a/epoch_300.pth'] == 1
    assert server.hits['/c/epoch_300.pth'] == 1
    assert cache_path(a) != cache_path(c)
    assert Path(cache_path(a)).name == 'epoch_300.pth'
    assert len(cache_files(torch_home)) == 2
    umask = os.umask(0)
    os.umask(umask)  # readable by the group, as MMEngine's own files are
    assert os.stat(cache_path(a)).st_mode & 0o777 == 0o666 & ~umask


def _expect_clean_failure(url, torch_home, match):
    with pytest.raises(DownloadError, match=match) as err:
        load_checkpoint_file(url)
    message = str(err.value)
    path = cache_path(url)
    assert url in message and path in message
    assert 'copy it to' in message  # how to place it by hand
    folder = os.path.dirname(path)  # nothing half-written, no lock left
    assert not os.path.exists(folder) or os.listdir(folder) == []
    return message


@pytest.mark.torch21
def test_404(server, torch_home):
    url = server.base + '/missing/IMNET_224_pacavit_tiny_p2cconv_100_0.pth'
    _expect_clean_failure(url, torch_home, 'HTTP 404')


@pytest.mark.torch21
def test_truncated_download(server, torch_home):
    url = server.put('/trunc/weights.pth', _bytes({'w': torch.ones(1000)}),
                     truncated=True)
    _expect_clean_failure(url, torch_home, 'truncated')


@pytest.mark.torch21
def test_offline(torch_home):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    url = f'http://127.0.0.1:{port}/pacavit/IMNET_224_pacavit_tiny.pth'
    _expect_clean_failure(url, torch_home, 'no network')


@pytest.mark.torch21
def test_torch_hub_hash_prefix_checked_when_asked(server, torch_home):
    data = _bytes({'w': torch.ones(3)})
    good = hashlib.sha256(data).hexdigest()[:8]
    url = server.put(f'/h/weights-{good}.pth', data)
    assert load_checkpoint_file(url)['w'].tolist() == [1, 1, 1]
    bad = server.put('/h/weights-0badc0de.pth', data)
    with pytest.raises(DownloadError, match='does not match the hash'):
        load_checkpoint_file(bad, check_hash=True)
    assert not os.path.exists(cache_path(bad))
    # unasked (torch.hub's and MMEngine's default), a dated name such as
    # clustr-t-20240101.pth is a name, not a hash
    dated = server.put('/h/clustr-t-20240101.pth', data)
    assert load_checkpoint_file(dated)['w'].tolist() == [1, 1, 1]


@pytest.mark.torch21
def test_url_without_file_name(server):
    with pytest.raises(ValueError, match='names no file'):
        load_checkpoint_file(server.base + '/releases/')


class CreatesFileOnLoad:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}', ))


@pytest.mark.torch21
def test_crafted_pickle_by_url(server, tmp_path, torch_home):
    marker = tmp_path / 'pwned'
    url = server.put_checkpoint('/evil/IMNET_224_pacavit_tiny.pth',
                                {'state_dict': {'w': torch.ones(1)},
                                 'x': CreatesFileOnLoad(marker)})
    with pytest.raises(pickle.UnpicklingError,
                       match=r'refusing to load .*system'):
        load_checkpoint_file(url)
    assert not marker.exists()
    assert cache_files(torch_home) == []  # the unusable copy was removed


def _download_in_child(url, queue):
    queue.put(download_checkpoint(url))


@pytest.mark.slow  # forks three processes
@pytest.mark.torch21
def test_concurrent_processes_download_once(server, torch_home):
    url = server.put_checkpoint('/dist/epoch_300.pth', {'w': torch.ones(4)})
    server.delay = 1.0  # every process asks while the first one downloads
    ctx = multiprocessing.get_context('fork')
    queue = ctx.Queue()
    procs = [ctx.Process(target=_download_in_child, args=(url, queue))
             for _ in range(3)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
    finally:
        server.delay = 0.0
    assert [p.exitcode for p in procs] == [0, 0, 0]
    paths = {queue.get(timeout=5) for _ in procs}
    assert paths == {cache_path(url)}
    assert server.hits['/dist/epoch_300.pth'] == 1


# --- clear errors -----------------------------------------------------------
@pytest.mark.torch21
def test_checkpoint_path_errors(tmp_path):
    with pytest.raises(IsADirectoryError, match='is a directory'):
        load_checkpoint_file(str(tmp_path))
    text = tmp_path / 'notes.pth'
    text.write_text('epoch_12.pth is the best one\n')
    with pytest.raises(ValueError, match=r'notes\.pth.*a text file'):
        load_checkpoint_file(str(text))
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        load_checkpoint_file(str(tmp_path / 'nope.pth'))


@pytest.mark.skipif(torch.cuda.is_available(), reason='needs a CPU-only torch')
def test_cuda_map_location_without_cuda(tmp_path):
    path = tmp_path / 'w.pth'
    torch.save({'w': torch.ones(1)}, path)
    with pytest.raises(ValueError, match=r"map_location='cuda'.*w\.pth.*"
                       r"torch\.cuda\.is_available\(\) is False"):
        load_checkpoint_file(str(path), map_location='cuda')


@pytest.mark.parametrize('init_cfg, match', [
    (dict(type='Pretrained'), "needs checkpoint=PATH_OR_URL"),
    (dict(checkpoint='w.pth'),
     r"has no type.*model\.backbone\.init_cfg\.type=Pretrained"),
])
def test_bad_pretrained_init_cfg(init_cfg, match):
    from mmengine.registry import MODELS
    backbone = MODELS.build(dict(BACKBONE, init_cfg=init_cfg))
    with pytest.raises(ValueError, match=match):
        backbone.init_weights()


def test_neither_layout_names_expected_keys(tmp_path):
    path = tmp_path / 'resnet.pth'
    torch.save({'conv1.weight': torch.zeros(8, 3, 7, 7)}, path)
    from mmengine.registry import MODELS
    backbone = MODELS.build(dict(BACKBONE, init_cfg=dict(
        type='Pretrained', checkpoint=str(path))))
    with pytest.raises(RuntimeError) as err:
        backbone.init_weights()
    message = str(err.value)
    assert "'conv1.weight'" in message and 'stem.conv1.weight' in message
    assert 'patch_embed.proj.0.weight' in message  # the official layout


def test_unknown_keys_in_an_official_file_are_an_error(cls_model):
    from clustr_mm.checkpoints import convert_checkpoint
    state = timm_file(cls_model)
    state['stage1.0.attn.relative_bias'] = torch.zeros(3)
    with pytest.raises(ValueError, match='relative_bias'):
        convert_checkpoint(state, 'x.pth')


def _clustr_converter(argv, monkeypatch):
    import runpy
    monkeypatch.setattr('sys.argv', ['clustr_official_to_mm.py', *argv])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(ROOT / 'tools/model_converters/'
                           'clustr_official_to_mm.py'), run_name='__main__')
    return str(exit_.value.code)


def test_clustr_converter_refuses_ours_and_text(tmp_path, monkeypatch):
    ours = tmp_path / 'epoch_1.pth'
    _clustr_classifier_file(ours)
    message = _clustr_converter([str(ours), str(tmp_path / 'o.pth')],
                                monkeypatch)
    assert 'already a clustr_mm checkpoint' in message, message
    text = tmp_path / 'readme.pth'
    text.write_text('not weights')
    message = _clustr_converter([str(text), str(tmp_path / 'o.pth')],
                                monkeypatch)
    assert 'a text file' in message and 'readme.pth' in message, message
    assert not (tmp_path / 'o.pth').exists()


def test_paca_converter_keeps_detector_heads(server, tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'paca_official_to_mm',
        ROOT / 'tools/model_converters/paca_official_to_mm.py')
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    torch.manual_seed(3)
    source = build(detector_cfg())
    src = tmp_path / 'mask_rcnn_official.pth'
    torch.save(downstream_file(source, ['person']), src)
    assert cli.main([str(src), str(tmp_path / 'mm.pth')]) == 0
    saved = torch.load(tmp_path / 'mm.pth', weights_only=True)
    assert saved['meta']['converted_from']['layout'] == \
        'official PaCa-ViT mmdet detector'
    for key, value in source.state_dict().items():
        assert torch.equal(saved['state_dict'][key], value), key


# --- Inferencers and tools/test.py --------------------------------------------
IMAGE = str(ROOT / 'data/coco/val2017/000000001001.jpg')


@pytest.mark.slow
def test_inferencers_by_url(server, tiny_data, tmp_path):
    """mmpretrain, mmdet and mmseg Inferencers with weights=URL give the
    outputs of the same model loaded from its own (clustr_mm) checkpoint."""
    from mmdet.apis import DetInferencer
    from mmpretrain import ImageClassificationInferencer
    from mmseg.apis import MMSegInferencer
    cases = [
        (classifier_cfg, lambda m: timm_file(m), ImageClassificationInferencer,
         'pretrained', lambda r: torch.as_tensor(r[0]['pred_scores'])),
        (detector_cfg, lambda m: downstream_file(m, ['a', 'b']), DetInferencer,
         'weights', lambda r: torch.as_tensor(r['predictions'][0]['scores'])),
        (segmentor_cfg, lambda m: downstream_file(m, ['a', 'b']),
         MMSegInferencer, 'weights',
         lambda r: torch.as_tensor(r['predictions']).float()),
    ]
    for i, (make_cfg, official, inferencer, arg, result) in enumerate(cases):
        torch.manual_seed(10 + i)
        cfg = make_cfg()
        source = build(cfg)
        url = server.put_checkpoint(f'/inf/{i}/official.pth', official(source))
        ours = tmp_path / f'ours_{i}.pth'
        torch.save({'state_dict': source.state_dict()}, ours)
        outs = []
        for weights in (url, str(ours)):
            infer = inferencer(model=cfg, device='cpu', **{arg: weights})
            outs.append(result(infer(IMAGE, return_datasamples=False)
                               if inferencer is not MMSegInferencer else
                               infer(IMAGE)))
        assert outs[0].numel() > 0
        assert rel_diff(outs[1], outs[0]) < 1e-5


def _test_tool():
    import importlib.util
    spec = importlib.util.spec_from_file_location('clustr_mm_test_tool',
                                                  ROOT / 'tools/test.py')
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


@pytest.mark.slow
def test_test_tool_with_url_and_partial_load(server, tiny_data, tmp_path,
                                             monkeypatch):
    """tools/test.py CONFIG URL (a separate process, as a user runs it)
    converts the official file and gives the metrics of the same model
    loaded from our own checkpoint; another model's checkpoint is refused
    with the override named, and the override evaluates it."""
    torch.manual_seed(4)
    source = build(Config.fromfile(str(ROOT / CLS_CFG)))
    url = server.put_checkpoint('/tool/IMNET_224_pacavit_tiny.pth',
                                timm_file(source, extras=True))
    few = ['--cfg-options', 'test_dataloader.dataset.indices=8']
    run = run_tool(['tools/test.py', CLS_CFG, url, '--work-dir',
                    str(tmp_path / 'wd0'), *few],
                   env={'TORCH_HOME': str(tmp_path / 'home')})
    assert 'converted official PaCa-ViT weights (timm ImageNet classifier)' \
        in run.stdout

    monkeypatch.chdir(ROOT)
    tool = _test_tool()
    ours = tmp_path / 'ours.pth'
    torch.save({'state_dict': source.state_dict()}, ours)
    metrics = tool.main([CLS_CFG, str(ours), '--work-dir',
                         str(tmp_path / 'wd1'), *few])
    printed = re.search(r'\[test\] .*', run.stdout).group(0)
    assert printed == f'[test] {CLS_CFG}: ' + ', '.join(
        f'{k}={v:.4f}' if isinstance(v, float) else f'{k}={v}'
        for k, v in metrics.items())

    wrong = tmp_path / 'clustr_epoch_1.pth'
    _clustr_classifier_file(wrong)
    with pytest.raises(PartialLoadError, match='--allow-partial-load'):
        tool.main([CLS_CFG, str(wrong), '--work-dir', str(tmp_path / 'wd2'),
                   *few])
    assert tool.main([CLS_CFG, str(wrong), '--allow-partial-load',
                      '--work-dir', str(tmp_path / 'wd3'), *few])
