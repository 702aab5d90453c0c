"""model-index.yml and configs/*/metafile.yml (the mim model index) and the
config folders' README tables agree with the configs on disk.

Every config is listed exactly once, every listed config exists and is one of
the configs that tests/test_configs.py loads and builds, and the numbers a
metafile carries are the configs' own: parameter counts are re-counted on a
built model for one config of each library (test_configs builds them all but
does not keep the models). Weights are only ever the official PaCa-ViT
release's files, marked as such, each on the config that reproduces it.
"""
import re
from pathlib import Path

import pytest
import yaml

from conftest import MODEL_CONFIGS, load_config, load_tool
from test_configs import (CONFIGS, RELEASE, RELEASE_FILES, ROOT, build_model,
                          release_file)

INDEX = ROOT / 'model-index.yml'
OFFICIAL_CODE = 'https://github.com/iVMCL/PaCaViT'
# the folders of model configs (configs/deploy/ holds mmdeploy's configs)
FOLDERS = sorted({p.parent.name for p in MODEL_CONFIGS})
# Metric names each library reports, so mim users see familiar keys.
TASK_METRICS = {
    'Image Classification': {'Top 1 Accuracy', 'Top 5 Accuracy'},
    'Object Detection': {'box AP'},
    'Instance Segmentation': {'mask AP'},
    'Semantic Segmentation': {'mIoU'},
    'Pose Estimation': {'AP', 'AR', 'Whole-body AP', 'PCK'},
}
# Published numbers in the metafiles: only on the config that reproduces the
# paper's row, with the dataset marked as the paper's.
PAPER_MARK = 'reported by the ClusTR paper'
PAPER_ROWS = {  # ClusTR Table 5: ClusTR-S, COCO-WholeBody v1.0 val, 256x192
    'td-hm_clustr-s_mta-8xb64-210e_coco-wholebody-256x192': {
        'AP': 0.594, 'AR': 0.697},
}


def _load(path):
    return yaml.safe_load(Path(path).read_text())


def _metafiles():
    return [ROOT / entry for entry in _load(INDEX)['Import']]


def _models():
    return [(meta, model) for meta in _metafiles()
            for model in _load(meta)['Models']]


def test_index_imports_one_metafile_per_config_folder():
    imports = _load(INDEX)['Import']
    assert sorted(imports) == [f'configs/{f}/metafile.yml' for f in FOLDERS]
    for meta in _metafiles():
        assert meta.is_file(), meta


def test_every_config_listed_exactly_once():
    listed = [model['Config'] for _, model in _models()]
    duplicates = sorted({c for c in listed if listed.count(c) > 1})
    assert not duplicates, duplicates
    assert sorted(listed) == CONFIGS  # nothing missing, nothing extra
    for path in listed:  # and each exists (CONFIGS is a glob of real files)
        assert (ROOT / path).is_file(), path


def test_entries_are_well_formed():
    names = set()
    for meta, model in _models():
        folder = meta.parent
        collections = {c['Name']: c for c in _load(meta)['Collections']}
        assert model['In Collection'] in collections, model['Name']
        # Config lives in the metafile's own folder and names the model.
        assert Path(model['Config']).parent == folder.relative_to(ROOT)
        assert model['Name'] == Path(model['Config']).stem
        assert model['Name'] not in names
        names.add(model['Name'])
        metadata = model['Metadata']
        assert isinstance(metadata['Parameters'], int) and metadata['Parameters'] > 1e6
        if 'FLOPs' in metadata:
            assert isinstance(metadata['FLOPs'], int) and metadata['FLOPs'] > 1e8
            assert 'x' in metadata['Input Size']
        # Weights: only the official release's files, marked as theirs.
        weights = model.get('Weights')
        if weights is not None:
            assert weights.startswith(RELEASE), weights
            assert weights[len(RELEASE):] in RELEASE_FILES, weights
            assert model['Converted From'] == {
                'Weights': weights, 'Code': OFFICIAL_CODE}, model['Name']
            assert metadata['Weights Source'].startswith(
                'official PaCa-ViT release'), model['Name']
        else:
            assert 'Converted From' not in model, model['Name']
        # Results: what was measured here (the embedded-data runs), the
        # metrics the release publishes with its file, or a paper's number
        # on the config that reproduces its row, marked as the paper's.
        for result in model.get('Results', []):
            if 'embedded' in model['Name']:
                assert 'embedded' in result['Dataset']
            elif PAPER_MARK in result['Dataset']:
                assert PAPER_ROWS[model['Name']] == result['Metrics'], \
                    model['Name']
            else:
                assert weights is not None, model['Name']
            assert set(result['Metrics']) <= TASK_METRICS[result['Task']], result


def test_paper_results_sit_on_the_configs_that_reproduce_them():
    """The paper's whole-body pose row is on the neck config (TCFormer's
    settings), not on the simpler deconvolution config."""
    found = {model['Name']: result['Metrics'] for _, model in _models()
             for result in model.get('Results', [])
             if PAPER_MARK in result['Dataset']}
    assert found == PAPER_ROWS


def test_collections_point_to_papers_and_readmes():
    for meta in _metafiles():
        for collection in _load(meta)['Collections']:
            assert (ROOT / collection['README']).is_file()
            assert collection['README'] == str(meta.parent.relative_to(ROOT) / 'README.md')
            assert collection['Paper']['URL'].startswith('https://arxiv.org/abs/')


def test_weights_are_the_release_file_of_each_config():
    """A config whose model the release has a file for names that file, and
    only that one; one without a release file names none (the README's
    mislinked rows included)."""
    for _, model in _models():
        expected = release_file(load_config(model['Config']))
        if expected is None:  # a kind of model release_file does not name
            continue
        weights = model.get('Weights')
        if expected in RELEASE_FILES:
            assert weights == RELEASE + expected, model['Name']
        else:
            assert weights is None, model['Name']


def test_folder_readmes_link_the_weights():
    """Each Weights URL is given in its folder's README, next to its config."""
    for meta, model in _models():
        if 'Weights' in model:
            readme = (meta.parent / 'README.md').read_text()
            name = Path(model['Config']).name
            rows = [line for line in readme.splitlines() if f'](./{name})' in line]
            assert any(model['Weights'] in row for row in rows), model['Name']


@pytest.mark.parametrize('folder', FOLDERS)
def test_folder_readme_links_every_config(folder):
    """The README's results tables link each config of its folder, and only
    existing ones."""
    text = (ROOT / 'configs' / folder / 'README.md').read_text()
    configs = sorted(p.name for p in (ROOT / 'configs' / folder).glob('*.py'))
    for name in configs:
        assert f'](./{name})' in text, name
    for linked in re.findall(r'\]\(\./([^)]+\.py)\)', text):
        assert linked in configs, linked
    assert '```bibtex' in text and '## Results and models' in text


# One config per library and folder: re-count the parameters on the model.
PARAM_CHECKS = [
    'configs/clustr/clustr-s_8xb128_in1k.py',
    'configs/clustr/mask-rcnn_clustr-t_fpn_embedded-coco.py',
    'configs/clustr/fpn_clustr-t_embedded-ade20k.py',
    'configs/clustr/td-hm_clustr-t_embedded-coco-wholebody.py',
    'configs/paca/retinanet_paca-t_embedded-coco.py',
    'configs/ablations/clustr-t-grid-sra_8xb128_in1k.py',
]


@pytest.mark.parametrize('path', PARAM_CHECKS)
def test_parameters_match_the_built_model(path):
    entry = {m['Config']: m for _, m in _models()}[path]
    model = build_model(load_config(path))
    assert entry['Metadata']['Parameters'] == sum(
        p.numel() for p in model.parameters())


def test_docs_link_only_release_files():
    """Every release link in the READMEs and docs names a real release file
    (the official README's own tables link some wrong ones)."""
    docs = [ROOT / 'README.md', *ROOT.glob('configs/*/README.md'),
            *ROOT.glob('docs/*.md')]
    found = 0
    for doc in docs:
        for name in re.findall(re.escape(RELEASE) + r'([\w.-]+)',
                               doc.read_text()):
            found += 1
            assert name in RELEASE_FILES, f'{doc.name}: {name}'
    assert found > 20  # the config READMEs do link them


# FLOPs: every figure the metafiles publish, recounted by the tool the docs
# name (tools/analysis/get_flops.py) at the entry's Input Size, to the
# metafiles' rounding (0.01 G below 20 G, 0.1 G above). A detector at
# 1280x800 takes about 30 s to count on a 2-core CPU: those are in the
# opt-in release tier; the other 57 entries (about 4 s each) in the slow one.
FLOP_ENTRIES = [(m['Config'], m['Metadata']) for _, m in _models()
                if 'FLOPs' in m['Metadata']]


def _flop_case(config, metadata):
    marks = [pytest.mark.slow]
    if metadata['Input Size'] == '1280x800':
        marks.append(pytest.mark.release)
    return pytest.param(config, metadata, marks=marks, id=config)


_COUNTS = {}


def _counted(config):
    """``get_flops.py``'s count of ``config`` at its default input, once
    per config and process (the metafile and the docs share counts)."""
    if config not in _COUNTS:
        _COUNTS[config] = load_tool('get_flops').get_flops(str(ROOT / config))
    return _COUNTS[config]


@pytest.mark.parametrize('config, metadata',
                         [_flop_case(*e) for e in FLOP_ENTRIES])
def test_published_flops_are_recounted(config, metadata):
    result = _counted(config)
    size = sorted(int(s) for s in metadata['Input Size'].split('x'))
    assert sorted(result['input'][2:]) == size, result['input']
    step = 1e7 if metadata['FLOPs'] < 20e9 else 1e8
    assert round(result['flops'] / step) * step == pytest.approx(
        metadata['FLOPs']), (result['flops'], metadata['FLOPs'])


# docs/flops.md's figures, recounted the same way: (config, what, figure as
# the doc writes it, in G). 'total' is the whole count; 'backbone' the sum
# of the backbone's parts; 'without' the total less the attention products
# and the clustering (the ClusTR paper's convention); other names are parts
# of get_flops' by_part. The rounding is the doc's (its decimals).
FLOPS_DOC = [
    ('configs/clustr/clustr-s_8xb128_in1k.py', 'total', '8.29'),
    ('configs/clustr/clustr-s_8xb128_in1k.py', 'without', '4.62'),
    ('configs/clustr/clustr-s_8xb128_in1k.py', 'backbone/clustering', '2.80'),
    ('configs/clustr/clustr-s_8xb128_in1k.py', 'backbone/attention products',
     '0.87'),
    ('configs/paca/paca-t_8xb128_in1k.py', 'total', '3.24'),
    ('configs/paca/paca-s_8xb128_in1k.py', 'total', '5.53'),
    ('configs/paca/paca-s-mlp_8xb128_in1k.py', 'total', '5.89'),
    ('configs/paca/paca-b_8xb128_in1k.py', 'total', '9.57'),
    ('configs/paca/paca-s-teacher_8xb128_in1k.py', 'total', '5.52'),
    ('configs/paca/upernet_paca-t_8xb2-160k_ade20k-512x512.py', 'total',
     '229.8'),
    ('configs/paca/upernet_paca-s_8xb2-160k_ade20k-512x512.py', 'total',
     '242.7'),
    ('configs/paca/upernet_paca-b_8xb2-160k_ade20k-512x512.py', 'total',
     '264.1'),
    ('configs/clustr/mask-rcnn_clustr-s_fpn_1x_coco.py', 'total', '676'),
    ('configs/clustr/mask-rcnn_clustr-s_fpn_1x_coco.py',
     'backbone/attention products', '360'),
    ('configs/clustr/mask-rcnn_clustr-s_fpn_1x_coco.py',
     'backbone/clustering', '51'),
    ('configs/clustr/mask-rcnn_clustr-s_fpn_1x_coco.py', 'backbone', '506'),
    ('configs/clustr/mask-rcnn_clustr-s_fpn_1x_coco.py', 'neck', '52'),
    ('configs/clustr/mask-rcnn_clustr-s_fpn_1x_coco.py', 'heads', '118'),
    ('configs/clustr/mask-rcnn_clustr-s_fpn_1x_coco.py', 'without', '264'),
    ('configs/paca/mask-rcnn_paca-s_fpn_ms-1x_coco.py',
     'backbone/attention products', '10'),
]
def _doc_case(config, what, figure):
    marks = [pytest.mark.slow]
    if dict(FLOP_ENTRIES)[config]['Input Size'] == '1280x800':  # ~30 s
        marks.append(pytest.mark.release)
    return pytest.param(config, what, figure, marks=marks,
                        id=f'{Path(config).stem}-{what}')


def test_flops_doc_states_each_recounted_figure():
    """Each figure the test below recounts stands in docs/flops.md as
    written there (so neither can change alone)."""
    text = ' '.join((ROOT / 'docs' / 'flops.md').read_text().split())
    for _, _, figure in FLOPS_DOC:
        assert re.search(rf'(?<![\d.]){re.escape(figure)}(?![\d])', text), \
            figure


@pytest.mark.parametrize('config, what, figure',
                         [_doc_case(*e) for e in FLOPS_DOC])
def test_flops_doc_figures_are_recounted(config, what, figure):
    result = _counted(config)
    parts = result['by_part']
    value = {
        'total': result['flops'],
        'backbone': sum(v for k, v in parts.items()
                        if k.startswith('backbone/')),
        'without': result['flops'] - parts['backbone/attention products']
        - parts['backbone/clustering'],
    }.get(what, parts.get(what)) / 1e9
    decimals = len(figure.partition('.')[2])
    assert round(value, decimals) == float(figure), (config, what, value)
