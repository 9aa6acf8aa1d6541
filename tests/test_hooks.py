"""Named hook points: reading equals independent references (HuggingFace GPT-2, a hand-written
forward), changing equals the same change made to the weights, and every family has them."""

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from attnlab import attention as attention_module
from attnlab.hooks import HookedModule, zero_heads
from attnlab.inspect import capture_attention, capture_features
from attnlab.models import GPT, GPTConfig
from attnlab.models.caption import CaptionConfig, Captioner
from attnlab.models.cnn import CNN, CNNConfig
from attnlab.models.encoder import TextEncoder, TextEncoderConfig
from attnlab.models.rnn import RNNConfig, RNNSeq2Seq
from attnlab.models.seq2seq import Transformer, TransformerConfig
from attnlab.models.vit import ViT, ViTConfig


def _gpt(pos="learned", seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=61, context=24, layers=3, heads=4, dim=32, pos=pos)).eval()


# ---- against HuggingFace GPT-2 and a hand-written forward --------------------------------------------
@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    import attnlab

    cfg = transformers.GPT2Config(
        vocab_size=97,
        n_positions=32,
        n_embd=48,
        n_layer=3,
        n_head=4,
        resid_pdrop=0,
        embd_pdrop=0,
        attn_pdrop=0,
        attn_implementation="eager",
    )
    torch.manual_seed(1)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # random biases and LayerNorms, so that the mapping of every tensor is tested
        for n, p in hf.named_parameters():
            if n.endswith("bias") or "ln" in n:
                p.add_(torch.randn_like(p) * 0.1)
    d = tmp_path_factory.mktemp("gpt2")
    hf.save_pretrained(d)
    return hf, attnlab.load(d)


def test_cache_equals_huggingface_hidden_states_and_attentions(hf_pair):
    hf, ours = hf_pair
    idx = torch.randint(0, 97, (2, 19))
    qkv = {}
    handles = [
        blk.attn.c_attn.register_forward_hook(lambda m, i, o, li=li: qkv.__setitem__(li, o))
        for li, blk in enumerate(hf.transformer.h)
    ]
    with torch.no_grad():
        ref = hf(idx, output_hidden_states=True, output_attentions=True)
    for h in handles:
        h.remove()
    logits, cache = ours.run_with_cache(idx)
    assert torch.allclose(logits, ref.logits, atol=1e-4)
    L, H, D = 3, 4, 48
    for li in range(L):
        # HF's hidden_states[l] is the residual stream entering block l
        assert torch.allclose(cache[f"blocks.{li}.hook_resid_pre"], ref.hidden_states[li], atol=1e-5)
        assert torch.allclose(cache[f"blocks.{li}.attn.hook_pattern"], ref.attentions[li], atol=1e-5)
        q, k, v = qkv[li].split(D, dim=-1)  # (B, T, D) each, from HF's own c_attn
        for name, t in (("q", q), ("k", k), ("v", v)):
            heads = t.reshape(2, 19, H, D // H).transpose(1, 2)  # (B, H, T, d)
            assert torch.allclose(cache[f"blocks.{li}.attn.hook_{name}"], heads, atol=1e-5), name
    # HF's last hidden state has the final LayerNorm applied: our hook_final
    assert torch.allclose(cache["hook_final"], ref.hidden_states[L], atol=1e-5)
    assert torch.allclose(cache["hook_embed"], ref.hidden_states[0], atol=1e-6)


def test_cache_equals_a_hand_written_forward():
    m = _gpt()
    idx = torch.randint(0, 61, (2, 11))
    _, cache = m.run_with_cache(idx)
    x = m.tok_emb.weight[idx] + m.pos_emb.weight[:11]
    assert torch.allclose(cache["hook_embed"], x, atol=1e-6)
    for li, blk in enumerate(m.blocks):
        h = F.layer_norm(x, (32,), blk.ln1.weight, blk.ln1.bias, 1e-5)
        q, k, v = (h @ blk.attn.qkv.weight.T + blk.attn.qkv.bias).split(32, -1)
        q, k, v = (t.reshape(2, 11, 4, 8).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(8)
        future = torch.ones(11, 11, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        pattern = scores.softmax(-1)
        z = pattern @ v
        attn_out = z.transpose(1, 2).reshape(2, 11, 32) @ blk.attn.out_proj.weight.T + blk.attn.out_proj.bias
        mid = x + attn_out
        pre = F.layer_norm(mid, (32,), blk.ln2.weight, blk.ln2.bias, 1e-5) @ blk.mlp.fc.weight.T + blk.mlp.fc.bias
        post = F.gelu(pre)
        mlp_out = post @ blk.mlp.proj.weight.T + blk.mlp.proj.bias
        expect = {
            "attn.hook_q": q,
            "attn.hook_k": k,
            "attn.hook_v": v,
            "attn.hook_scores": scores,
            "attn.hook_pattern": pattern,
            "attn.hook_z": z,
            "hook_attn_out": attn_out,
            "hook_resid_mid": mid,
            "mlp.hook_pre": pre,
            "mlp.hook_post": post,
            "hook_mlp_out": mlp_out,
            "hook_resid_post": mid + mlp_out,
        }
        for name, want in expect.items():
            assert torch.allclose(cache[f"blocks.{li}.{name}"], want, atol=1e-5), name
        x = mid + mlp_out


# ---- changing activations ------------------------------------------------------------------------------
def test_zero_ablating_a_head_equals_zeroing_its_output_projection_columns():
    m = _gpt()
    idx = torch.randint(0, 61, (3, 13))
    with m.hooks([("blocks.1.attn.hook_z", zero_heads(2))]), torch.no_grad():
        hooked = m(idx)
    edited = _gpt()
    with torch.no_grad():
        edited.blocks[1].attn.out_proj.weight[:, 2 * 8 : 3 * 8] = 0
        ref = edited(idx)
        plain = m(idx)
    assert torch.allclose(hooked, ref, atol=1e-6)
    assert not torch.allclose(hooked, plain, atol=1e-3)  # the ablation did something
    assert torch.allclose(m(idx), plain)  # and the hook is gone after the block


def test_patching_the_residual_stream_carries_the_clean_run_over():
    m = _gpt("rope")
    clean, corrupt = torch.randint(0, 61, (2, 1, 9))
    with torch.no_grad():
        clean_logits, cache = m.run_with_cache(clean, names="blocks.2.hook_resid_pre")
        with m.hooks([("blocks.2.hook_resid_pre", lambda x, hook: cache[hook.name])]):
            patched = m(corrupt)
        plain = m(corrupt)
    assert torch.allclose(patched, clean_logits, atol=1e-6)
    assert not torch.allclose(plain, clean_logits, atol=1e-3)


def test_replacing_the_pattern_changes_the_output_as_the_equation_says():
    m = _gpt()
    idx = torch.randint(0, 61, (1, 6))
    uniform = torch.tril(torch.ones(6, 6)) / torch.arange(1, 7)[:, None]  # causal mean of the values
    with torch.no_grad():
        _, cache = m.run_with_cache(idx, names=["blocks.0.attn.hook_v", "blocks.0.attn.hook_z"])
        with m.hooks([("blocks.0.attn.hook_pattern", lambda p, hook: uniform.expand_as(p).clone())]):
            _, hooked = m.run_with_cache(idx, names="blocks.0.attn.hook_z")
    assert torch.allclose(hooked["blocks.0.attn.hook_z"], uniform @ cache["blocks.0.attn.hook_v"], atol=1e-6)


def test_fused_attention_stays_unless_scores_or_pattern_are_hooked(monkeypatch):
    m = _gpt()
    idx = torch.randint(0, 61, (1, 8))
    calls = []
    real = attention_module._reference
    monkeypatch.setattr(attention_module, "_reference", lambda *a, **k: calls.append(1) or real(*a, **k))
    m(idx)
    m.run_with_cache(idx, names=["*.hook_resid_post", "*.attn.hook_z", "*.attn.hook_q"])
    assert calls == []
    m.run_with_cache(idx, names="blocks.1.attn.hook_pattern")
    assert len(calls) == 1  # only the hooked layer formed its weights


def test_gradients_flow_through_an_undetached_cache():
    m = _gpt()
    idx = torch.randint(0, 61, (1, 5))
    with m.caching("blocks.0.attn.hook_pattern", detach=False) as cache:
        m(idx)
    cache["blocks.0.attn.hook_pattern"][..., 1:, 0].sum().backward()
    assert m.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_bad_hook_names_and_bad_replacements_are_one_line_errors():
    m = _gpt()
    with pytest.raises(ValueError, match="no hook point matching"):
        with m.hooks([("blocks.9.attn.hook_z", lambda x, h: None)]):
            pass
    with pytest.raises(ValueError, match="must return a tensor of the value's shape"):
        with m.hooks([("hook_embed", lambda x, h: x[:, :1])]):
            m(torch.zeros(1, 4, dtype=torch.long))
    assert all(not p.active for p in m.hook_points().values())  # removed despite the error
    with pytest.raises(ValueError, match="has 4 heads"):
        with m.hooks([("blocks.0.attn.hook_z", zero_heads(7))]):
            m(torch.zeros(1, 4, dtype=torch.long))


# ---- every family --------------------------------------------------------------------------------------
def _families():
    torch.manual_seed(0)
    src, tgt = torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 5))
    img = torch.randn(2, 1, 8, 8)
    cap_img = torch.randn(2, 3, 16, 16)
    cap = dict(
        vocab_size=30,
        image_size=16,
        widths=(8, 16),
        dim=32,
        emb_dim=16,
        attention_dim=16,
        layers=2,
        heads=2,
        mlp_dim=32,
        context=8,
        dropout=0.0,
    )
    families = {
        "gpt": (GPT(GPTConfig(vocab_size=40, context=16, layers=2, heads=2, dim=16)), (src,), 2),
        "vit": (ViT(ViTConfig(image_size=8, patch_size=2, in_chans=1, dim=16, layers=2, heads=2)), (img,), 2),
        "cnn": (CNN(CNNConfig(in_chans=1, widths=(4, 8, 8), image_size=8)), (img,), 0),
        "encoder": (
            TextEncoder(
                TextEncoderConfig(
                    vocab_size=40, context=16, layers=2, heads=2, dim=16, mlp_dim=32, dropout=0.0, num_labels=3
                )
            ),
            (src, None, None, "classify"),
            2,
        ),
        "transformer": (
            Transformer(
                TransformerConfig(
                    src_vocab=40, tgt_vocab=40, dim=16, heads=2, enc_layers=2, dec_layers=2, mlp_dim=32, dropout=0.0
                )
            ),
            (src, tgt),
            6,
        ),
        "rnn-additive": (
            RNNSeq2Seq(RNNConfig(src_vocab=40, tgt_vocab=40, emb_dim=8, dim=16, dropout=0.0)),
            (src, tgt),
            1,
        ),
        "rnn-dot": (
            RNNSeq2Seq(RNNConfig(src_vocab=40, tgt_vocab=40, emb_dim=8, dim=16, dropout=0.0, attention="dot")),
            (src, tgt),
            1,
        ),
        "caption-rnn-attention": (Captioner(CaptionConfig(**cap)), (cap_img, tgt[:, :4] % 30), 1),
        "caption-transformer": (
            Captioner(CaptionConfig(**cap, arch="transformer", encoder="vit", enc_layers=1)),
            (cap_img, tgt[:, :4] % 30),
            5,
        ),
    }
    with torch.no_grad():  # some heads start at zero (ViT's); random weights make every path matter
        for model, _, _ in families.values():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    return families


@pytest.mark.parametrize("family", list(_families()))
def test_every_family_caches_and_patches_through_its_hook_points(family):
    model, inputs, n_attention = _families()[family]
    model.eval()
    if family == "encoder":  # the classifier reaches every hook point (the pooler's too)
        model.forward = functools.partial(type(model).forward, model, head=inputs[-1])
        inputs = inputs[:-1]
    assert isinstance(model, HookedModule)
    with torch.no_grad():
        plain = model(*inputs)
        out, cache = model.run_with_cache(*inputs)
    assert torch.allclose(out, plain, atol=1e-5)  # caching changes nothing
    # every hook point was reached (but an image encoder's pooled features, which a captioner does not
    # use, and the masked-LM head's norm, which a text encoder's classifier does not)
    unused = ("encoder.net.hook_pooled", "mlm.norm.")
    assert set(cache) == {n for n in model.hook_points() if not n.startswith(unused)}
    patterns = [k for k in cache if k.endswith(".hook_pattern")]
    assert len(patterns) == n_attention
    for k in patterns:
        p = cache[k]
        assert p.dim() == 4  # (B, H, Tq, Tk) in every family, RNNs' single head included
        assert torch.allclose(p.sum(-1), torch.ones(()), atol=1e-5), k
    # one mechanism for changing: scaling the first representation layer's output changes the result
    first = next(iter(model.hook_points(model.representation_hooks)))
    with model.hooks([(first, lambda x, hook: x * 3.0)]), torch.no_grad():
        changed = model(*inputs)
    assert not torch.allclose(changed, plain, atol=1e-4)
    if n_attention:
        with capture_attention(model) as rec, torch.no_grad():
            model(*inputs)
        assert len(rec.layers()) == n_attention


def test_rnn_alignment_joins_the_decoding_steps():
    model, (src, tgt), _ = _families()["rnn-additive"]
    model.eval()
    _, cache = model.run_with_cache(src, tgt, names=["attn.hook_pattern", "hook_context"])
    assert cache["attn.hook_pattern"].shape == (2, 1, 5, 7)
    assert len(cache.calls("attn.hook_pattern")) == 5
    assert cache["hook_context"].shape == (2, 5, 32)  # bidirectional encoder: 2 × 16


def test_captioner_regulariser_reads_the_attention_with_its_gradient():
    from attnlab.training.tasks import CaptionTask

    model, (img, tgt), _ = _families()["caption-rnn-attention"]
    model.train()
    task = CaptionTask.__new__(CaptionTask)
    task.label_smoothing, task.pad_id = 0.0, model.config.pad_id
    tgt_out = torch.cat([tgt[:, 1:], torch.full((2, 1), 2)], 1)
    with_reg = task.loss(model, (img, tgt, tgt_out))
    model.config.alpha_c = 0.0
    without = task.loss(model, (img, tgt, tgt_out))
    assert with_reg.item() > without.item()
    with_reg.backward()
    assert model.attn.w_key.weight.grad.abs().sum() > 0
    assert all(not p.active for p in model.hook_points().values())


def test_capture_features_reads_the_representation_layers():
    vit = _families()["vit"][0].eval()
    with capture_features(vit) as feats, torch.no_grad():
        vit(torch.randn(3, 1, 8, 8))
    assert list(feats) == ["encoder.blocks.0.hook_resid_post", "encoder.blocks.1.hook_resid_post"]
    cnn = _families()["cnn"][0].eval()
    with capture_features(cnn) as feats, torch.no_grad():
        cnn(torch.randn(3, 1, 8, 8))
    assert [f.shape[1] for f in feats.values()] == [4, 8, 8]


def test_pytorch_forward_hooks_fire_on_hook_points_and_captum_layer_methods_work():
    """A hook point is a real module call once PyTorch hooks are registered on it (before: they never
    fired, and captum's LayerIntegratedGradients on hook_embed failed with "Forward hook did not
    obtain any outputs"); with nothing attached it still costs nothing."""
    captum = pytest.importorskip("captum.attr")
    from attnlab.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, context=8, layers=2, heads=2, dim=16)).eval()
    idx = torch.randint(20, (2, 6))
    seen = []
    handle = model.hook_embed.register_forward_hook(lambda mod, args, out: seen.append(out.shape) or out * 0)
    zeroed = model(idx)
    handle.remove()
    assert seen == [(2, 6, 16)]
    with model.hooks([("hook_embed", lambda x, hook: x * 0)]):  # the same replacement through attnlab's hooks
        torch.testing.assert_close(zeroed, model(idx))
    grads = []
    handle = model.blocks[1].hook_resid_pre.register_full_backward_hook(lambda mod, gin, gout: grads.append(gout[0]))
    model(idx)[:, -1, 3].sum().backward()
    handle.remove()
    assert len(grads) == 1 and grads[0].shape == (2, 6, 16)

    def logit(ids):
        return model(ids)[:, -1, 3]

    for layer in (model.hook_embed, model.blocks[1].hook_resid_pre):
        lig = captum.LayerIntegratedGradients(logit, layer)
        attr, delta = lig.attribute(idx, baselines=torch.zeros_like(idx), n_steps=16, return_convergence_delta=True)
        assert attr.shape == (2, 6, 16) and delta.abs().max() < 0.05
    assert not model.hook_embed._forward_hooks  # (captum removed its hooks)


def test_backward_hooks_see_and_replace_gradients():
    """bwd hooks get d loss / d value at a hook point (checked against autograd on the cached
    value) and may replace it; caching_gradients collects them, as TransformerLens's incl_bwd."""
    from attnlab.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, layers=2, heads=2, dim=16, context=8))
    ids = torch.randint(20, (2, 8))
    kept = {}

    def keep(x, hook):
        x.retain_grad()
        kept[hook.name] = x

    with model.hooks([("blocks.1.hook_resid_mid", keep)]), model.caching_gradients("blocks.*.hook_resid_*") as grads:
        model(ids).logsumexp(-1).sum().backward()
    torch.testing.assert_close(grads["blocks.1.hook_resid_mid"], kept["blocks.1.hook_resid_mid"].grad)
    assert set(grads) == {f"blocks.{i}.hook_resid_{w}" for i in (0, 1) for w in ("pre", "mid", "post")}
    # a backward hook that zeroes the gradient through block 1's attention output cuts that path
    model.zero_grad()
    with model.hooks(bwd=[("blocks.1.hook_attn_out", lambda g, h: torch.zeros_like(g))]):
        model(ids).logsumexp(-1).sum().backward()
    assert model.blocks[1].attn.out_proj.weight.grad.abs().sum() == 0
    assert model.blocks[1].mlp.fc.weight.grad.abs().sum() > 0
