"""Install clustr_mm (``pip install -e .``).

The pinned OpenMMLab stack has install traps (mmcv must be compiled with a
patched flag, mmpose's chumpy dependency does not build), so the full
environment is made by ``bash tools/setup_env.sh``; the requirements below are
what the package itself imports.
"""
import re
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
VERSION = re.search(r"__version__ = '([^']+)'",
                    (ROOT / 'clustr_mm' / '__init__.py').read_text()).group(1)

setup(
    name='clustr_mm',
    version=VERSION,
    description='Clustering-attention vision backbones (ClusTR, PaCa-ViT) '
    'for mmpretrain, mmdet, mmseg and mmpose',
    long_description=(ROOT / 'README.md').read_text(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['clustr_mm', 'clustr_mm.*']),
    python_requires='>=3.11,<3.12',
    install_requires=[
        'torch==2.14.1',
        'mmengine==0.10.7',
        'mmcv==2.1.0',
    ],
    extras_require={
        'tasks': ['mmdet==3.3.0', 'mmsegmentation==1.2.2', 'mmpretrain==1.2.0'],
    },
)
