"""PaCa-ViT's segmentation head: patch-to-cluster attention at stride 4.

The fused pyramid X (all levels at the stride-4 size, concatenated) is
summarised into one soft cluster per class; the clusters are the keys and
values of a single-head attention whose queries are all stride-4 positions.
In training the cluster logits are also scored as a segmentation (an
auxiliary cross-entropy), which is what makes the clusters follow classes.

Importing this module imports mmseg (it subclasses ``BaseDecodeHead``);
``clustr_mm.models.heads`` imports it when the mmseg scope is first used.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from mmcv.cnn import ConvModule, build_activation_layer, build_norm_layer
from mmengine.registry import MODELS
from mmseg.models.decode_heads.decode_head import BaseDecodeHead
from mmseg.models.losses import accuracy
from torch import nn

from ...registry import register_model


class _TokensToMap(nn.Module):
    """(B, M, C) tokens -> (B, C, M, 1), so any 2d norm layer applies."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).unsqueeze(-1)


class _MapToTokens(nn.Module):
    """(B, C, M, 1) -> (B, M, C)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(-1).transpose(1, 2)


def cluster_projection(in_channels: int, channels: int,
                       norm_cfg: Optional[dict], act_cfg: dict
                       ) -> nn.Sequential:
    """Linear -> norm over the channels of the cluster tokens -> activation.

    The norm is built from ``norm_cfg`` (BN on one process, SyncBN in DDP)
    and applied to the tokens laid out as a (B, C, M, 1) map. The Sequential
    indices (``0`` linear, ``2`` norm) are those of the released checkpoints.
    """
    norm = (build_norm_layer(norm_cfg, channels)[1]
            if norm_cfg is not None else nn.Identity())
    return nn.Sequential(
        nn.Linear(in_channels, channels), _TokensToMap(), norm,
        _MapToTokens(), build_activation_layer(act_cfg))


@register_model
class PaCaSegHead(BaseDecodeHead):
    """The PaCa-ViT segmentation head (mmseg decode head).

    1. Each input level: 1x1 conv block to ``channels`` C, bilinear resize
       to the first level's size; concatenated: X with L*C channels.
    2. Queries: 1x1 conv block L*C -> C at every position.
    3. Cluster logits: 1x1 conv block L*C -> C, then a 1x1 conv C ->
       ``num_classes`` M (with bias); soft-maxed over the positions, they
       pool X into M cluster tokens Z.
    4. Keys and values: :func:`cluster_projection` of Z.
    5. One attention head without the 1/sqrt(C) scale, a 1x1 conv block,
       and the classifier (``conv_seg``).

    ``forward`` returns the class logits only, in training too; ``loss``
    adds the auxiliary loss of the cluster logits (resized to the labels)
    under ``paca.<loss name>`` and its accuracy as ``paca.acc_seg``, so the
    stock ``EncoderDecoder`` logs them as ``decode.paca.*``.

    Args:
        aux_loss_decode (dict | Sequence[dict]): Loss(es) of the cluster
            logits. Default: cross-entropy, weight 0.4 (the release's).
        interpolate_mode (str): Resize mode of the levels. Default bilinear.
        **kwargs: :class:`BaseDecodeHead` arguments; ``input_transform`` is
            always 'multiple_select'. ``norm_cfg`` also builds the key and
            value norms.

    Parameter names match the released ``pacahead_*`` checkpoints
    (``convs.i``, ``q.0``, ``clustering.{0,1}``, ``k.{0,2}``, ``v.{0,2}``,
    ``proj``, ``conv_seg``): they load without renaming.
    """

    def __init__(self,
                 aux_loss_decode=dict(
                     type='CrossEntropyLoss', use_sigmoid=False,
                     loss_weight=0.4),
                 interpolate_mode: str = 'bilinear',
                 **kwargs):
        transform = kwargs.pop('input_transform', 'multiple_select')
        if transform != 'multiple_select':
            raise ValueError('PaCaSegHead fuses several levels: '
                             "input_transform must be 'multiple_select', got "
                             f'{transform!r}')
        super().__init__(input_transform='multiple_select', **kwargs)
        self.interpolate_mode = interpolate_mode
        num_inputs = len(self.in_channels)
        fused = self.channels * num_inputs

        def conv_block(in_channels):
            return ConvModule(in_channels, self.channels, 1,
                              conv_cfg=self.conv_cfg, norm_cfg=self.norm_cfg,
                              act_cfg=self.act_cfg)

        self.convs = nn.ModuleList(conv_block(c) for c in self.in_channels)
        # one-element Sequential: the released checkpoints' ``q.0.*`` keys
        self.q = nn.Sequential(conv_block(fused))
        self.clustering = nn.Sequential(
            conv_block(fused), nn.Conv2d(self.channels, self.num_classes, 1))
        self.k = cluster_projection(fused, self.channels, self.norm_cfg,
                                    self.act_cfg)
        self.v = cluster_projection(fused, self.channels, self.norm_cfg,
                                    self.act_cfg)
        self.proj = conv_block(self.channels)
        self.aux_loss_decode = self._build_losses(aux_loss_decode)

    @staticmethod
    def _build_losses(cfg) -> nn.Module:
        if isinstance(cfg, dict):
            return MODELS.build(cfg)
        if isinstance(cfg, (list, tuple)) and all(
                isinstance(c, dict) for c in cfg):
            return nn.ModuleList(MODELS.build(c) for c in cfg)
        raise TypeError('aux_loss_decode must be a dict or a list of dicts, '
                        f'got {type(cfg).__name__}')

    def fuse(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Selected levels -> X, (B, L*C, H, W) at the first level's size."""
        inputs = self._transform_inputs(inputs)
        size = inputs[0].shape[2:]
        outs = []
        for x, conv in zip(inputs, self.convs):
            x = conv(x)
            if x.shape[2:] != size:
                x = F.interpolate(x, size=size, mode=self.interpolate_mode,
                                  align_corners=self.align_corners)
            outs.append(x)
        return torch.cat(outs, dim=1)

    def forward_with_clusters(self, inputs: Sequence[torch.Tensor]
                              ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(class logits, cluster logits), both (B, M, H, W) at stride 4."""
        x = self.fuse(inputs)
        h, w = x.shape[2:]
        q = self.q(x).flatten(2).transpose(1, 2)  # B N C
        cluster_logits = self.clustering(x)  # B M H W
        assignment = cluster_logits.flatten(2).softmax(dim=-1)  # B M N
        z = assignment @ x.flatten(2).transpose(1, 2)  # B M LC
        k, v = self.k(z), self.v(z)  # B M C
        attn = (q @ k.transpose(1, 2)).softmax(dim=-1)  # B N M
        out = (attn @ v).transpose(1, 2).reshape(v.shape[0], -1, h, w)
        return self.cls_seg(self.proj(out)), cluster_logits

    def forward(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.forward_with_clusters(inputs)[0]

    def loss(self, inputs, batch_data_samples, train_cfg) -> dict:
        seg_logits, cluster_logits = self.forward_with_clusters(inputs)
        losses = self.loss_by_feat(seg_logits, batch_data_samples)
        for name, value in self.cluster_loss_by_feat(
                cluster_logits, batch_data_samples).items():
            losses[f'paca.{name}'] = value
        return losses

    def cluster_loss_by_feat(self, cluster_logits: torch.Tensor,
                             batch_data_samples: List) -> dict:
        """The auxiliary losses and accuracy of the cluster logits."""
        label = self._stack_batch_gt(batch_data_samples)
        logits = F.interpolate(cluster_logits, size=label.shape[2:],
                               mode='bilinear',
                               align_corners=self.align_corners)
        weight = (self.sampler.sample(logits, label)
                  if self.sampler is not None else None)
        label = label.squeeze(1)
        losses = {}
        criteria = (self.aux_loss_decode
                    if isinstance(self.aux_loss_decode, nn.ModuleList)
                    else [self.aux_loss_decode])
        for criterion in criteria:
            value = criterion(logits, label, weight=weight,
                              ignore_index=self.ignore_index)
            name = criterion.loss_name
            losses[name] = losses[name] + value if name in losses else value
        losses['acc_seg'] = accuracy(logits, label,
                                     ignore_index=self.ignore_index)
        return losses
