"""OpenMMLab's client finds our model zoo in an installed clustr_mm, as it
does for mmdet: `mim search` lists the configs with the release's weights and
metrics, and `mim download` copies a config and fetches its release file.

clustr_mm is built into a wheel from a copy of this tree and installed into a
fresh folder put first on PYTHONPATH: what `pip install .` gives a user
(setup.py places model-index.yml, the metafiles and the configs in
clustr_mm/.mim/). There is no network here, so the download of a release file
goes to a server on 127.0.0.1 (mim has no option to change the URL: the
script below rewrites the release prefix inside mim's downloader).
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import MODEL_CONFIGS
from test_configs import RELEASE, ROOT

pytestmark = pytest.mark.slow

MIM = Path(sys.executable).with_name('mim')
DET_CONFIG = 'mask-rcnn_paca-s_fpn_ms-1x_coco'
DET_FILE = 'mask_rcnn_pacavit_small_p2cconv_100_0_mstrain_480_800_1x_coco.pth'
IMNET_FILE = 'IMNET_224_pacavit_small_p2cconv_100_0.pth'


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    """A folder holding clustr_mm as `pip install .` installs it."""
    tmp = tmp_path_factory.mktemp('mim')
    src = tmp / 'src'
    src.mkdir()
    skip = shutil.ignore_patterns('__pycache__', '*.pyc', '.mim')
    for name in ('setup.py', 'README.md', 'model-index.yml'):
        shutil.copy(ROOT / name, src / name)
    for name in ('clustr_mm', 'configs', 'tools'):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    pip = [sys.executable, '-m', 'pip', '--disable-pip-version-check', '-q']
    subprocess.run(pip + ['wheel', '--no-deps', '--no-build-isolation',
                          '-w', str(tmp / 'wheel'), str(src)], check=True)
    wheel, = (tmp / 'wheel').glob('clustr_mm-*.whl')
    subprocess.run(pip + ['install', '--no-deps', '--target',
                          str(tmp / 'site'), str(wheel)], check=True)
    return tmp / 'site'


def _run(args, site, cwd, **kwargs):
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=300, **kwargs)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_the_wheel_carries_the_zoo(site):
    mim = site / 'clustr_mm' / '.mim'
    assert (mim / 'model-index.yml').read_text() == (
        ROOT / 'model-index.yml').read_text()
    for meta in ROOT.glob('configs/*/metafile.yml'):
        assert (mim / meta.relative_to(ROOT)).read_text() == meta.read_text()
    configs = sorted(p.relative_to(ROOT) for p in ROOT.glob('configs/*/*.py'))
    assert sorted(p.relative_to(mim) for p in mim.glob('configs/*/*.py')) \
        == configs


def test_mim_search_lists_configs_with_release_weights(site, tmp_path):
    out = tmp_path / 'search.json'
    _run([str(MIM), 'search', 'clustr_mm', '--json', str(out)], site,
         tmp_path)
    rows = {}  # mim writes {field: {config: value}}
    for field, column in json.loads(out.read_text()).items():
        for name, value in column.items():
            if value is not None:
                rows.setdefault(name, {})[field] = value
    # Every config of every folder is listed.
    assert len(rows) == len(MODEL_CONFIGS)
    det = rows[DET_CONFIG]
    assert det['weight'] == RELEASE + DET_FILE
    assert det['coco/box_ap'] == 46.4 and det['coco/mask_ap'] == 41.8
    assert det['weights_source'].startswith('official paca-vit release')
    assert rows['paca-s_8xb128_in1k']['weight'] == RELEASE + IMNET_FILE
    assert rows['paca-s_8xb128_in1k']['imagenet-1k/top_1_accuracy'] == 83.08
    # ClusTR: no weights anywhere, so none listed.
    assert not rows['clustr-s_8xb128_in1k'].get('weight')


def test_mim_download_copies_the_config(site, tmp_path):
    """The CLI as a user types it; the release file is already in DEST (no
    network here), so mim keeps it and dumps the config."""
    dest = tmp_path / 'dest'
    dest.mkdir()
    (dest / DET_FILE).write_bytes(b'placed by hand')
    out = _run([str(MIM), 'download', 'clustr_mm', '--config', DET_CONFIG,
                '--dest', str(dest)], site, tmp_path)
    assert f'{DET_FILE} exists' in out
    assert (dest / DET_FILE).read_bytes() == b'placed by hand'
    dumped = (dest / f'{DET_CONFIG}.py').read_text()
    assert RELEASE + IMNET_FILE in dumped  # fine-tunes from the release
    assert "type='PaCaViT'" in dumped


DOWNLOAD = textwrap.dedent('''
    import http.server, sys, threading
    from functools import partial
    import mim.commands.download
    # the package re-exports a function of the module's name: take the module
    download = sys.modules['mim.commands.download']

    served, release, config, dest = sys.argv[1:5]
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=served)
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    local = f'http://127.0.0.1:{server.server_address[1]}/'
    fetch = download.download_from_file
    urls = []

    def redirected(url, *args, **kwargs):
        urls.append(url)
        assert url.startswith(release), url
        return fetch(local + url[len(release):], *args, **kwargs)

    download.download_from_file = redirected
    download.download('clustr_mm', [config], dest)
    server.shutdown()
    print('fetched', *urls)
''')


def test_mim_download_fetches_the_release_file(site, tmp_path):
    served, dest = tmp_path / 'served', tmp_path / 'dest'
    served.mkdir()
    payload = os.urandom(4096)
    (served / DET_FILE).write_bytes(payload)
    out = _run([sys.executable, '-c', DOWNLOAD, str(served), RELEASE,
                DET_CONFIG, str(dest)], site, tmp_path)
    assert f'fetched {RELEASE}{DET_FILE}' in out
    assert (dest / DET_FILE).read_bytes() == payload
    assert (dest / f'{DET_CONFIG}.py').is_file()


def test_mim_sees_an_editable_install(tmp_path):
    """With the clone first on PYTHONPATH (docs/environments.md), mim reads
    the clone's metadata and the .mim/ links that `pip install -e .` made."""
    links = ROOT / 'clustr_mm' / '.mim'
    assert (links / 'model-index.yml').is_file(), \
        f'{links} is missing: run pip install -e . (tools/setup_env.sh)'
    out = _run([str(MIM), 'search', 'clustr_mm', '--valid-config'], ROOT,
               tmp_path)
    for config in MODEL_CONFIGS:
        assert f"'{config.stem}'" in out, config.stem
