"""Official PaCa-ViT checkpoints (timm ImageNet releases, mmdet detectors,
mmseg segmentors) -> clustr_mm keys.

One explicit table of key rewrites for the backbone (:data:`_RULES`), used by
the loader (through :func:`.official.convert_checkpoint`, on every load) and by
``tools/model_converters/paca_official_to_mm.py``. Two things are not a
rename: the conv clustering's 1x1 convs are stored by us as linears
((out, in, 1, 1) -> (out, in)), and the teacher's fixed blur kernels are
dropped (we rebuild them; they are not weights). Outside the backbone, only
the timm classifier's ``head.{weight,bias}`` is renamed (mmpretrain's
``LinearClsHead`` calls it ``head.fc``); the necks and heads of the official
detectors and segmentors (mmdet FPN / RPN / RoI heads, mmseg UPerHead /
FCNHead / the PaCa head) have the same names as the mm libraries' modules our
configs build, and are kept as they are.
"""
import re
from collections import OrderedDict
from typing import List, Mapping, Optional, Tuple

from ..models.backbones.paca import PaCaViT
from .keys import StateDict, strip_module_prefix

_STAGE = r'^stage(?P<i>\d+)\.(?P<b>\d+)\.'
_TEACHER = r'^paca_teacher\.'

# (official pattern, our key template). Official stage-like indices (i) are
# 1-based: {s} is i - 1 (stage{i}, norm{i}, block{i}, fpn{i}, ...), {i} keeps
# it (transition{i} leads into our 0-based stage i). {b} is a block index,
# {m} an attention sub-module, {r} the parameter name.
_RULES = [
    (r'^patch_embed\.proj\.0\.(?P<r>.+)$', 'stem.conv1.{r}'),
    (r'^patch_embed\.proj\.1\.(?P<r>.+)$', 'stem.conv2.{r}'),
    (r'^patch_embed\.norm\.(?P<r>.+)$', 'stem.norm.{r}'),
    (_STAGE + r'norm1_before\.(?P<r>.+)$', 'stages.{s}.blocks.{b}.norm1.{r}'),
    (_STAGE + r'norm2_before\.(?P<r>.+)$', 'stages.{s}.blocks.{b}.norm2.{r}'),
    (_STAGE + r'attn\.(?P<m>q|k|v|proj|cluster_norm)\.(?P<r>.+)$',
     'stages.{s}.blocks.{b}.attn.{m}.{r}'),
    (_STAGE + r'mlp\.fc1\.(?P<r>.+)$', 'stages.{s}.blocks.{b}.ffn.fc1.{r}'),
    (_STAGE + r'mlp\.dwconv\.dwconv\.(?P<r>.+)$',
     'stages.{s}.blocks.{b}.ffn.dwconv.{r}'),
    (_STAGE + r'mlp\.fc2\.(?P<r>.+)$', 'stages.{s}.blocks.{b}.ffn.fc2.{r}'),
    (r'^norm(?P<i>\d+)\.(?P<r>.+)$', 'stages.{s}.norm.{r}'),
    (r'^transition(?P<i>\d+)\.proj\.(?P<r>.+)$',
     'stages.{i}.downsample.conv.{r}'),
    (r'^transition(?P<i>\d+)\.norm\.(?P<r>.+)$',
     'stages.{i}.downsample.norm.{r}'),
    (r'^head\.(?P<r>weight|bias)$', 'head.fc.{r}'),
    (_TEACHER + r'block(?P<i>\d+)\.(?P<b>\d+)\.0\.fn\.0\.(?P<r>.+)$',
     'teacher.stages.{s}.{b}.dwconv.{r}'),
    (_TEACHER + r'block(?P<i>\d+)\.(?P<b>\d+)\.0\.fn\.2\.(?P<r>.+)$',
     'teacher.stages.{s}.{b}.norm1.{r}'),
    (_TEACHER + r'block(?P<i>\d+)\.(?P<b>\d+)\.1\.(?P<r>.+)$',
     'teacher.stages.{s}.{b}.pwconv.{r}'),
    (_TEACHER + r'block(?P<i>\d+)\.(?P<b>\d+)\.3\.(?P<r>.+)$',
     'teacher.stages.{s}.{b}.norm2.{r}'),
    (_TEACHER + r'transition(?P<i>\d+)\.0\.conv\.(?P<r>.+)$',
     'teacher.downsamples.{s}.conv.{r}'),
    (_TEACHER + r'transition(?P<i>\d+)\.2\.(?P<r>.+)$',
     'teacher.downsamples.{s}.norm.{r}'),
    (_TEACHER + r'lateral(?P<i>\d+)\.0\.(?P<r>.+)$',
     'teacher.laterals.{s}.conv.{r}'),
    (_TEACHER + r'lateral(?P<i>\d+)\.2\.(?P<r>.+)$',
     'teacher.laterals.{s}.norm.{r}'),
    (_TEACHER + r'fpn(?P<i>\d+)\.0\.fn\.0\.(?P<r>.+)$',
     'teacher.fpns.{s}.dwconv.{r}'),
    (_TEACHER + r'fpn(?P<i>\d+)\.0\.fn\.2\.(?P<r>.+)$',
     'teacher.fpns.{s}.norm1.{r}'),
    (_TEACHER + r'fpn(?P<i>\d+)\.1\.(?P<r>.+)$',
     'teacher.fpns.{s}.pwconv.{r}'),
    (_TEACHER + r'fpn(?P<i>\d+)\.3\.(?P<r>.+)$', 'teacher.fpns.{s}.norm2.{r}'),
    (_TEACHER + r'to_clusters(?P<i>\d+)\.(?P<r>.+)$',
     'teacher.to_clusters.{s}.{r}'),
]
# official Sequential index -> our name, per clustering network type
_CLUSTERING = {'conv': {'0': 'dwconv', '2': 'pwconv', '4': 'to_clusters'},
               'mlp': {'0': 'fc1', '2': 'fc2'}}
_CLUSTERING_KEY = re.compile(
    _STAGE + r'attn\.clustering\.clustering\.(?P<n>\d)\.(?P<r>.+)$')
_DROPPED = re.compile(_TEACHER + r'transition\d+\.0\.blur_filter$')


def _strip_wrappers(state: StateDict) -> Tuple[StateDict, List[str]]:
    """Drop ``module.``; keep only ``backbone.*`` of a detector/segmentor."""
    state = strip_module_prefix(state)
    if any(k.startswith('backbone.') for k in state):
        others = [k for k in state if not k.startswith('backbone.')]
        state = {k[len('backbone.'):]: v for k, v in state.items()
                 if k.startswith('backbone.')}
        return state, others
    return state, []


def convert_paca_official(state: StateDict) -> Tuple[StateDict, List[str]]:
    """Map official keys to ours.

    Accepts a raw state dict (timm release) or a detector / segmentor one
    (only its ``backbone.*`` keys are used). Returns the converted dict
    (the backbone under ``backbone.``, plus ``head.fc.weight/bias`` when the
    source has the ImageNet head: a classifier's keys, as the ClusTR
    converter gives them) and the source keys that were not converted
    (necks and heads of detectors, unknown keys). The teacher's fixed blur
    kernels are dropped, not reported.
    """
    state, skipped = _strip_wrappers(state)
    conv = re.compile(r'.*\.clustering\.clustering\.4\.')
    kind = 'conv' if any(conv.match(k) for k in state) else 'mlp'
    out = OrderedDict()
    for key, value in state.items():
        if _DROPPED.match(key):
            continue
        match = _CLUSTERING_KEY.match(key)
        if match:
            name = _CLUSTERING[kind].get(match['n'])
            if name is None:
                skipped.append(key)
                continue
            if name in ('pwconv', 'to_clusters') and value.dim() == 4:
                value = value.flatten(1)
            out[f'backbone.stages.{int(match["i"]) - 1}.blocks.{match["b"]}.'
                f'attn.clustering.{name}.{match["r"]}'] = value
            continue
        for pattern, template in _RULES:
            match = re.match(pattern, key)
            if match:
                new = _fill(template, match)
                out[new if new.startswith('head.fc.') else
                    f'backbone.{new}'] = value
                break
        else:
            skipped.append(key)
    return out, skipped


def _fill(template: str, match: re.Match) -> str:
    fields = match.groupdict()
    if 'i' in fields:
        fields['s'] = int(fields['i']) - 1
    return template.format(**fields)


def infer_paca_config(converted: StateDict) -> dict:
    """``PaCaViT`` kwargs reproducing converted weights (``backbone.*``
    keys, as :func:`convert_paca_official` gives them).

    The arch is given by name when it is one of the zoo's, else as a dict.
    Head counts are not recorded in weights; every official model uses
    (2, 4, 8, 16), which is assumed.
    """
    state = {k[len('backbone.'):]: v for k, v in converted.items()
             if k.startswith('backbone.')}

    def count(pattern):
        found = {}
        for key in state:
            m = re.match(pattern, key)
            if m:
                found.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
        return [len(found.get(i, ())) for i in range(4)]

    embed_dims = [state[f'stages.{i}.norm.weight'].shape[0] for i in range(4)]
    depths = count(r'stages\.(\d+)\.blocks\.(\d+)\.')
    mlp_ratios = [
        state[f'stages.{i}.blocks.0.ffn.fc1.weight'].shape[0] // embed_dims[i]
        for i in range(4)
    ]
    arch = dict(embed_dims=embed_dims, num_heads=[2, 4, 8, 16], depths=depths,
                mlp_ratios=mlp_ratios)
    if any(k.startswith('teacher.') for k in state):
        arch['teacher_depths'] = count(r'teacher\.stages\.(\d+)\.(\d+)\.')
        clusters = [
            state[f'teacher.to_clusters.{i}.weight'].shape[0]
            if f'teacher.to_clusters.{i}.weight' in state else 0
            for i in range(4)
        ]
        return dict(arch=_zoo_name(arch, 'teacher'), clustering='teacher',
                    num_clusters=clusters)

    kind = 'conv' if any('.clustering.to_clusters.' in k
                         for k in state) else 'mlp'
    last = 'to_clusters' if kind == 'conv' else 'fc2'
    clusters, owners = [], set()
    owner_key = re.compile(r'stages\.(\d+)\.blocks\.(\d+)\.attn\.clustering\.')
    for key in state:
        m = owner_key.match(key)
        if m:
            owners.add(int(m.group(2)))
    for i in range(4):
        key = f'stages.{i}.blocks.0.attn.clustering.{last}.weight'
        clusters.append(state[key].shape[0] if key in state else 0)
    interval = 0 if owners <= {0} else min(owners - {0})
    return dict(arch=_zoo_name(arch, kind), clustering=kind,
                num_clusters=clusters, clustering_interval=interval)


def _zoo_name(arch: dict, clustering: str):
    from ..models.backbones.paca import PaCaViT
    for name in PaCaViT.arch_zoo:
        named = PaCaViT.arch_settings(name, clustering)
        if all(list(named[k]) == list(v) for k, v in arch.items()):
            return name
    return arch


# The keys that identify an official PaCa-ViT backbone (timm names).
SIGNATURE = ('patch_embed.proj.0.weight', 'stage1.0.attn.q.weight')
TIMM = 'timm ImageNet classifier'
MMDET = 'mmdet detector'
MMSEG = 'mmseg segmentor'
BACKBONE_ONLY = 'downstream backbone'


def paca_official_layout(state: Mapping) -> Optional[str]:
    """Which official layout ``state`` (a state dict) has, or None."""
    if all(k in state for k in SIGNATURE):
        return TIMM
    if all(f'backbone.{k}' in state for k in SIGNATURE):
        if any(k.startswith('decode_head.') for k in state):
            return MMSEG
        if any(k.startswith(('neck.', 'rpn_head.', 'roi_head.', 'bbox_head.'))
               for k in state):
            return MMDET
        return BACKBONE_ONLY
    return None


# The release's own names (github.com/iVMCL/PaCaViT/releases): where its
# files live and how a model's setting is named in them, e.g.
# IMNET_224_pacavit_<variant>.pth with variant 'small_p2cconv_100_0'.
RELEASE_URL = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/'
# cluster counts per stage -> the name's last part
RELEASE_CLUSTER_NAMES = {
    (100, 100, 100, 0): '100_0', (2, 2, 2, 0): '2_0', (49, 49, 49, 0): '49_0',
    (49, 64, 81, 100): '49_100', (100, 81, 64, 49): '100_49',
    (100, 100, 100, 100): '100'}
# Backbone arguments that the names encode or that do not change the model;
# any other (e.g. a token reducer of ours) makes a model the release lacks.
RELEASE_NAMED_ARGS = frozenset({
    'type', 'arch', 'clustering', 'num_clusters', 'clustering_interval',
    'drop_path_rate', 'out_indices', 'init_cfg', 'frozen_stages',
    'norm_eval', '_delete_'})


def release_variant(backbone: Mapping) -> Optional[str]:
    """The release's name of a PaCa-ViT backbone setting (its constructor
    arguments), e.g. 'small_p2cconv_100_0'; None for a setting the release
    has no name for. Counts the release never used give 'unnamed'."""
    if set(backbone) - RELEASE_NAMED_ARGS:
        return None
    arch = backbone.get('arch', 'small')
    if not isinstance(arch, str):
        return None
    clustering = backbone.get('clustering', 'conv')
    if clustering == 'teacher':
        return f'convmixer_{arch}_100'
    clusters = tuple(backbone.get('num_clusters', (100, 100, 100, 0)))
    name = RELEASE_CLUSTER_NAMES.get(clusters, 'unnamed')
    if backbone.get('clustering_interval') == 1:
        name += '_blockwise'
    return f'{arch}_p2c{clustering}_{name}'
