"""The official PaCa-ViT release files' key layouts, as the official code
builds them (tests/data/paca_release_keys.json, a copy of the project's
reference manifest): for each of the 38 files, the official model it was
saved from and every key of that model with its shape. The values are not
known here, so files made from the manifest hold random values; what they
pin down is that our converter and configs meet the official names and
shapes, independently of our own key map.
"""
import json
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = json.loads(
    (ROOT / 'tests/data/paca_release_keys.json').read_text())['files']
RELEASE = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/'


def official_shapes(name):
    """{official key: shape} of the release file ``name``: a timm
    classifier's keys at top level, a detector's / segmentor's backbone keys
    under ``backbone.`` (their necks and heads are the mm libraries' own
    modules and are not listed)."""
    entry = MANIFEST[name]
    if 'keys' in entry:
        return {k: tuple(s) for k, s in entry['keys'].items()}
    return {f'backbone.{k}': tuple(s) for k, s in entry['backbone_keys'].items()}


def official_state(name, device='cpu', seed=0):
    """A state dict in the layout of release file ``name`` with random
    values (``device='meta'``: shapes only, nothing allocated)."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in official_shapes(name).items():
        if device == 'meta':
            state[key] = torch.empty(shape, device='meta')
        elif key.endswith('num_batches_tracked'):
            state[key] = torch.randint(0, 1000, shape, generator=gen)
        else:
            state[key] = torch.randn(shape, generator=gen)
    return state


def metafile_configs():
    """{release file name: the config whose metafile entry names it}."""
    index = yaml.safe_load((ROOT / 'model-index.yml').read_text())
    found = {}
    for meta in index['Import']:
        for model in yaml.safe_load((ROOT / meta).read_text())['Models']:
            weights = model.get('Weights', '')
            if weights.startswith(RELEASE):
                name = weights[len(RELEASE):]
                assert name not in found, f'{name} named twice'
                found[name] = model['Config']
    return found
