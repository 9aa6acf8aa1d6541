import math

import pytest
import torch
from torch import nn

from attnlab.attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention
from helpers import copy_attention


def test_lecture_worked_example():
    # q·k1 = 102, q·k2 = 99, d_k = 3  ->  58.9 and 57.2  ->  0.85 / 0.15
    q = torch.tensor([[[1.0, 10.0, 1.0]]])  # chosen so the dot products are 102 and 99
    k = torch.tensor([[[2.0, 10.0, 0.0], [1.0, 9.8, 0.0]]])
    k[0, 1, 2] = 99 - (1.0 * 1 + 10 * 9.8)
    scores = (q @ k.transpose(-2, -1))[0, 0]
    assert torch.allclose(scores, torch.tensor([102.0, 99.0]))
    v = torch.eye(2)[None]
    out, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    scaled = scores / math.sqrt(3)
    assert round(scaled[0].item(), 1) == 58.9  # 102 / sqrt(3) = 58.89
    assert round(scaled[1].item(), 1) == 57.2  # 99 / sqrt(3) = 57.16
    assert w[0, 0, 0].item() == pytest.approx(0.85, abs=0.01)
    assert w[0, 0, 1].item() == pytest.approx(0.15, abs=0.01)
    assert torch.allclose(out[0, 0], w[0, 0])  # V = I returns the weights


def test_rows_sum_to_one():
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
    _, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    assert torch.allclose(w.sum(-1), torch.ones(2, 3, 5), atol=1e-6)
    assert (w >= 0).all()


def test_causal_mask_shape_and_alignment():
    m = causal_mask(3)
    assert m.tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    m = causal_mask(2, 4)  # queries at positions 2 and 3 of 4
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_causal_no_gradient_from_future():
    x = torch.randn(1, 6, 16, requires_grad=True)
    mha = MultiHeadAttention(16, 4, causal=True)
    out = mha(x)
    t = 2
    out[0, t].sum().backward()
    assert x.grad[0, t + 1 :].abs().max() == 0
    assert x.grad[0, : t + 1].abs().max() > 0


def test_padding_gets_zero_weight_and_does_not_matter():
    mha = MultiHeadAttention(16, 2).eval()
    x = torch.randn(2, 5, 16)
    key_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    out1, w = mha(x, key_mask=key_mask, need_weights=True)
    assert (w[1, :, :, 3:] == 0).all()
    x2 = x.clone()
    x2[1, 3:] = torch.randn(2, 16) * 100
    out2 = mha(x2, key_mask=key_mask)
    assert torch.allclose(out1[:, :3], out2[:, :3], atol=1e-5)
    assert torch.allclose(out1[0], out2[0])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("use_mask", [False, True])
def test_reference_and_fast_paths_agree(causal, use_mask):
    q = torch.randn(2, 3, 9, 8, requires_grad=True)
    k = torch.randn(2, 3, 9, 8, requires_grad=True)
    v = torch.randn(2, 3, 9, 5, requires_grad=True)
    mask = torch.rand(2, 1, 9, 9) > 0.3 if use_mask else None
    bias = torch.randn(3, 9, 9)
    ref, _ = scaled_dot_product_attention(q, k, v, mask, causal=causal, bias=bias, return_weights=True)
    g_ref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    fast = scaled_dot_product_attention(q, k, v, mask, causal=causal, bias=bias)
    g_fast = torch.autograd.grad(fast.square().sum(), (q, k, v))
    assert torch.allclose(ref, fast, atol=1e-5)
    for a, b in zip(g_ref, g_fast):
        assert torch.allclose(a, b, atol=1e-4)


def test_fully_masked_row_is_zero_in_both_paths():
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    ref, w = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    fast = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(ref).all() and torch.isfinite(fast).all()
    assert (w[0, 0, 1] == 0).all() and (ref[0, 0, 1] == 0).all()
    assert torch.allclose(ref, fast, atol=1e-6)


def test_self_attention_equals_torch_mha_with_masks():
    d, h = 32, 4
    ours = MultiHeadAttention(d, h).eval()
    theirs = nn.MultiheadAttention(d, h, batch_first=True).eval()
    copy_attention(ours, theirs)
    x = torch.randn(3, 7, d)
    key_mask = torch.ones(3, 7, dtype=torch.bool)
    key_mask[1, 5:] = False
    causal = causal_mask(7)
    out, w = ours(x, mask=causal, key_mask=key_mask, need_weights=True)
    ref, ref_w = theirs(x, x, x, attn_mask=~causal, key_padding_mask=~key_mask, average_attn_weights=False)
    assert torch.allclose(out, ref, atol=1e-5)
    assert torch.allclose(w, ref_w, atol=1e-5)
    fast = ours(x, mask=causal, key_mask=key_mask)
    assert torch.allclose(fast, ref, atol=1e-5)


def test_cross_attention_equals_torch_mha():
    d, h = 24, 3
    ours = MultiHeadAttention(d, h, cross=True).eval()
    theirs = nn.MultiheadAttention(d, h, batch_first=True).eval()
    copy_attention(ours, theirs)
    x, ctx = torch.randn(2, 4, d), torch.randn(2, 9, d)
    key_mask = torch.ones(2, 9, dtype=torch.bool)
    key_mask[0, 6:] = False
    out = ours(x, ctx, key_mask=key_mask)
    ref, _ = theirs(x, ctx, ctx, key_padding_mask=~key_mask)
    assert torch.allclose(out, ref, atol=1e-5)


def test_cross_attention_other_width_and_dk_dv():
    mha = MultiHeadAttention(16, 2, d_context=40, d_k=5, d_v=7, d_out=11)
    out, w = mha(torch.randn(2, 3, 16), torch.randn(2, 6, 40), need_weights=True)
    assert out.shape == (2, 3, 11) and w.shape == (2, 2, 3, 6)


def test_grouped_query_attention_equals_repeated_heads():
    d, h, kv = 32, 4, 2
    gqa = MultiHeadAttention(d, h, n_kv_heads=kv).eval()
    full = MultiHeadAttention(d, h).eval()
    dk = d // h
    with torch.no_grad():
        wq, wk, wv = gqa.qkv.weight.split([h * dk, kv * dk, kv * dk])
        bq, bk, bv = gqa.qkv.bias.split([h * dk, kv * dk, kv * dk])
        rep = lambda t: t.reshape(kv, dk, *t.shape[1:]).repeat_interleave(h // kv, 0).reshape(h * dk, *t.shape[1:])
        full.qkv.weight.copy_(torch.cat([wq, rep(wk), rep(wv)]))
        full.qkv.bias.copy_(torch.cat([bq, rep(bk), rep(bv)]))
        full.out_proj.load_state_dict(gqa.out_proj.state_dict())
    x = torch.randn(2, 5, d)
    assert torch.allclose(gqa(x), full(x), atol=1e-5)


@pytest.mark.parametrize("in_kernel", [True, False])
def test_grouped_query_attention_in_the_kernel_or_by_copied_heads(in_kernel, monkeypatch):
    """Both sides of the choice: the fused kernel's grouped-query attention (torch 2.5 on, on the CPU,
    and on a GPU when unmasked) and K/V heads copied to every query head give the same outputs,
    causal and with padding; a masked call on another device copies (its kernel would fall back)."""
    import attnlab.attention as A

    if in_kernel and not A.KERNEL_GQA:
        pytest.skip("this torch has no enable_gqa")
    monkeypatch.setattr(A, "KERNEL_GQA", in_kernel)
    torch.manual_seed(0)
    gqa = MultiHeadAttention(32, 4, n_kv_heads=2, causal=True).eval()
    x, keep = torch.randn(2, 6, 32), torch.tensor([[True] * 6, [False, False] + [True] * 4])
    with torch.no_grad():
        monkeypatch.setattr(A, "KERNEL_GQA", False)
        copied = gqa(x), gqa(x, key_mask=keep)
        monkeypatch.setattr(A, "KERNEL_GQA", in_kernel)
        got = gqa(x), gqa(x, key_mask=keep)
    for a, b in zip(got, copied):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    meta = torch.empty(1, device="meta")
    assert MultiHeadAttention._kernel_groups(meta, masked=True) is False
    assert MultiHeadAttention._kernel_groups(meta, masked=False) is in_kernel
    assert MultiHeadAttention._kernel_groups(x, masked=True) is in_kernel


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_kv_cache_decoding_equals_full_forward(n_kv_heads):
    mha = MultiHeadAttention(32, 4, causal=True, n_kv_heads=n_kv_heads).eval()
    x = torch.randn(2, 10, 32)
    full = mha(x)
    cache = mha.new_cache(2, 16)
    prefix = mha(x[:, :4], cache=cache)
    steps = [mha(x[:, t : t + 1], cache=cache) for t in range(4, 10)]
    inc = torch.cat([prefix, *steps], dim=1)
    assert torch.allclose(full, inc, atol=1e-5)


def test_attnlab_scores_are_scaled_so_softmax_does_not_saturate():
    # The lecture's reason for 1/sqrt(d_k): q·k has variance d_k, so attnlab's scores must be the
    # dot products divided by sqrt(d_k) (unit variance at every d_k), and the weights attnlab
    # returns must keep their entropy as d_k grows, where softmax of the raw products collapses.
    from attnlab.attention import attention_scores

    t = 32
    for d_k in (16, 256, 1024):
        q, k, v = torch.randn(16, t, d_k), torch.randn(16, t, d_k), torch.randn(16, t, 4)
        s = attention_scores(q, k)
        assert torch.allclose(s, torch.einsum("bqd,bkd->bqk", q, k) / math.sqrt(d_k), atol=1e-4)
        assert s.std().item() == pytest.approx(1.0, rel=0.1)
        _, w = scaled_dot_product_attention(q, k, v, return_weights=True)
        entropy = -(w * w.clamp_min(1e-30).log()).sum(-1).mean().item()
        raw = torch.softmax(torch.einsum("bqd,bkd->bqk", q, k), -1)
        raw_entropy = -(raw * raw.clamp_min(1e-30).log()).sum(-1).mean().item()
        assert entropy > 0.6 * math.log(t)  # spread over many keys at every d_k
        if d_k >= 256:
            assert raw_entropy < 0.3 * math.log(t)  # unscaled: nearly one-hot


def test_bad_shapes_raise_value_error_naming_shapes():
    with pytest.raises(ValueError, match="d_model=30 is not divisible by n_heads=4"):
        MultiHeadAttention(30, 4)
    with pytest.raises(ValueError, match=r"q\(1, 2, 8\) vs k\(1, 2, 6\)"):
        scaled_dot_product_attention(torch.randn(1, 2, 8), torch.randn(1, 2, 6), torch.randn(1, 2, 6))
    with pytest.raises(ValueError, match=r"k\(1, 3, 8\) vs v\(1, 2, 8\)"):
        scaled_dot_product_attention(torch.randn(1, 2, 8), torch.randn(1, 3, 8), torch.randn(1, 2, 8))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 3\)"):
        scaled_dot_product_attention(
            torch.randn(1, 2, 8), torch.randn(1, 4, 8), torch.randn(1, 4, 8), torch.ones(3, 3, dtype=torch.bool)
        )
    mha = MultiHeadAttention(16, 2)
    with pytest.raises(ValueError, match=r"\(B, T, 16\), got \(2, 3, 12\)"):
        mha(torch.randn(2, 3, 12))
    with pytest.raises(ValueError, match="key_mask"):
        mha(torch.randn(2, 3, 16), key_mask=torch.ones(2, 4, dtype=torch.bool))


def _by_hand(q, k, v, scale, causal):
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        t = s.shape[-1]
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


@pytest.mark.parametrize("window", [None, 2])
def test_score_scale_option_by_hand(window):
    """scale=1.0 gives softmax(QKᵀ)V, unscaled, on the fused, reference and windowed paths."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 1, causal=True, scale=1.0, window=window).eval()
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        q, k, v = mha.qkv(x).split(32, -1)
        z = _by_hand(q, k, v, 1.0, True) if window is None else None
        fused, (ref, _) = mha(x), mha(x, need_weights=True)
    assert torch.allclose(fused, ref, atol=1e-5)
    if z is not None:
        assert torch.allclose(fused, mha.out_proj(z), atol=1e-5)
        default = MultiHeadAttention(32, 1, causal=True).eval()
        default.load_state_dict(mha.state_dict())
        with torch.no_grad():
            assert torch.allclose(default(x), mha.out_proj(_by_hand(q, k, v, 32**-0.5, True)), atol=1e-5)
            assert not torch.allclose(default(x), fused, atol=1e-3)


def test_tied_projections():
    """tie='qk': keys are the queries, so the scores are symmetric; tie='kv': values are the keys;
    either makes a third fewer input-projection weights. Cross-attention refuses a tie."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    full = MultiHeadAttention(16, 2)
    for tie in ("qk", "kv"):
        mha = MultiHeadAttention(16, 2, tie=tie).eval()
        assert mha.qkv.weight.shape == (32, 16) and full.qkv.weight.shape == (48, 16)
        _, cache = _run_hooked(mha, x)
        q, k, v, scores = cache["hook_q"], cache["hook_k"], cache["hook_v"], cache["hook_scores"]
        if tie == "qk":
            assert torch.equal(q, k) and torch.allclose(scores, scores.transpose(-1, -2), atol=1e-6)
        else:
            assert torch.equal(k, v) and not torch.equal(q, k)
    with pytest.raises(ValueError, match="self-attention only"):
        MultiHeadAttention(16, 2, cross=True, tie="qk")
    with pytest.raises(ValueError, match="tie must be"):
        MultiHeadAttention(16, 2, tie="qv")


def _run_hooked(mha, x):
    """Every hook point's value (HookPoint.add: the mechanism models' caches use)."""
    seen = {}
    detach = [
        getattr(mha, name).add(lambda v, hook, name=name: seen.__setitem__(name, v))
        for name in ("hook_q", "hook_k", "hook_v", "hook_scores")
    ]
    try:
        with torch.no_grad():
            out = mha(x)
    finally:
        for d in detach:
            d()
    return out, seen
