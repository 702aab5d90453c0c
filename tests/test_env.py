"""The pinned stack is what the environment script promised, and an
unsupported stack is refused with a message that names what to fix."""
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import run_tool

pytestmark = pytest.mark.torch21

ROOT = Path(__file__).resolve().parents[1]
# Written by tools/setup_env.sh into the venv it made; absent elsewhere.
STACK_FILE = Path(sys.prefix) / '.clustr_mm_stack'
STACK = STACK_FILE.read_text().strip() if STACK_FILE.exists() else None


def _pins():
    if STACK is None:
        return {}
    torch_req = 'torch.txt' if STACK == 'default' else f'{STACK}.txt'
    pins = {}
    for name in (torch_req, 'mmlibs.txt', 'onnx.txt'):
        for line in (ROOT / 'requirements' / name).read_text().splitlines():
            m = re.match(r'^([A-Za-z0-9_.-]+)==([^\s#]+)', line)
            if m:
                pins[m.group(1).lower().replace('_', '-')] = m.group(2)
    pins.update({'mmcv': '2.1.0', 'mmpose': '1.3.2'})
    return pins


@pytest.mark.skipif(STACK is None, reason='not a tools/setup_env.sh venv')
@pytest.mark.parametrize('dist,version', sorted(_pins().items()))
def test_installed_versions_match_pins(dist, version):
    from importlib.metadata import version as installed
    assert installed(dist).split('+')[0] == version


@pytest.mark.parametrize(
    'module', ['mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain', 'mmpose'])
def test_libraries_import(module):
    assert importlib.import_module(module).__version__


def test_mmcv_ops_run_on_cpu():
    from mmcv.ops import RoIAlign, nms
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.],
                          [20., 20., 30., 30.]])
    dets, keep = nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5)
    assert keep.tolist() == [0, 2]
    assert torch.allclose(dets[:, 4], torch.tensor([0.9, 0.7]))
    # A 2x2 RoIAlign of a linear ramp samples the ramp at the bin centres.
    feat = torch.arange(16.).reshape(1, 1, 4, 4)
    out = RoIAlign((1, 1), 1.0, sampling_ratio=1, aligned=False)(
        feat, torch.tensor([[0., 0., 0., 2., 2.]]))
    assert out.item() == pytest.approx(feat[0, 0, 1, 1].item())


def test_package_registers_in_root_registry():
    import clustr_mm
    from mmengine.registry import MODELS
    assert re.match(r'\d+\.\d+\.\d+', clustr_mm.__version__)
    for name in ('ClusTR', 'PaCaViT'):
        assert name in MODELS.module_dict, name


def test_reimport_does_not_fail_registration():
    import clustr_mm.models.backbones.clustr as mod
    importlib.reload(mod)
    from mmengine.registry import MODELS
    assert MODELS.get('ClusTR') is mod.ClusTR


# --- Supported ranges (setup.py) and the clear errors of clustr_mm.env_check.

@pytest.mark.slow
def test_setup_py_states_ranges_not_pins():
    """setup.py requires what the code needs; the pins live in requirements/."""
    out = subprocess.run(
        [sys.executable, '-c', 'import runpy, setuptools, sys, json\n'
         'seen = {}\n'
         'setuptools.setup = lambda **kw: seen.update(kw)\n'
         'runpy.run_path("setup.py")\n'
         'print(json.dumps([seen["python_requires"], seen["install_requires"],'
         ' seen["extras_require"]]))'],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout
    import json
    python, install, extras = json.loads(out.splitlines()[-1])
    assert python == '>=3.9'
    assert set(install) == {'torch>=2.0', 'mmengine>=0.8,<1.0', 'numpy'}
    assert not any('==' in r for r in install + sum(extras.values(), []))
    assert not any(r.startswith('mmcv') for r in install)  # never upgraded
    assert 'mmcv>=2.0.0rc4,<2.2.0' in extras['det']
    from clustr_mm import env_check
    assert env_check.CORE == {'torch': ('2.0', None),
                              'mmengine': ('0.8', '1.0')}


@pytest.mark.parametrize('text,parsed', [
    ('2.1.2+cu121', (2, 1, 2, 0, 0)), ('2.0.0rc4', (2, 0, 0, -1, 4)),
    ('0.10', (0, 10, 0, 0, 0)), ('1.26.4', (1, 26, 4, 0, 0))])
def test_parse_version(text, parsed):
    from clustr_mm.env_check import parse_version
    assert parse_version(text) == parsed
    assert parse_version('2.0.0rc4') < parse_version('2.0.0') < \
        parse_version('2.1.0') < parse_version('2.2.0')


@pytest.mark.slow
@pytest.mark.parametrize('dist,fake,needed', [
    ('torch', '1.13.1', '>= 2.0'), ('mmengine', '1.0.0', '>= 0.8 and < 1.0'),
    ('mmengine', '0.7.4', '>= 0.8 and < 1.0')])
def test_import_refuses_unsupported_core_versions(dist, fake, needed):
    """A fresh interpreter where ``dist`` reports version ``fake``."""
    code = (
        'import importlib.metadata as md\n'
        'real = md.version\n'
        f'md.version = lambda d: {fake!r} if d == {dist!r} else real(d)\n'
        'import clustr_mm\n')
    proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith('clustr_mm.env_check.UnsupportedEnvironmentError')
    assert f'needs {dist} {needed}' in last and f'found {dist} {fake}' in last


def test_check_refuses_numpy_torch_mismatch(monkeypatch):
    from clustr_mm import env_check

    def broken(array):
        raise RuntimeError('Numpy is not available')

    monkeypatch.setattr(torch, 'from_numpy', broken)
    with pytest.raises(env_check.UnsupportedEnvironmentError,
                       match=r'cannot use numpy .*needs numpy < 2'):
        env_check.check_numpy_torch()


@pytest.mark.slow
def test_detection_without_mmcv_ops_is_a_clear_error(tiny_data, tmp_path):
    """tools/train.py on a detection config with mmcv-lite (no mmcv._ext):
    our message, before mmdet's models fail to import deep inside mmcv."""
    blocker = tmp_path / 'site'
    blocker.mkdir()
    (blocker / 'sitecustomize.py').write_text(
        'import sys\n'
        'class HideMmcvExt:\n'
        '    def find_spec(self, name, path=None, target=None):\n'
        '        if name == "mmcv._ext":\n'
        '            raise ModuleNotFoundError("No module named \'mmcv._ext\'")\n'
        'sys.meta_path.insert(0, HideMmcvExt())\n')
    import os
    env = dict(os.environ, PYTHONPATH=str(blocker), OMP_NUM_THREADS='2')
    proc = subprocess.run(
        [sys.executable, 'tools/train.py',
         'configs/clustr/mask-rcnn_clustr-t_fpn_embedded-coco.py',
         '--work-dir', str(tmp_path / 'wd')],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith('clustr_mm.env_check.UnsupportedEnvironmentError'), \
        proc.stderr[-3000:]
    assert 'mmdet 3.3.0 models need mmcv with compiled ops (mmcv._ext)' in last
    assert 'found mmcv 2.1.0 without them' in last


def test_scope_check_names_task_library_and_mmcv_range(monkeypatch):
    from clustr_mm import env_check
    real = env_check.installed_version
    monkeypatch.setattr(env_check, 'installed_version',
                        lambda d: '2.2.0' if d == 'mmcv' else real(d))
    with pytest.raises(env_check.UnsupportedEnvironmentError,
                       match=r'needs mmcv >= 2.0.0rc4 and < 2.2.0, found mmcv '
                       r'2.2.0\. mmsegmentation 1.2.2 models import mmcv.ops'):
        env_check.check_scope('mmseg')
    env_check.check_scope('mmpretrain')  # needs no mmcv ops
    monkeypatch.setattr(env_check, 'installed_version',
                        lambda d: None if d == 'mmdet' else real(d))
    with pytest.raises(env_check.UnsupportedEnvironmentError,
                       match=r'needs mmdet >= 3.3.0, but mmdet is not '
                       'installed'):
        env_check.check_scope('mmdet')


def test_scope_that_does_not_import_is_named(monkeypatch):
    """A task library whose own import fails (seen on a GPU node without
    mmpretrain's `modelindex`): MMEngine would warn 'mmpretrain is not
    installed' and fail later on an unrelated registry KeyError."""
    import sys

    from clustr_mm import env_check
    monkeypatch.setitem(sys.modules, 'mmpretrain.utils', None)
    with pytest.raises(env_check.UnsupportedEnvironmentError,
                       match=r"mmpretrain \S+ is installed but does not "
                       r"import \(ModuleNotFoundError: import of "
                       r"mmpretrain\.utils halted.*default_scope='mmpretrain'"):
        env_check.check_scope('mmpretrain')


def test_runner_of_a_scope_that_does_not_import_is_refused(monkeypatch):
    """The tools that build a runner from a config they read themselves
    (train_speed.py, nan_check.py) check its task library too: on a GPU
    image without mmpretrain's ``modelindex``, every ImageNet config of
    ``train_speed.py --release`` failed on 'UniversalVisualizer is not in
    the mmengine::visualizer registry', naming no missing package."""
    import sys

    from mmengine.config import Config

    from clustr_mm.engine.launch import build_runner
    from clustr_mm.env_check import UnsupportedEnvironmentError
    monkeypatch.setitem(sys.modules, 'mmpretrain.utils', None)
    cfg = Config.fromfile(
        str(ROOT / 'configs/clustr/clustr-t_embedded-imagenet.py'))
    with pytest.raises(UnsupportedEnvironmentError,
                       match=r"mmpretrain \S+ is installed but does not "
                       r"import .*default_scope='mmpretrain'"):
        build_runner(cfg)


def test_registry_whose_modules_do_not_import_is_named(tmp_path,
                                                       monkeypatch):
    """A task library that imports but whose registry's modules raise
    something other than ImportError (mmpretrain 1.2.0's multimodal models
    under a newer transformers on a GPU image: a bare TypeError)."""
    import sys

    from mmengine.registry import Registry

    import clustr_mm  # noqa: F401  (installs the check)
    from clustr_mm import env_check
    (tmp_path / 'broken_models_xyz.py').write_text(
        'class Bert(None):\n    pass\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry('model', scope='broken_scope_xyz',
                        locations=['broken_models_xyz'])
    with pytest.raises(env_check.UnsupportedEnvironmentError,
                       match=r"'broken_scope_xyz' model registry "
                       r"\(broken_models_xyz\) do not import: TypeError: "
                       r"NoneType takes no arguments") as info:
        registry.get('Anything')
    assert isinstance(info.value.__cause__, TypeError)
    sys.modules.pop('broken_models_xyz', None)


def test_version_without_pip_metadata_comes_from_the_module(monkeypatch):
    """torch built from source or by conda may carry no dist-info."""
    import importlib.metadata as md

    from clustr_mm import env_check

    def no_metadata(dist):
        raise md.PackageNotFoundError(dist)

    monkeypatch.setattr(md, 'version', no_metadata)
    assert env_check.installed_version('torch') == torch.__version__
    assert env_check.installed_version('no_such_package_xyz') is None


@pytest.mark.slow
def test_setup_env_mmcv_flavour_and_cache_key(tmp_path):
    """``tools/setup_env.sh --mmcv-plan``: CUDA ops where nvcc and a GPU
    are found or where CLUSTR_MM_MMCV_CUDA=1 asks (a build node without a
    GPU), CPU ops otherwise or with =0; CUDA wheels cached apart from CPU
    ones, by nvcc release and arch list. Fake nvcc / nvidia-smi on PATH."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'nvcc').write_text(
        '#!/bin/sh\necho "Cuda compilation tools, release 13.0, V13.0.88"\n')
    (bin_dir / 'nvcc').chmod(0o755)
    base_path = '/usr/bin:/bin'

    def plan(path, **env):
        proc = run_tool(['bash', 'tools/setup_env.sh', '--mmcv-plan'],
                        python=False, check=False,
                        env=dict(dict(CLUSTR_MM_MMCV_CUDA='',
                                      TORCH_CUDA_ARCH_LIST=''),
                                 PATH=path, CLUSTR_MM_CACHE='/c',
                                 CLUSTR_MM_STACK='default',
                                 CLUSTR_MM_PYTHON=sys.executable, **env))
        if proc.returncode:
            return proc.stdout
        return dict(line.split('=', 1) for line in proc.stdout.splitlines())

    with_nvcc = f'{bin_dir}:{base_path}'
    tag = f'cp{sys.version_info[0]}{sys.version_info[1]}'
    cpu = plan(with_nvcc)  # nvcc but no GPU
    assert cpu['flavour'] == 'cpu' and cpu['build_env'] == 'MMCV_WITH_OPS=1'
    assert cpu['wheel_dir'] == f'/c/mmcv-2.1.0-torch2.14.1-{tag}-cpu'
    cuda = plan(with_nvcc, CLUSTR_MM_MMCV_CUDA='1')
    assert cuda['flavour'] == 'cuda'
    assert cuda['build_env'] == ('MMCV_WITH_OPS=1 FORCE_CUDA=1 '
                                 'TORCH_CUDA_ARCH_LIST=8.0;9.0')
    assert cuda['wheel_dir'] == (f'/c/mmcv-2.1.0-torch2.14.1-{tag}-'
                                 'cuda13.0-sm80_90')
    archs = plan(with_nvcc, CLUSTR_MM_MMCV_CUDA='1',
                 TORCH_CUDA_ARCH_LIST='8.6')
    assert archs['wheel_dir'].endswith('-cuda13.0-sm86')
    # a GPU found: CUDA by default, CPU when asked
    (bin_dir / 'nvidia-smi').write_text('#!/bin/sh\necho "GPU 0: H100"\n')
    (bin_dir / 'nvidia-smi').chmod(0o755)
    assert plan(with_nvcc)['flavour'] == 'cuda'
    assert plan(with_nvcc, CLUSTR_MM_MMCV_CUDA='0')['flavour'] == 'cpu'
    # CUDA asked for without nvcc, or a wrong value: refused, clearly
    assert 'CLUSTR_MM_MMCV_CUDA=1 needs nvcc on PATH' in plan(
        base_path, CLUSTR_MM_MMCV_CUDA='1')
    assert "CLUSTR_MM_MMCV_CUDA must be 1, 0 or auto, got 'yes'" in plan(
        with_nvcc, CLUSTR_MM_MMCV_CUDA='yes')


@pytest.mark.slow
def test_pch_cxx_precompiles_once_and_gcc_uses_it(tmp_path):
    """``tools/pch_cxx.sh`` (CXX of the mmcv build): a compiler probe
    passes through, the first compile precompiles the header with that
    compile's flags, GCC loads the .gch for every file that includes the
    header first (``-H`` marks it ``!``), a compile whose flags differ warns
    and reads the header as usual, and a header that does not precompile
    leaves compiles as they were."""
    if 'Free Software Foundation' not in subprocess.run(
            ['c++', '--version'], capture_output=True, text=True).stdout:
        pytest.skip('precompiled headers as GCC makes them: c++ is not GCC')
    # mmcv's layout: the sources in one folder, the header in another
    src, inc, pch = tmp_path / 'src', tmp_path / 'common', tmp_path / 'pch'
    src.mkdir()
    inc.mkdir()
    (inc / 'helper.hpp').write_text(
        '#ifndef HELPER\n#define HELPER\n#include <map>\n#include <string>\n'
        'inline int helper() { return 42; }\n#endif\n')
    for name in ('a', 'b'):
        (src / f'{name}.cpp').write_text(
            '#include "helper.hpp"\n'
            f'int {name}() {{ return helper() + std::map<int, int>().size();'
            ' }\n')
    flags = ['-O2', '-fPIC', '-DNAME=x', f'-I{inc}']

    def cxx(name, *extra, header=inc / 'helper.hpp'):
        return run_tool(
            [str(ROOT / 'tools' / 'pch_cxx.sh'), '-MMD', '-MF',
             str(tmp_path / 'd'),
             *flags, *extra, '-c', str(src / f'{name}.cpp'), '-o',
             str(tmp_path / f'{name}.o')], python=False, check=False,
            env=dict(PCH_HEADER=str(header), PCH_DIR=str(pch)))

    # torch's compiler probe (-v) passes through and precompiles nothing
    probe = run_tool([str(ROOT / 'tools' / 'pch_cxx.sh'), '-v'], python=False,
                     env=dict(PCH_HEADER=str(inc / 'helper.hpp'),
                              PCH_DIR=str(pch)))
    assert 'COLLECT_GCC=' in probe.stdout and not pch.exists()
    first = cxx('a')
    assert first.returncode == 0, first.stdout
    assert (pch / 'helper.hpp.gch').is_file()
    gch_time = (pch / 'helper.hpp.gch').stat().st_mtime_ns
    used = cxx('b', '-H')
    assert used.returncode == 0, used.stdout
    assert f'! {pch}/helper.hpp.gch' in used.stdout, used.stdout
    assert (pch / 'helper.hpp.gch').stat().st_mtime_ns == gch_time  # once
    assert (tmp_path / 'a.o').is_file() and (tmp_path / 'b.o').is_file()
    other = cxx('b', '-DNAME=y', '-H')  # a macro differs: not used
    assert other.returncode == 0, other.stdout
    assert f'! {pch}/helper.hpp.gch' not in other.stdout, other.stdout
    assert 'helper.hpp.gch' in other.stdout and 'not used' in other.stdout, \
        other.stdout
    # A header that does not compile on its own: recorded, then no PCH.
    (inc / 'bad.hpp').write_text('#error not alone\n')
    pch = pch_bad = tmp_path / 'pch_bad'
    plain = cxx('a', header=inc / 'bad.hpp')
    assert plain.returncode == 0, plain.stdout
    assert 'not alone' in (pch_bad / 'bad.hpp.gch.failed').read_text()
    assert not (pch_bad / 'bad.hpp.gch').exists()
