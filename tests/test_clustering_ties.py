"""Identical tokens are exactly 0 apart, so ties resolve the same whatever
the batch: an image clusters alike alone and beside other images."""
import pytest
import torch

import clustr_mm  # noqa: F401
from clustr_mm.models.backbones.clustr import ClusTR
from clustr_mm.models.layers.dpc_knn import DPCKNN
from clustr_mm.ops.dpc_knn.reference import augment, tie_tolerance

pytestmark = pytest.mark.torch21

torch.set_num_threads(2)


def _constant(shape):
    x = torch.randn(*shape)
    x[0] = -0.3
    return x


def _tiled(shape):
    """Image 0 repeats one 16 x 16 patch: every token has duplicates."""
    x = torch.randn(*shape)
    b, c, h, w = shape
    x[0] = x[0, :, :16, :16].repeat(1, h // 16, w // 16)
    return x


def _stage_tokens(model, x):
    """(reducer, tokens, hw) of every clustering call of one forward."""
    calls = []

    def grab(module, args, kwargs, output):
        calls.append((module, args[0].detach(), kwargs['hw']))

    handles = [m.register_forward_hook(grab, with_kwargs=True)
               for m in model.modules() if isinstance(m, DPCKNN)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return calls


@pytest.mark.parametrize('mode', ['exact', 'window'])
def test_image_clusters_alike_alone_and_in_a_batch(mode):
    """The tokens of a constant image (many identical ones) give the same
    cluster ids and tokens alone and, with the round-off of batched layers
    (a few ulps), beside two other images, at every clustering call.

    (A periodic image also has distinct tokens whose densities are equal
    only by symmetry; round-off of that size may order those, as it may any
    near-tie: only identical tokens are exact ties.)"""
    torch.manual_seed(0)
    model = ClusTR('tiny', clustering_mode=mode, window_size=8).eval()
    x = _constant((3, 3, 72, 88))
    for reducer, tokens, hw in _stage_tokens(model, x[:1]):
        others = torch.randn(2, *tokens.shape[1:]) * tokens.std()
        noise = torch.randn(tokens.shape) * tokens.abs() * 2.0**-22
        batch = torch.cat([tokens + noise, others])
        w = torch.ones(3, tokens.shape[1], 1)
        alone = reducer(tokens, hw, w[:1])
        beside = reducer(batch, hw, w)
        for a, b in zip(alone[1], beside[1]):
            assert torch.equal(a, b[:1])
        for a, b in zip(alone[0], beside[0]):
            torch.testing.assert_close(a, b[:1], rtol=0, atol=1e-5)


@pytest.mark.parametrize('mode', ['exact', 'window'])
@pytest.mark.parametrize('image,shape', [
    (_constant, (3, 3, 96, 96)), (_tiled, (3, 3, 96, 96))],
    ids=['constant', 'duplicated'])
def test_outputs_alike_alone_and_in_a_batch(mode, image, shape):
    """Through the whole model the image's tokens themselves differ by the
    round-off of batched convolutions and linears (~1e-6), which stays
    that small only if clustering ties do not flip."""
    torch.manual_seed(0)
    model = ClusTR('tiny', clustering_mode=mode, window_size=8).eval()
    x = image(shape)
    with torch.no_grad():
        batch, alone = model(x), model(x[:1])
    for a, b in zip(batch, alone):
        torch.testing.assert_close(a[:1], b, rtol=0, atol=1e-4)


def test_identical_tokens_fall_below_the_tie_threshold():
    torch.manual_seed(1)
    x = torch.randn(1, 40, 320) * 100
    x[0, 20:] = x[0, :20]
    rows, cols, tie = augment(x)
    d = torch.bmm(rows, cols)
    same = torch.arange(40) % 20
    dup = same[:, None] == same[None, :]
    assert (d[0][dup] <= tie[0][:, None].expand(-1, 40)[dup]).all()
    # and distinct tokens stay far above it
    assert (d[0][~dup] > 1e3 * tie[0][:, None].expand(-1, 40)[~dup]).all()
    assert tie_tolerance(64) < 4e-5
