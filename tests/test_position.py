import math

import pytest
import torch

from attnlab.attention import MultiHeadAttention
from attnlab.position import (
    ALiBi,
    PEG,
    FourierFeatures,
    LearnedPosition,
    RelativePosition,
    RotaryEmbedding,
    SinCos2DPosition,
    SinusoidalPosition,
    alibi_slopes,
    sinusoidal_encoding,
)


def test_sinusoidal_matches_formula():
    pe = sinusoidal_encoding(50, 16)
    for pos in (0, 3, 49):
        for i in range(8):
            w = 1 / 10000 ** (2 * i / 16)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(pos * w), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos * w), abs=1e-6)


def test_sinusoidal_offset_is_a_fixed_linear_map():
    # For every k there is one matrix M_k with PE(pos + k) = M_k PE(pos) for all pos.
    pe = sinusoidal_encoding(200, 32).double()
    for k in (1, 5, 17):
        a, b = pe[:-k], pe[k:]
        m = torch.linalg.lstsq(a, b).solution  # fitted from all positions at once
        assert torch.allclose(a @ m, b, atol=1e-6)
        # and it is the block rotation the lecture writes down
        w = 1 / 10000 ** (torch.arange(0, 32, 2).double() / 32)
        rot = torch.zeros(32, 32, dtype=torch.float64)
        for i, wi in enumerate(w):
            c, s = math.cos(k * wi), math.sin(k * wi)
            rot[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, s], [-s, c]])  # (sin, cos) pair
        assert torch.allclose(pe[:-k] @ rot.T, pe[k:], atol=1e-5)


def test_absolute_modules_add_encoding():
    x = torch.zeros(2, 5, 8)
    assert torch.allclose(SinusoidalPosition(8, 16)(x)[0], sinusoidal_encoding(5, 8))
    lp = LearnedPosition(8, 16)
    assert torch.allclose(lp(x, offset=3)[1], lp.weight[3:8])
    with pytest.raises(ValueError, match="longer than the 16"):
        lp(torch.zeros(1, 17, 8))


def test_sincos_2d_matches_the_mae_closed_form():
    """MAE (He et al. 2022) / big_vision: for a patch at column w, row h and width D, the first D/2
    values are [sin(w·ω_i), cos(w·ω_i)] and the last D/2 the same of h, ω_i = 10000^(-i/(D/4))."""
    dim, gh, gw = 16, 3, 4
    pe = SinCos2DPosition(dim, (gh, gw)).pe.reshape(gh, gw, dim)
    quarter = dim // 4
    for h in range(gh):
        for w in range(gw):
            expected = []
            for coord in (w, h):
                expected += [math.sin(coord / 10000 ** (i / quarter)) for i in range(quarter)]
                expected += [math.cos(coord / 10000 ** (i / quarter)) for i in range(quarter)]
            assert torch.allclose(pe[h, w], torch.tensor(expected), atol=1e-6), (h, w)


def test_fourier_features():
    ff = FourierFeatures(2, n_features=8, sigma=1.0)
    coords = torch.rand(5, 2)
    out = ff(coords)
    phase = 2 * math.pi * coords @ ff.B.T
    assert torch.allclose(out, torch.cat([phase.cos(), phase.sin()], -1), atol=1e-6)
    assert FourierFeatures(2, 8, dim=12)(coords).shape == (5, 12)


def test_rope_depends_only_on_offset():
    rope = RotaryEmbedding(16)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
    dots = {}
    for m, n in [(3, 1), (10, 8), (52, 50), (5, 9), (41, 45)]:
        qm = rope(q, torch.tensor([m]))
        kn = rope(k, torch.tensor([n]))
        dots.setdefault(m - n, []).append((qm * kn).sum().item())
    for vals in dots.values():
        assert max(vals) - min(vals) < 1e-4
    assert abs(dots[2][0] - dots[-4][0]) > 1e-3
    # rotation keeps the norm
    x = torch.randn(2, 3, 7, 16)
    assert torch.allclose(rope(x, torch.arange(7)).norm(dim=-1), x.norm(dim=-1), atol=1e-5)


def test_rope_in_attention_kv_cache():
    mha = MultiHeadAttention(32, 4, causal=True, rotary=RotaryEmbedding(8)).eval()
    x = torch.randn(1, 6, 32)
    cache = mha.new_cache(1, 6)
    inc = torch.cat([mha(x[:, :2], cache=cache)] + [mha(x[:, t : t + 1], cache=cache) for t in range(2, 6)], 1)
    assert torch.allclose(mha(x), inc, atol=1e-5)


def test_alibi_slopes():
    s = alibi_slopes(8)
    assert torch.allclose(s, torch.tensor([1 / 2**i for i in range(1, 9)]))
    # 6 heads (not a power of 2): the 4-head slopes, then every other 8-head slope (Press et al.'s code)
    assert torch.allclose(alibi_slopes(6), torch.tensor([1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]))
    assert torch.allclose(
        alibi_slopes(12),
        torch.tensor([2 ** -(i * 8 / 8) for i in range(1, 9)] + [2 ** -(i * 8 / 16) for i in (1, 3, 5, 7)]),
    )
    bias = ALiBi(8)(torch.zeros(1, 8, 4, 8), 4)
    assert bias.shape == (8, 4, 4)
    assert bias[0, 3, 0].item() == pytest.approx(-1.5)  # slope 1/2, distance 3


def test_relative_position_bias_shaw():
    rel = RelativePosition(head_dim=4, max_distance=2)
    q = torch.randn(1, 2, 5, 4)
    b = rel(q, 5)
    # clipped: distances -4 and -2 share the same table row
    expect = (q[0, 1, 4] @ rel.table[0]) / 2.0
    assert b[0, 1, 4, 0].item() == pytest.approx(expect.item(), abs=1e-6)
    assert b[0, 1, 4, 2].item() == pytest.approx(expect.item(), abs=1e-6)
    mha = MultiHeadAttention(8, 2, position_bias=RelativePosition(4, 2))
    x = torch.randn(1, 5, 8)
    perm = torch.tensor([4, 3, 2, 1, 0])
    assert not torch.allclose(mha(x)[:, perm], mha(x[:, perm]), atol=1e-4)


def test_peg_depthwise_and_grid_check():
    peg = PEG(8)
    x = torch.randn(2, 1 + 12, 8)
    y = peg(x, (3, 4), n_prefix=1)
    assert torch.equal(y[:, 0], x[:, 0]) and y.shape == x.shape
    assert peg.conv.groups == 8
    with pytest.raises(ValueError, match="do not fill a 3x3 grid"):
        peg(x, (3, 3), n_prefix=1)


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_shaw_attention_equals_an_explicit_loop_over_pairs(per_head, causal):
    """e_ij = q_i·(k_j + aᴷ_ij)/√d, z_i = Σ_j α_ij (v_j + aⱽ_ij), with clipped j − i, pair by pair."""
    torch.manual_seed(0)
    t, d, h, k_max = 6, 4, 2, 2
    rel = RelativePosition(d, k_max, heads=h if per_head else None)
    with torch.no_grad():
        rel.table.normal_()
        rel.value_table.normal_()
    mha = MultiHeadAttention(d * h, h, position_bias=rel, causal=causal)
    x = torch.randn(1, t, d * h)
    q, kk, v = (part.view(t, h, d).transpose(0, 1) for part in mha.qkv(x)[0].split(d * h, -1))
    z = torch.zeros(h, t, d)
    for head in range(h):
        a_k = rel.table[head] if per_head else rel.table
        a_v = rel.value_table[head] if per_head else rel.value_table
        for i in range(t):
            keys = range(i + 1) if causal else range(t)
            e = torch.stack([q[head, i] @ (kk[head, j] + a_k[max(-k_max, min(k_max, j - i)) + k_max]) for j in keys])
            alpha = torch.softmax(e / d**0.5, 0)
            z[head, i] = sum(
                alpha[n] * (v[head, j] + a_v[max(-k_max, min(k_max, j - i)) + k_max]) for n, j in enumerate(keys)
            )
    want = mha.out_proj(z.transpose(0, 1).reshape(1, t, d * h))
    torch.testing.assert_close(mha(x), want, atol=1e-5, rtol=1e-5)
    no_values = RelativePosition(d, k_max, values=False)
    assert no_values.value_table is None


def test_2d_relative_distances_on_a_patch_grid():
    rel = RelativePosition(4, max_distance=1, grid=(2, 3), n_prefix=1)
    idx = rel.distances(7, 7)
    span = 3  # clipped Δ in {-1, 0, 1}
    cls = span * span
    assert (idx[0] == cls).all() and (idx[:, 0] == cls).all()  # the class token has one row of its own
    # patch 0 at (0, 0) to patch 5 at (1, 2): Δrow 1, Δcol 2 -> clipped (1, 1)
    assert idx[1, 6] == (1 + 1) * span + (1 + 1)
    assert idx[6, 1] == (-1 + 1) * span + (-1 + 1)
    assert idx[2, 2] == 1 * span + 1  # itself: (0, 0)
    assert rel.table.shape == (span * span + 1, 4)
    with pytest.raises(ValueError, match="expect 1 \\+ 2×3 tokens"):
        rel.distances(5, 5)


def test_a_gpt_with_relative_positions_is_causal_and_caches():
    from attnlab.generate import generate
    from attnlab.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, context=16, layers=2, heads=2, dim=16, pos="relative", rel_distance=3)).eval()
    x = torch.randint(0, 20, (1, 10))
    with torch.no_grad():
        full = model(x)
        torch.testing.assert_close(model(x[:, :6]), full[:, :6], atol=1e-5, rtol=1e-5)
    cached = generate(model, [[1, 2, 3]], 8, temperature=0)
    uncached = generate(model, [[1, 2, 3]], 8, temperature=0, use_cache=False)
    assert cached == uncached
    tables = [n for n, _ in model.named_parameters() if "table" in n]
    assert tables == ["rel_pos.table", "rel_pos.value_table"]  # one set, shared by the layers


def test_concatenated_positions_start_as_the_sum_and_can_learn_otherwise():
    from attnlab.models import GPT, GPTConfig

    torch.manual_seed(0)
    added = GPT(GPTConfig(vocab_size=20, context=8, layers=1, heads=2, dim=8))
    joined = GPT(GPTConfig(vocab_size=20, context=8, layers=1, heads=2, dim=8, pos_combine="concat"))
    joined.load_state_dict(added.state_dict(), strict=False)  # all but pos_mix, which is [I I]
    x = torch.randint(0, 20, (2, 8))
    torch.testing.assert_close(joined(x), added(x))
    with torch.no_grad():
        joined.pos_mix.weight[:, 8:] *= 3  # weigh positions three times as much as tokens
    _, cache = joined.run_with_cache(x)
    want = joined.tok_emb(x) + 3 * joined.pos_emb.weight[:8]
    torch.testing.assert_close(cache["hook_embed"], want)
    with pytest.raises(ValueError, match="--pos rope has none"):
        GPTConfig(pos="rope", pos_combine="concat")


def test_concatenated_positions_with_a_width_of_their_own_keep_their_own_dims():
    """--pos-dim P: the stream is [E(token); P(pos)], the token embedding D - P wide: a position's
    code sits in the last P dims alone, a token's in the first D - P; W_E and W_pos are what each
    writes into the stream."""
    from attnlab.models import GPT, GPTConfig

    torch.manual_seed(0)
    c = GPTConfig(vocab_size=20, context=8, layers=1, heads=2, dim=8, pos_combine="concat", pos_dim=3,
                  tie_output=False)  # fmt: skip
    model = GPT(c)
    assert model.tok_emb.weight.shape == (20, 5) and model.pos_emb.weight.shape == (8, 3) and model.pos_mix is None
    x = torch.randint(0, 20, (2, 8))
    _, cache = model.run_with_cache(x)
    torch.testing.assert_close(cache["hook_embed"][..., :5], model.tok_emb(x))
    torch.testing.assert_close(cache["hook_embed"][..., 5:], model.pos_emb.weight.expand(2, 8, 3))
    torch.testing.assert_close(cache["hook_embed"], model.W_E[x] + model.W_pos[:8])
    for bad, match in (
        (dict(pos_combine="concat", pos_dim=8), "between 1 and 7"),
        (dict(pos_dim=3, tie_output=False), "--pos-combine concat"),
        (dict(pos_combine="concat", pos_dim=3), "--no-tie-output"),
    ):
        with pytest.raises(ValueError, match=match):
            GPTConfig(vocab_size=20, context=8, layers=1, heads=2, dim=8, pos="learned", **bad)


def test_rope_keeps_theta_in_float32_and_its_cos_sin_follow_the_positions():
    """θ is not rounded when the model is cast (bf16 θ turns position 31 by up to 0.03 rad); the cos
    and sin shared by the layers of one forward are recomputed when the positions change in place,
    or the dtype does."""
    rope = RotaryEmbedding(64, base=1e6)
    exact = rope.inv_freq.clone()
    rope.to(torch.bfloat16)
    assert rope.inv_freq.dtype == torch.float32 and torch.equal(rope.inv_freq, exact)
    x, positions = torch.randn(1, 2, 4, 64), torch.arange(4)

    def fresh(x, positions):  # what the rotation gives with nothing kept from an earlier call
        return RotaryEmbedding(64, base=1e6)(x, positions)

    torch.testing.assert_close(rope(x, positions), fresh(x, positions))
    positions += 100  # (in place: the same tensor, another version)
    torch.testing.assert_close(rope(x, positions), fresh(x, positions))
    assert rope(x.bfloat16(), positions).dtype == torch.bfloat16
    torch.testing.assert_close(rope(x, positions), fresh(x, positions))
