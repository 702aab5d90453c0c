"""FLOP counting that includes attention and clustering work.

``mmengine.analysis.FlopAnalyzer`` (fvcore's jit-trace counter, one
multiply-add = one FLOP) counts convolutions, linears and matmuls but has no
handle for fused attention, so attention-heavy models look cheaper than they
are. We add handles, under the same one-MAC-one-FLOP convention:

- ``aten::scaled_dot_product_attention``: ``B*H*N*M*(d_k + d_v)`` (q k^T and
  the weighted sum of v); the softmax is not counted, as for any other model.
- ``aten::_native_multi_head_attention`` (``nn.MultiheadAttention``'s fused
  inference path, used by peers such as PVTv2): the four projections plus the
  attention products.
- Clustering work, explicitly: the distance matrices of DPC-kNN are ``bmm``
  (counted by the default handle); ``aten::topk`` and ``aten::sort`` count
  one comparison per input element; ``aten::index_add``/``scatter_add`` (the
  cluster merges) and ``aten::cdist`` count one FLOP per MAC they do.
"""
from collections import Counter
from typing import Sequence

import torch
from mmengine.analysis import FlopAnalyzer
from mmengine.analysis.jit_handles import get_shape


def _prod(shape):
    out = 1
    for s in shape:
        out *= s
    return out


def sdpa_flop(inputs, outputs):
    q, k, v = (get_shape(t) for t in inputs[:3])
    *batch, n, dk = q
    m, dv = k[-2], v[-1]
    return _prod(batch) * n * m * (dk + dv)


def native_mha_flop(inputs, outputs):
    q, k = get_shape(inputs[0]), get_shape(inputs[1])
    b, n, c = q
    m = k[1]
    # q, k, v, out projections + q k^T + attn v
    return b * (2 * n * c * c + 2 * m * c * c + 2 * n * m * c)


def scan_flop(inputs, outputs):
    """topk/sort: one comparison per input element."""
    return _prod(get_shape(inputs[0]))


def merge_flop(inputs, outputs):
    """index_add / scatter_add: one add per source element (input 3)."""
    return _prod(get_shape(inputs[3]))


def cdist_flop(inputs, outputs):
    x1, x2 = get_shape(inputs[0]), get_shape(inputs[1])
    return _prod(x1) * x2[-2]


EXTRA_HANDLES = {
    'aten::scaled_dot_product_attention': sdpa_flop,
    'aten::_native_multi_head_attention': native_mha_flop,
    'aten::topk': scan_flop,
    'aten::sort': scan_flop,
    'aten::index_add': merge_flop,
    'aten::index_add_': merge_flop,
    'aten::scatter_add': merge_flop,
    'aten::scatter_add_': merge_flop,
    'aten::cdist': cdist_flop,
}


def flop_analyzer(model: torch.nn.Module, inputs) -> FlopAnalyzer:
    """A FlopAnalyzer with the attention and clustering handles registered."""
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.set_op_handle(**EXTRA_HANDLES)
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    return analyzer


def count_flops(model: torch.nn.Module, shape: Sequence[int]) -> Counter:
    """FLOPs of one ``model(x)`` with ``x`` of ``shape``, by operator."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return Counter(flop_analyzer(model, torch.zeros(*shape)).by_operator())
    finally:
        model.train(was_training)
