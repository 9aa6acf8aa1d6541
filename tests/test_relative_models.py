"""Relative (Shaw) and Fourier positions wired into the models: each model family with
``pos="relative"`` (and ViT with ``pos="fourier"``) runs, depends on token order, decodes
incrementally like it scores in one pass, and refuses to export to a HuggingFace format that has
no such positions."""

import pytest
import torch

from attnlab.errors import CheckpointError
from attnlab.models import ViT, ViTConfig
from attnlab.models.encoder import TextEncoder, TextEncoderConfig
from attnlab.models.seq2seq import Transformer, TransformerConfig
from attnlab.position import FourierFeatures, FourierPosition


def tiny_vit(pos, **kw):
    torch.manual_seed(0)
    return ViT(ViTConfig(image_size=8, patch_size=2, in_chans=1, dim=16, layers=2, heads=2, pos=pos, **kw)).eval()


def test_a_vit_with_relative_positions_sees_where_patches_are():
    vit = tiny_vit("relative", rel_distance=2)
    with torch.no_grad():
        vit.rel_pos.table.normal_()
        vit.rel_pos.value_table.normal_()
    assert vit.pos is None and vit.rel_pos.grid == (4, 4)
    from einops import rearrange

    x = torch.randn(1, 1, 8, 8)
    moved = rearrange(x, "b c (h p1) (w p2) -> b c (w p1) (h p2)", p1=2, p2=2)  # the same patches, grid transposed
    with torch.no_grad():
        assert not torch.allclose(vit.forward_features(x), vit.forward_features(moved), atol=1e-4)
        # with zero tables nothing tells places apart: the pooled features do not change
        vit.rel_pos.table.zero_()
        vit.rel_pos.value_table.zero_()
        torch.testing.assert_close(vit.forward_features(x), vit.forward_features(moved), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="no position table"):
        vit.pos_embed
    vit.resize_pos_embed(12)
    assert vit.rel_pos.grid == (6, 6) and vit(torch.randn(2, 1, 12, 12)).shape == (2, 10)


def test_fourier_positions_are_a_projection_of_fourier_features_of_the_coordinates():
    pos = FourierPosition(16, (2, 3), n_prefix=1, n_features=8)
    table = pos.weight
    assert table.shape == (7, 16) and torch.equal(table[0], torch.zeros(16))
    coords = torch.tensor([[r / 2, c / 3] for r in range(2) for c in range(3)])
    feats: FourierFeatures = pos.features
    phase = 2 * torch.pi * coords @ feats.B.T
    want = torch.cat([phase.cos(), phase.sin()], -1) @ feats.proj.weight.T + feats.proj.bias
    torch.testing.assert_close(table[1:], want)
    vit = tiny_vit("fourier")
    assert vit.pos_embed.shape == (1, 17, 16)
    vit.resize_pos_embed(4)  # a 2×2 grid: the same features at the coarser coordinates
    assert vit.pos_embed.shape == (1, 5, 16)


def test_an_encoder_with_relative_positions_cares_about_order_and_refuses_bert_export():
    from attnlab.interop.bert import export_bert

    torch.manual_seed(0)
    enc = TextEncoder(
        TextEncoderConfig(vocab_size=30, context=16, layers=2, heads=2, dim=16, mlp_dim=32, pos="relative", dropout=0.0)
    ).eval()
    assert enc.pos is None and "pos.weight" not in dict(enc.named_parameters())
    with torch.no_grad():
        enc.rel_pos.table.normal_()
    ids = torch.randint(1, 30, (1, 8))
    perm = torch.tensor([7, 6, 5, 4, 3, 2, 1, 0])
    with torch.no_grad():
        assert not torch.allclose(enc(ids)[:, perm], enc(ids[:, perm]), atol=1e-4)
    with pytest.raises(CheckpointError, match="relative positions"):
        export_bert(enc)


def test_a_seq2seq_transformer_with_relative_positions_decodes_step_by_step_as_it_scores():
    torch.manual_seed(0)
    model = Transformer(
        TransformerConfig(
            src_vocab=30,
            tgt_vocab=30,
            dim=16,
            heads=2,
            enc_layers=1,
            dec_layers=2,
            mlp_dim=32,
            pos="relative",
            context=16,
            dropout=0.0,
            rel_distance=2,
        )
    ).eval()
    src, tgt = torch.randint(4, 30, (2, 7)), torch.randint(4, 30, (2, 6))
    with torch.no_grad():
        full = model(src, tgt).float().log_softmax(-1)
        state = model.start(model.encode(src), 6)
        steps = []
        for t in range(6):
            logp, state = model.step(state, tgt[:, t])
            steps.append(logp)
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)
