"""model-index.yml and configs/*/metafile.yml (the mim model index) and the
config folders' README tables agree with the configs on disk.

Every config is listed exactly once, every listed config exists and is one of
the configs that tests/test_configs.py loads and builds, and the numbers a
metafile carries are the configs' own: parameter counts are re-counted on a
built model for one config of each library (test_configs builds them all but
does not keep the models).
"""
import re
from pathlib import Path

import pytest
import yaml

from test_configs import CONFIGS, ROOT, build_model

INDEX = ROOT / 'model-index.yml'
FOLDERS = sorted(p.name for p in (ROOT / 'configs').iterdir()
                 if p.is_dir() and not p.name.startswith('_'))
# Metric names each library reports, so mim users see familiar keys.
TASK_METRICS = {
    'Image Classification': {'Top 1 Accuracy', 'Top 5 Accuracy'},
    'Object Detection': {'box AP'},
    'Instance Segmentation': {'mask AP'},
    'Semantic Segmentation': {'mIoU'},
    'Pose Estimation': {'AP', 'AR', 'Whole-body AP'},
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
        # Weights only where a file exists: nothing has been released yet.
        weights = model.get('Weights')
        if weights is not None:
            assert weights.startswith('https://') or (ROOT / weights).is_file(), weights
        # Results only for what was measured here: the embedded-data runs.
        for result in model.get('Results', []):
            assert 'embedded' in model['Name'], model['Name']
            assert 'embedded' in result['Dataset']
            assert set(result['Metrics']) <= TASK_METRICS[result['Task']], result


def test_collections_point_to_papers_and_readmes():
    for meta in _metafiles():
        for collection in _load(meta)['Collections']:
            assert (ROOT / collection['README']).is_file()
            assert collection['README'] == str(meta.parent.relative_to(ROOT) / 'README.md')
            assert collection['Paper']['URL'].startswith('https://arxiv.org/abs/')


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
    from mmengine.config import Config
    entry = {m['Config']: m for _, m in _models()}[path]
    model = build_model(Config.fromfile(ROOT / path))
    assert entry['Metadata']['Parameters'] == sum(
        p.numel() for p in model.parameters())
