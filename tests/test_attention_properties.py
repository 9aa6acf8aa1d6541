"""Property tests (hypothesis) of attention over random shapes, masks, biases and dtypes: the
fused fast path equals the readable reference path, rows of P sum to 1 (or 0 when a query may
attend to nothing), and no NaN reaches outputs or gradients."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention import scaled_dot_product_attention

shapes = st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 9), st.integers(1, 9), st.integers(1, 16))


@settings(max_examples=60, deadline=None)
@given(
    shape=shapes,
    causal=st.booleans(),
    use_mask=st.booleans(),
    use_bias=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_fast_path_equals_reference_and_weights_are_distributions(shape, causal, use_mask, use_bias, dtype, seed):
    b, h, t_q, t_k, d = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t_q, d, generator=g).to(dtype).requires_grad_()
    k = torch.randn(b, h, t_k, d, generator=g).to(dtype).requires_grad_()
    v = torch.randn(b, h, t_k, d, generator=g).to(dtype).requires_grad_()
    mask = torch.rand(b, 1, t_q, t_k, generator=g) > 0.3 if use_mask else None  # rows may be all False
    bias = torch.randn(1, h, t_q, t_k, generator=g).to(dtype) if use_bias else None

    ref, w = scaled_dot_product_attention(q, k, v, mask, causal=causal, bias=bias, return_weights=True)
    fast = scaled_dot_product_attention(q, k, v, mask, causal=causal, bias=bias)
    tol = 1e-5 if dtype == torch.float32 else 3e-2  # bf16: 8 mantissa bits
    assert torch.allclose(fast.float(), ref.float(), atol=tol, rtol=tol)

    allowed = torch.ones(b, h, t_q, t_k, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask
    if causal:
        allowed = allowed & torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q)
    sums = w.float().sum(-1)
    any_allowed = allowed.any(-1)
    assert torch.allclose(sums[any_allowed], torch.ones_like(sums[any_allowed]), atol=tol)
    assert torch.all(sums[~any_allowed] == 0)  # a query with nothing to attend to gets no weight
    assert torch.all(w[~allowed] == 0)  # masked (future, padding) weights are exactly 0
    assert torch.all(ref[~any_allowed] == 0)

    (fast.float().sum() + ref.float().sum()).backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.isfinite(fast).all() and torch.isfinite(ref).all()


@settings(max_examples=30, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_matches_torch_sdpa_without_masks(shape, seed):
    b, h, t_q, t_k, d = shape
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, t, d, generator=g) for t in (t_q, t_k, t_k))
    expected = torch.softmax(q @ k.transpose(-2, -1) / d**0.5, -1) @ v  # the lecture's equations
    _, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    assert torch.allclose(scaled_dot_product_attention(q, k, v), expected, atol=1e-5)
    assert torch.allclose(w, torch.softmax(q @ k.transpose(-2, -1) / d**0.5, -1), atol=1e-6)
