"""The fused DPC-kNN against an IEEE fp32 implementation on random windows,
and Triton's interpreter switched on inside this process.

Shared by the interpreter tests (``test_dpc_knn_sizes.py``), the CUDA tier
(``test_cuda.py``) and the first-use check's tests.
"""
import contextlib
import sys

import pytest
import torch
from conftest import TORCH

try:
    import triton
    TRITON = tuple(int(v) for v in triton.__version__.split('.')[:2])
except ImportError:
    triton = TRITON = None

needs_triton = pytest.mark.skipif(
    TRITON is None or TRITON < (3, 2) or TORCH < (2, 4),
    reason=f'the fused op needs torch >= 2.4 (custom_op) and triton >= 3.2 '
    f'(interpreter with return_indices, GPUTarget); here torch '
    f'{torch.__version__}, triton {TRITON}')

# ids the fused op may change beyond the fp32 floor of fused_agreement:
# sampling noise of a few near-ties, in percentage points of the ids (the
# GPU tier's cases have 12,000 ids or more: batch 2 of 196 tokens, one
# near-tie flipped is 0.26 %, and 5 of 392 flipped in 'tf32x3' on an H200,
# 2026-11-27, all near-ties)
ID_SLACK_PCT = 0.05
# ClusTR-S at 224 in exact mode: per stage (grid, channels, sr_ratio)
EXACT_224 = {'3136x64': ((56, 56), 64, 8), '784x128': ((28, 28), 128, 4),
             '196x256': ((14, 14), 256, 2)}
# ClusTR-S window mode at 800 x 1344, stage 1: 200 x 336 tokens, 56-token
# windows (3 x 6 full ones, 6 border ones of 32 x 56 tokens, padded)
WINDOW_800 = ((200, 336), 56, 64, 8)


@contextlib.contextmanager
def interpreted(*modules):
    """Run the Triton kernels of ``modules`` (and of triton.language) under
    Triton's interpreter, on the CPU, in this process.

    Triton decides at decoration time whether a ``@triton.jit`` function is
    interpreted (``TRITON_INTERPRET=1`` before import); this swaps every
    jit function of those modules for an interpreted one for the duration,
    and sets the interpreter knob, so no child process is needed.
    """
    from triton import knobs
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    mods = [m for name, m in list(sys.modules.items())
            if name.startswith('triton.language') and m is not None]
    swaps = []
    try:
        for mod in mods + list(modules):
            for name, obj in list(vars(mod).items()):
                if isinstance(obj, JITFunction):
                    swaps.append((mod, name, obj))
                    setattr(mod, name, InterpretedFunction(obj.fn))
        old, knobs.runtime.interpret = knobs.runtime.interpret, True
        try:
            yield
        finally:
            knobs.runtime.interpret = old
    finally:
        for mod, name, obj in reversed(swaps):
            setattr(mod, name, obj)


def windows(hw, window_size, sr_ratio, channels, batch, device='cpu',
            seed=0):
    """Random-normal fp32 windows of a grid as the clustering sees them
    under the fused plan (border windows padded into one group):
    (x (G, n, C) zero at padding, counts, Windows)."""
    from clustr_mm.ops.dpc_knn import FUSED_PLAN, WindowLayout, batch_consts
    layout = WindowLayout(hw, window_size, sr_ratio, device=device,
                          plan=FUSED_PLAN)
    (group, ) = layout.groups
    consts = batch_consts(layout, batch, channels).groups[0].windows
    gen = torch.Generator().manual_seed(seed)
    g = batch * group.grid[0] * group.grid[1]
    n = group.window[0] * group.window[1]
    x = torch.randn(g, n, channels, generator=gen).to(device)
    if consts.invalid is not None:
        x = x.masked_fill(consts.invalid[..., None], 0.0)
    return x, [group.counts[s] for s in layout.clustered], consts


def fused_agreement(x, counts, consts, precision='ieee', k=5, prune=False):
    """:func:`~clustr_mm.ops.dpc_knn.agreement.compare` of the
    fused kernels (``precision``; ``prune``: their layout with pass 2
    pruned, ``fused.kernel_config(..., prune=True)``) with the reference
    (IEEE fp32) on the same windows; also the ids the reference gives with
    its channels reversed (fp32 summed in another order:
    ``precision_check.py``'s round-off floor), as ``reordered`` (% of ids
    that differ), and how often each of these and the fused op differ
    from the reference evaluated in fp64 (``fused_exact_pct``, and the
    largest of the fp32 ones, ``fp32_exact_pct``): on a GPU the reordered
    references can round exactly as the reference does (cuBLAS adds the
    norm columns last either way: 0 ids changed on 196 x 256 tokens,
    2026-11-28) while the fused op, as exact as they are, differs from it
    at near-ties; under the interpreter the fp32 reference itself is the
    furthest from fp64 of the four there (4 of 12,152 ids; the fused op
    0)."""
    from clustr_mm.ops.dpc_knn import FUSED_PLAN, fused
    from clustr_mm.ops.dpc_knn.agreement import compare
    from clustr_mm.ops.dpc_knn.reference import dpc_knn_reference
    ref = {}
    config = fused.kernel_config(x.device, x.shape[2], precision, prune)
    got_ids, got = fused.probed(x, counts, k, consts,
                                FUSED_PLAN._replace(precision=precision),
                                config)
    ref_ids = dpc_knn_reference(x, counts, k, consts, probe=ref)
    report = compare(x, counts, consts, ref, got, ref_ids, got_ids,
                     precision)
    valid = (torch.ones_like(x[..., 0], dtype=torch.bool)
             if consts.invalid is None else ~consts.invalid)
    total = int(valid.sum()) * len(counts)
    report['ids'] = total
    report['fused_pct'] = 100 * report['id_mismatches'] / total
    others = list(reorderings(x, counts, k, consts))
    report['reordered_pct'] = max(
        100 * int(((ids != ref_ids) & valid).sum()) / total
        for ids in others)
    exact = dpc_knn_reference(x.double(), counts, k, consts)

    def exact_pct(ids):
        return 100 * int(((ids != exact) & valid).sum()) / total

    report['fused_exact_pct'] = exact_pct(got_ids)
    report['fp32_exact_pct'] = max(map(exact_pct, [ref_ids] + others))
    return report


def reorderings(x, counts, k, consts):
    """Ids of the reference evaluating its fp32 sums in other orders (the
    same algorithm, other round-off): its channels reversed, and its
    distances as |a|^2 + |b|^2 - 2 a.b with the norms added after the
    products (as the fused kernels add them) instead of inside one GEMM."""
    from clustr_mm.ops.dpc_knn import reference as ref
    yield ref.dpc_knn_reference(x.flip(-1), counts, k, consts)
    original = torch.bmm

    def norms_after(rows, cols):
        c = rows.shape[-1] - 2
        return (original(rows[..., :c], cols[:, :c])
                + rows[..., c:c + 1] + cols[:, c + 1:])

    ref.torch.bmm = norms_after
    try:
        yield ref.dpc_knn_reference(x, counts, k, consts)
    finally:
        ref.torch.bmm = original
