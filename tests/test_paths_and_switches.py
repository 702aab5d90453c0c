"""Paths and switches mean what they say (issue 56, class 3): each flag or
option whose value used to be silently reinterpreted, or checked only after
the work, is refused or resolved when it is read, naming the flag and the
value. In-process only (the fast tier): the tools' ``main`` / ``parse_args``
and the functions they call."""
import os
import time
from types import SimpleNamespace

import pytest
import torch
from mmengine.config import Config
from torch import nn

import clustr_mm  # noqa: F401
from clustr_mm.checkpoints.coverage_hook import (
    PartialLoadError, _refuse_partial, add_coverage_check, load_coverage)
from clustr_mm.engine.launch import load_config
from clustr_mm.engine.options import check_cfg_options
from clustr_mm.registry import switch_value

from conftest import ROOT, load_tool

CONFIG = 'configs/clustr/clustr-t_embedded-imagenet.py'


def _refused(capsys, call, *needles):
    with pytest.raises(SystemExit) as stop:
        call()
    text = f'{stop.value.code}\n{capsys.readouterr().err}'
    assert stop.value.code not in (0, None), text
    for needle in needles:
        assert needle in text, text


@pytest.fixture
def train_tool(monkeypatch):
    monkeypatch.chdir(ROOT)
    return load_tool('train', '.')


def _config(train_tool, *argv):
    return load_config(train_tool.parse_args([CONFIG, *argv]))


# -- --work-dir ----------------------------------------------------------------
def test_an_empty_work_dir_is_refused_naming_the_flag(capsys, train_tool,
                                                      tmp_path):
    """``--work-dir ""`` wrote the checkpoint, config and logs into the
    current directory; every tool that takes --work-dir refuses it."""
    empty = ("argument --work-dir: '' is empty: MMEngine would write the "
             'checkpoints, the dumped config and the logs into the current '
             'directory')
    _refused(capsys, lambda: train_tool.parse_args(
        [CONFIG, '--work-dir', '']), empty)
    _refused(capsys, lambda: load_tool('test', '.').parse_args(
        [CONFIG, 'x.pth', '--work-dir', ' ']), "argument --work-dir: ' '")
    for tool in ('nan_check', 'memory_soak', 'train_speed'):
        _refused(capsys, lambda: load_tool(tool).main(
            [CONFIG, '--work-dir', '']), empty)
    a_file = tmp_path / 'notes.txt'
    a_file.write_text('x')
    _refused(capsys, lambda: train_tool.parse_args(
        [CONFIG, '--work-dir', str(a_file)]),
        f'argument --work-dir: {str(a_file)!r} is a file, not a folder')
    # the same value given through the config
    with pytest.raises(ValueError, match=r"--cfg-options work_dir='' is "
                       'empty: MMEngine would write'):
        _config(train_tool, '--cfg-options', 'work_dir=')


# -- --resume DIR --------------------------------------------------------------
def _checkpoint(path, seed=7, iteration=4):
    torch.save(dict(meta=dict(iter=iteration, epoch=1, seed=seed),
                    state_dict={}), path)
    return str(path)


def _resume(train_tool, choice):
    cfg = Config(dict(work_dir='unused', custom_hooks=[]))
    train_tool.resume(cfg, choice)
    return cfg


def test_resume_of_a_folder_takes_its_latest_checkpoint(train_tool,
                                                        tmp_path):
    """``--resume DIR`` said there was no checkpoint at DIR; now DIR's
    latest as ``--resume`` alone takes it in the work dir (the newest
    epoch_N/iter_N, the one last_checkpoint names), else the newest .pth; none or an ambiguous choice is
    refused naming the folder."""
    run = tmp_path / 'run'
    run.mkdir()
    _checkpoint(run / 'epoch_1.pth', seed=1)
    latest = _checkpoint(run / 'epoch_2.pth', seed=2)
    cfg = _resume(train_tool, str(run))
    assert (cfg.load_from, cfg.resume, cfg.randomness.seed) == (latest, True,
                                                                2)
    # MMEngine's pointer names the latest (as for --resume alone, a newer
    # epoch_N, left by a run killed before it moved the pointer, goes first)
    named = _checkpoint(run / 'renamed.pth', seed=9)
    (run / 'last_checkpoint').write_text(named)
    assert _resume(train_tool, str(run)).load_from == named

    # other names: the newest .pth
    other = tmp_path / 'other'
    other.mkdir()
    old = _checkpoint(other / 'model_a.pth')
    new = _checkpoint(other / 'model_b.pth', seed=3)
    os.utime(old, (time.time() - 100, time.time() - 100))
    cfg = _resume(train_tool, str(other))
    assert (cfg.load_from, cfg.randomness.seed) == (new, 3)
    os.utime(new, (time.time() - 100, time.time() - 100))
    with pytest.raises(ValueError, match='model_.\\.pth and model_.\\.pth '
                       'are equally new and there is no last_checkpoint'):
        _resume(train_tool, str(other))

    mixed = tmp_path / 'mixed'
    mixed.mkdir()
    _checkpoint(mixed / 'epoch_3.pth')
    _checkpoint(mixed / 'iter_200.pth')
    with pytest.raises(ValueError, match='both epoch_N.pth and iter_N.pth '
                       'checkpoints and no last_checkpoint file'):
        _resume(train_tool, str(mixed))

    empty = tmp_path / 'empty'
    empty.mkdir()
    with pytest.raises(ValueError, match=f'--resume {empty}: the folder holds '
                       'no checkpoint'):
        _resume(train_tool, str(empty))
    with pytest.raises(ValueError, match="--resume '' is empty"):
        _resume(train_tool, '')


# -- converters ----------------------------------------------------------------
def test_converters_refuse_a_folder_as_output_before_converting(capsys,
                                                                tmp_path):
    """A converter's output pointed at a folder failed after converting with
    torch's C++ message and no path; now when the command line is read
    (before the source is even opened: it does not exist here)."""
    for name in ('clustr_official_to_mm', 'paca_official_to_mm'):
        tool = load_tool(name, 'model_converters')
        _refused(capsys, lambda: tool.main(['/no/such/src.pth',
                                            str(tmp_path)]),
                 f'argument dst: {str(tmp_path)!r} is a directory; give a '
                 'file name in it')


# -- --out ---------------------------------------------------------------------
def test_outputs_that_are_folders_are_refused_before_the_run(capsys,
                                                             tmp_path,
                                                             monkeypatch):
    """``--out DIR`` failed only after the whole run (benchmark.py and the
    tools sharing its arguments, precision_check.py, get_flops.py --json,
    pytorch2onnx.py, plot_benchmark.py); now when the command line is
    read."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / 'tools' / 'analysis'))
    folder = str(tmp_path)
    is_dir = f'{folder!r} is a directory'
    bench = load_tool('benchmark')
    _refused(capsys, lambda: bench.parse_args(['--out', folder]),
             f'argument --out: {is_dir}')
    _refused(capsys, lambda: bench.parse_args(['--plot', folder]),
             f'argument --plot: {is_dir}')
    _refused(capsys, lambda: load_tool('traffic_census').main(
        ['traffic_census.py', '--out', folder]), f'argument --out: {is_dir}')
    _refused(capsys, lambda: load_tool('precision_check').main(
        ['--out', folder]), f'argument --out: {is_dir}')
    _refused(capsys, lambda: load_tool('get_flops').main(
        [CONFIG, '--json', folder]), f'argument --json: {is_dir}')
    _refused(capsys, lambda: load_tool('pytorch2onnx', 'deployment')
             .parse_args([CONFIG, '--out', folder]),
             f'argument --out: {is_dir}')
    _refused(capsys, lambda: load_tool('plot_benchmark').main(
        ['r.json', '--out', folder]), f'argument --out: {is_dir}')
    _refused(capsys, lambda: bench.parse_args(['--out', '']),
             "argument --out: '' is empty")
    a_file = tmp_path / 'data'
    a_file.write_text('x')
    _refused(capsys, lambda: load_tool('make_tiny_data', 'data').main(
        ['--out', str(a_file)]),
        f'argument --out: {str(a_file)!r} is a file, not a folder')


# -- on/off options --------------------------------------------------------------
def test_on_off_options_are_parsed_strictly(train_tool):
    """``--cfg-options allow_partial_load=no`` (a string, true to Python)
    allowed partial loads; ``resume=no`` resumed. Both parse as the
    environment switches do, anything else refused naming the option."""
    assert [switch_value('x', v) for v in
            ('no', 'Off', '0', 0, False, 'yes', 'ON', 1, True)] == \
        [False] * 5 + [True] * 4
    cfg = _config(train_tool, '--cfg-options', 'allow_partial_load=no',
                  'resume=no', 'compile=off', 'env_cfg.cudnn_benchmark=no',
                  'randomness.deterministic=yes')
    assert (cfg.allow_partial_load, cfg.resume, cfg.compile,
            cfg.env_cfg.cudnn_benchmark, cfg.randomness.deterministic) == (
                False, False, False, False, True)
    assert _config(train_tool, '--cfg-options', 'compile.mode=max-autotune'
                   ).compile == dict(mode='max-autotune')
    with pytest.raises(ValueError, match="allow_partial_load='maybe' is not "
                       'an on/off value'):
        _config(train_tool, '--cfg-options', 'allow_partial_load=maybe')
    with pytest.raises(ValueError, match="resume='work_dirs/a/epoch_2.pth' "
                       'is not an on/off value.*--resume PATH'):
        _config(train_tool, '--cfg-options',
                'resume=work_dirs/a/epoch_2.pth')

    # the hook reads the option alike (the libraries' own tools reach it
    # without tools/train.py's check)
    model = nn.Linear(2, 2)
    report = load_coverage(model, {})
    logged = []
    runner = SimpleNamespace(cfg=Config(dict(allow_partial_load='no')),
                             logger=SimpleNamespace(warning=logged.append))
    with pytest.raises(PartialLoadError):
        _refuse_partial(runner, model, report, 'checkpoint F', 'Loading')
    runner.cfg.allow_partial_load = 'yes'
    _refuse_partial(runner, model, report, 'checkpoint F', 'Loading')
    assert logged
    runner.cfg.allow_partial_load = 'perhaps'
    with pytest.raises(ValueError, match='allow_partial_load'):
        _refuse_partial(runner, model, report, 'checkpoint F', 'Loading')
    cfg = Config(dict(allow_partial_load='off'))
    add_coverage_check(cfg)
    assert cfg.allow_partial_load is False


# -- --cfg-options into a list -----------------------------------------------------
def test_cfg_options_into_a_list_explain_the_list(train_tool, capsys,
                                                  monkeypatch):
    """``--cfg-options model.init_cfg.type=Pretrained`` gave MMEngine's
    ``list indices must be integers``: init_cfg is a list of initialisers
    there. Now the list is shown and how to set it; in every tool that
    takes --cfg-options."""
    with pytest.raises(ValueError) as err:
        _config(train_tool, '--cfg-options', 'model.init_cfg.type=Pretrained')
    text = str(err.value)
    for needle in ("--cfg-options model.init_cfg.type='Pretrained': "
                   f'model.init_cfg is a list in {CONFIG} '
                   '([TruncNormal(layer=Linear), Constant(layer=LayerNorm)])'
                   ", so it has no field 'type'",
                   'load_from=PATH', 'model.backbone.init_cfg.type=Pretrained'
                   ' model.backbone.init_cfg.checkpoint=PATH',
                   'model.init_cfg=None', 'model.init_cfg.0.type=...'):
        assert needle in text, text
    # by index it is MMEngine's own syntax, and passes
    cfg = _config(train_tool, '--cfg-options',
                  'model.init_cfg.0.std=0.01')
    assert cfg.model.init_cfg[0].std == 0.01
    # any other list
    with pytest.raises(ValueError, match=r"train_dataloader.dataset.pipeline "
                       r'is a list .*no field .scale.*pipeline.0.scale=\.\.\.'):
        check_cfg_options(Config.fromfile(ROOT / CONFIG),
                          {'train_dataloader.dataset.pipeline.scale': 64},
                          CONFIG)
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / 'tools' / 'analysis'))
    _refused(capsys, lambda: load_tool('pytorch2onnx', 'deployment').main(
        [CONFIG, '--shape', '64', '64', '--cfg-options',
         'model.init_cfg.type=Pretrained']),
        'model.init_cfg is a list')
    with pytest.raises(ValueError, match='model.init_cfg is a list'):
        load_tool('get_flops').get_flops(
            CONFIG, cfg_options={'model.init_cfg.type': 'Pretrained'})
