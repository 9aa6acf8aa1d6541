"""Restricted attention computed block by block (attention.local_attention) against the full
masked attention it replaces, outputs and gradients; and the model path that uses it."""

import pytest
import torch

from attnlab.attention import MultiHeadAttention, local_attention, local_mask, scaled_dot_product_attention


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t, window, block", [(37, 3, 8), (64, 1, None), (50, 20, 16), (9, 40, 4), (130, 5, 128)])
def test_blocks_equal_the_full_band_mask(causal, t, window, block):
    torch.manual_seed(t + window)
    q, k, v = (torch.randn(2, 3, t, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    got = local_attention(q, k, v, window, causal=causal, block=block)
    want = scaled_dot_product_attention(q, k, v, local_mask(t, t, window), causal=causal, return_weights=True)[0]
    close = dict(atol=1e-6, rtol=1e-5)  # (the fused kernel accumulates in its own order, even in float64)
    torch.testing.assert_close(got, want, **close)
    g = torch.randn_like(got)
    grads = torch.autograd.grad((got * g).sum(), (q, k, v))
    want_grads = torch.autograd.grad((want * g).sum(), (q, k, v))
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, **close)


def test_padding_in_the_band():
    torch.manual_seed(0)
    t = 24
    q, k, v = (torch.randn(2, 2, t, 4, dtype=torch.float64) for _ in range(3))
    key_mask = torch.ones(2, t, dtype=torch.bool)
    key_mask[1, 5:12] = False  # a stretch of padding wider than the window: some queries see nothing
    got = local_attention(q, k, v, 2, key_mask=key_mask, block=5)
    mask = local_mask(t, t, 2) & key_mask[:, None, None, :]
    want = scaled_dot_product_attention(q, k, v, mask, return_weights=True)[0]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert got[1, :, 8].abs().max() == 0  # position 8 has only padding within 2


@pytest.mark.parametrize("causal", [False, True])
def test_attention_with_a_window_takes_the_block_path_and_agrees_with_the_reference(causal):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, window=3, causal=causal).double().eval()
    x = torch.randn(2, 40, 16, dtype=torch.float64)
    calls = []
    import attnlab.attention as A

    real = A.local_attention

    def spy(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    A.local_attention = spy
    try:
        fast = mha(x)
        slow, weights = mha(x, need_weights=True)  # the reference path forms the weights
    finally:
        A.local_attention = real
    assert calls == [1]
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-5)
    i, j = torch.arange(40)[:, None], torch.arange(40)[None, :]
    outside = (i - j).abs() > 3 if not causal else ((i - j) > 3) | (j > i)
    assert weights[..., outside].abs().max() == 0


def test_vit_window_sees_its_patch_neighbourhood_and_the_class_token(tmp_path):
    """ViT --window r: a patch attends to the patches within r rows and r columns (a (2r+1)²
    neighbourhood, cut at the border), the class token to all and all to it; HF export refuses it;
    window 0 is refused."""
    import attnlab
    from attnlab.errors import CheckpointError
    from attnlab.models import ViT, ViTConfig

    torch.manual_seed(0)
    vit = ViT(ViTConfig(image_size=16, patch_size=4, in_chans=1, num_classes=3, dim=16, layers=1, heads=2, window=1))
    _, cache = vit.eval().run_with_cache(torch.randn(2, 1, 16, 16), names="encoder.blocks.0.attn.hook_pattern")
    seen = cache["encoder.blocks.0.attn.hook_pattern"][0, 0] > 0  # (17, 17): class token + a 4x4 grid
    assert seen[0].all() and seen[:, 0].all()
    for i in range(16):
        for j in range(16):
            near = abs(i // 4 - j // 4) <= 1 and abs(i % 4 - j % 4) <= 1
            assert bool(seen[1 + i, 1 + j]) == near, (i, j)
    assert seen[1 + 5].sum() == 1 + 9 and seen[1 + 0].sum() == 1 + 4  # an inner patch, a corner
    with pytest.raises(CheckpointError, match="window=1"):
        attnlab.export_hf(vit, tmp_path / "hf")
    with pytest.raises(ValueError, match=r"\(--window\): 0 is out of range: must be at least 1"):
        ViTConfig(window=0)
