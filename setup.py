"""Install clustr_mm into an existing OpenMMLab environment.

    pip install -e .            # keeps the installed torch, mmengine and mmcv

The requirements state what the code needs (ranges), not the environment the
project is tested in: the exact, reproducible stacks are the lock files in
requirements/ and are made by ``bash tools/setup_env.sh`` (see
docs/environments.md). torch and mmcv are never pulled in as upgrades: torch is
only required to be >= 2.0, and mmcv (which has to match torch and is compiled
with its ops) is not a requirement of the package at all -- the backbones do
not import it; the task extras below name the range the task libraries accept.
clustr_mm/env_check.py checks the same bounds at import / config-build time.
"""
import re
import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
VERSION = re.search(r"__version__ = '([^']+)'",
                    (ROOT / 'clustr_mm' / '__init__.py').read_text()).group(1)

# mmdet 3.3, mmseg 1.2 and mmpose 1.3 assert mmcv < 2.2 at import.
MMCV = 'mmcv>=2.0.0rc4,<2.2.0'
EXTRAS = {
    # Lower bounds: the versions the configs were tested with; upper bounds
    # only where a break is known.
    'det': [MMCV, 'mmdet>=3.3.0'],
    'seg': [MMCV, 'mmsegmentation>=1.2.2', 'ftfy', 'regex'],
    'cls': ['mmpretrain>=1.2.0'],
    # mmpose itself must be installed with `pip install --no-deps mmpose`
    # (its declared chumpy dependency does not build); these are its real
    # runtime needs.
    'pose': [MMCV, 'json_tricks', 'munkres', 'xtcocotools'],
    # tools/deployment/pytorch2onnx.py: export and the check in ONNX Runtime
    # (onnxscript: torch's dynamo exporter). ml_dtypes >= 0.6 needs numpy 2;
    # the bound keeps an environment's numpy 1.x where it has one.
    'onnx': ['onnx>=1.23', 'onnxruntime>=1.32', 'onnxscript>=0.7',
             'ml_dtypes<0.6'],
}
EXTRAS['all'] = sorted({r for reqs in EXTRAS.values() for r in reqs})

# OpenMMLab's client (`mim search`, `mim download`) reads model-index.yml, the
# metafiles and the configs from <installed package>/.mim/, as it does for
# mmdet. They live at the top of the repository, so they are placed there
# when a package is built: copied for wheels and sdists, linked for an
# editable install so edits show (mim finds an editable install with the clone
# on PYTHONPATH: docs/environments.md).
MIM_FILES = ('model-index.yml', 'configs', 'tools')


def place_mim_files():
    commands = set(sys.argv[1:])
    if commands & {'develop', 'editable_wheel'}:
        link = True
    elif commands & {'bdist_wheel', 'sdist', 'build', 'build_py',
                     'install'}:
        link = False
    else:  # egg_info, --version, ...: nothing is built
        return
    target = ROOT / 'clustr_mm' / '.mim'
    target.mkdir(exist_ok=True)
    for name in MIM_FILES:
        src, dst = ROOT / name, target / name
        if dst.is_symlink() or dst.is_file():
            dst.unlink()
        elif dst.is_dir():
            shutil.rmtree(dst)
        if link:
            dst.symlink_to(Path('..', '..', name))
        elif src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns(
                '__pycache__', '*.pyc'))
        else:
            shutil.copyfile(src, dst)


place_mim_files()

setup(
    name='clustr_mm',
    version=VERSION,
    description='Clustering-attention vision backbones (ClusTR, PaCa-ViT) '
    'for mmpretrain, mmdet, mmseg and mmpose',
    long_description=(ROOT / 'README.md').read_text(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['clustr_mm', 'clustr_mm.*']),
    package_data={'clustr_mm': [
        '.mim/' + '/'.join(['*'] * depth) for depth in range(1, 5)]},
    python_requires='>=3.9',
    install_requires=[
        'torch>=2.0',
        'mmengine>=0.8,<1.0',
        'numpy',
    ],
    extras_require=EXTRAS,
)
