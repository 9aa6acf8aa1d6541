import pytest
import torch
from torch import nn

from attnlab.attention import MultiHeadAttention, causal_mask
from attnlab.blocks import MLP, DecoderBlock, Encoder, TransformerBlock, init_gpt2_weights
from attnlab.position import SinusoidalPosition
from helpers import copy_attention


def _copy_mlp_norms(ours, theirs, norms):
    theirs.linear1.load_state_dict(ours.mlp.fc.state_dict())
    theirs.linear2.load_state_dict(ours.mlp.proj.state_dict())
    for a, b in norms:
        getattr(theirs, b).load_state_dict(getattr(ours, a).state_dict())


@pytest.mark.parametrize("norm_first", [False, True])
def test_block_equals_torch_encoder_layer(norm_first):
    d, h = 32, 4
    ours = TransformerBlock(d, h, mlp_hidden=64, activation="relu", norm_first=norm_first).eval()
    theirs = nn.TransformerEncoderLayer(d, h, 64, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    with torch.no_grad():
        copy_attention(ours.attn, theirs.self_attn)
        _copy_mlp_norms(ours, theirs, [("ln1", "norm1"), ("ln2", "norm2")])
    x = torch.randn(2, 6, d)
    key_mask = torch.ones(2, 6, dtype=torch.bool)
    key_mask[1, 4:] = False
    out = ours(x, key_mask=key_mask)
    ref = theirs(x, src_key_padding_mask=~key_mask)
    assert torch.allclose(out[key_mask], ref[key_mask], atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_block_equals_torch_decoder_layer(norm_first):
    d, h = 32, 4
    ours = DecoderBlock(d, h, mlp_hidden=48, activation="gelu", norm_first=norm_first).eval()
    theirs = nn.TransformerDecoderLayer(
        d, h, 48, dropout=0.0, activation="gelu", batch_first=True, norm_first=norm_first
    ).eval()
    with torch.no_grad():
        copy_attention(ours.self_attn, theirs.self_attn)
        copy_attention(ours.cross_attn, theirs.multihead_attn)
        _copy_mlp_norms(ours, theirs, [("ln1", "norm1"), ("ln2", "norm2"), ("ln3", "norm3")])
    x, mem = torch.randn(2, 5, d), torch.randn(2, 8, d)
    mem_mask = torch.ones(2, 8, dtype=torch.bool)
    mem_mask[0, 6:] = False
    out = ours(x, mem, memory_mask=mem_mask)
    ref = theirs(x, mem, tgt_mask=~causal_mask(5), memory_key_padding_mask=~mem_mask)
    assert torch.allclose(out, ref, atol=1e-5)


def test_decoder_block_kv_cache_equals_full():
    blk = DecoderBlock(16, 2).eval()
    x, mem = torch.randn(1, 6, 16), torch.randn(1, 4, 16)
    full = blk(x, mem)
    cache = blk.self_attn.new_cache(1, 6)
    inc = torch.cat([blk(x[:, t : t + 1], mem, cache=cache) for t in range(6)], 1)
    assert torch.allclose(full, inc, atol=1e-5)


def test_permutation_equivariance_without_positions_only():
    torch.manual_seed(1)
    d = 16
    attn = MultiHeadAttention(d, 2).eval()
    block = TransformerBlock(d, 2).eval()
    x = torch.randn(1, 7, d)
    perm = torch.randperm(7)
    for f in (attn, block):
        assert torch.allclose(f(x)[:, perm], f(x[:, perm]), atol=1e-5)
    pos = SinusoidalPosition(d, 64)
    with_pos = lambda t: block(pos(t))
    assert not torch.allclose(with_pos(x)[:, perm], with_pos(x[:, perm]), atol=1e-3)


def test_mlp_activations():
    m = MLP(4, 8, "gelu_tanh")
    x = torch.randn(3, 4)
    ref = m.proj(nn.functional.gelu(m.fc(x), approximate="tanh"))
    assert torch.allclose(m(x), ref)
    with pytest.raises(ValueError, match="unknown activation"):
        MLP(4, 8, "swish2")


def test_encoder_stack_and_gpt2_init():
    enc = Encoder(4, 32, 4)
    init_gpt2_weights(enc, 4)
    w = enc.blocks[0].attn.qkv.weight
    assert w.std().item() == pytest.approx(0.02, rel=0.1)
    proj = enc.blocks[0].attn.out_proj.weight
    assert proj.std().item() == pytest.approx(0.02 / (8**0.5), rel=0.15)
    assert enc(torch.randn(2, 5, 32)).shape == (2, 5, 32)


def test_every_norm_and_activation_a_config_may_name_is_built():
    """The configs declare the names (attnlab.config, without torch); the blocks build each one,
    and refuse a name outside them."""
    from attnlab.blocks import norm_layer
    from attnlab.config import ACTIVATIONS, NORMS

    x = torch.linspace(-2, 2, 8).reshape(1, 1, 8)
    for name in ACTIVATIONS:
        assert MLP(8, 16, activation=name)(x).shape == x.shape, name
    for kind in NORMS:
        assert norm_layer(kind, 8, 1e-5)(x).shape == x.shape, kind
    with pytest.raises(ValueError, match="unknown activation"):
        MLP(8, 16, activation="tanh")
