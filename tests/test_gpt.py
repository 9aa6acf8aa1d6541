import pytest
import torch

from attnlab.generate import generate, sample_next
from attnlab.models import GPT, GPTConfig
from helpers import PINNED_FLAGS, PINNED_TRAINING


def tiny(**kw):
    return GPT(GPTConfig(**{**dict(vocab_size=37, block_size=32, n_layer=2, n_head=2, n_embd=32), **kw})).eval()


@pytest.mark.parametrize("position", ["learned", "rope", "alibi", "sinusoidal"])
def test_logits_shape_and_causality(position):
    m = tiny(position=position)
    idx = torch.randint(0, 37, (3, 10))
    logits = m(idx)
    assert logits.shape == (3, 10, 37)
    idx2 = idx.clone()
    idx2[:, 6:] = (idx2[:, 6:] + 1) % 37
    assert torch.allclose(m(idx2)[:, :6], logits[:, :6], atol=1e-5)  # the future does not leak


def test_tied_head_and_presets():
    m = tiny()
    assert m.lm_head.weight is m.tok_emb.weight
    assert GPT.from_preset("shakespeare-cpu", vocab_size=65).config.n_embd == 128
    with pytest.raises(ValueError, match="unknown GPT preset"):
        GPT.from_preset("huge")
    with pytest.raises(ValueError, match="longer than the model's context of 32"):
        m(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="dim=30 is not divisible by heads=4"):
        GPTConfig(n_embd=30, n_head=4)


def test_initial_loss_is_log_vocab():
    m = GPT(GPTConfig(vocab_size=100, block_size=16, n_layer=2, n_head=2, n_embd=32))
    idx = torch.randint(0, 100, (8, 16))
    loss = m.loss(idx[:, :-1], idx[:, 1:])
    assert loss.item() == pytest.approx(torch.log(torch.tensor(100.0)).item(), rel=0.05)


@pytest.mark.parametrize("position", ["learned", "rope", "alibi"])
def test_kv_cache_generation_equals_recompute(position):
    m = tiny(position=position)
    prompt = [[1, 2, 3, 4, 5]]
    a = generate(m, prompt, 20, temperature=0, use_cache=True)
    b = generate(m, prompt, 20, temperature=0, use_cache=False)
    assert a == b
    # and the cached logits equal the full forward's
    idx = torch.tensor(a)
    caches = m.new_caches(1)
    inc = torch.cat([m(idx[:, :5], caches=caches)] + [m(idx[:, t : t + 1], caches=caches) for t in range(5, 25)], 1)
    assert torch.allclose(inc, m(idx), atol=1e-4)


@pytest.mark.parametrize("position", ["learned", "rope", "alibi"])
def test_batched_prompts_of_different_length(position):
    m = tiny(position=position)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]
    batched = generate(m, prompts, 8, temperature=0)
    single = [generate(m, [p], 8, temperature=0)[0] for p in prompts]
    assert batched == single
    assert batched == generate(m, prompts, 8, temperature=0, use_cache=False)


def test_generation_past_the_context_slides():
    m = tiny()
    out = generate(m, [[1, 2]], 60, temperature=0)
    assert len(out[0]) == 62


def test_sampling_filters():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    assert sample_next(logits, temperature=0).item() == 3
    g = torch.Generator().manual_seed(0)
    draws = {sample_next(logits, top_k=2, generator=g).item() for _ in range(200)}
    assert draws == {2, 3}
    probs = logits.softmax(-1)[0]  # 0.032 0.087 0.237 0.644
    draws = {sample_next(logits, top_p=0.7, generator=g).item() for _ in range(300)}
    assert draws == {2, 3}  # 0.644 < 0.7, so the second token is needed too
    draws = {sample_next(logits, top_p=0.5, generator=g).item() for _ in range(100)}
    assert draws == {3}
    # the frequencies match the renormalised hand-computed distributions
    n = 4000
    counts = torch.bincount(
        torch.stack([sample_next(logits, top_k=2, generator=g) for _ in range(n)]).flatten(), minlength=4
    )
    expected = probs[2:] / probs[2:].sum()  # 0.269, 0.731
    assert torch.allclose(counts[2:] / n, expected, atol=0.03)
    t = 2.0
    counts = torch.bincount(
        torch.stack([sample_next(logits, temperature=t, generator=g) for _ in range(n)]).flatten(), minlength=4
    )
    assert torch.allclose(counts / n, (logits[0] / t).softmax(-1), atol=0.03)
    with pytest.raises(ValueError, match="top_p"):
        sample_next(logits, top_p=1.5)


def test_restricted_attention_by_hand_and_with_the_kv_cache():
    """--window r: each query attends to itself and the r keys before it (causal) or around it;
    equal to attention computed by hand over exactly those keys, and incremental decoding with
    the KV cache gives the full forward pass's logits."""
    import math

    import pytest

    from attnlab.attention import MultiHeadAttention, local_mask
    from attnlab.models import GPT, GPTConfig

    assert local_mask(4, window=1).tolist() == [
        [True, True, False, False],
        [True, True, True, False],
        [False, True, True, True],
        [False, False, True, True],
    ]
    torch.manual_seed(0)
    for causal in (True, False):
        mha = MultiHeadAttention(8, 2, causal=causal, window=2).eval()
        x = torch.randn(1, 7, 8)
        q, k, v = (t.view(1, 7, 2, 4).transpose(1, 2) for t in mha.qkv(x).split(8, dim=-1))
        rows = []
        for i in range(7):  # one query at a time, over the keys it may see
            keys = [j for j in range(7) if abs(i - j) <= 2 and (j <= i or not causal)]
            w = (q[:, :, i : i + 1] @ k[:, :, keys].transpose(-1, -2) / math.sqrt(4)).softmax(-1)
            rows.append(w @ v[:, :, keys])
        want = mha.out_proj(torch.cat(rows, dim=2).transpose(1, 2).reshape(1, 7, 8))
        with torch.no_grad():
            assert torch.allclose(mha(x), want, atol=1e-5), causal
    gpt = GPT(GPTConfig(vocab_size=11, context=16, layers=2, heads=2, dim=16, window=3)).eval()
    idx = torch.randint(11, (2, 12))
    with torch.no_grad():
        full = gpt(idx)
        caches = gpt.new_caches(2)
        steps = [gpt(idx[:, t : t + 1], caches=caches) for t in range(12)]
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)
    assert not torch.allclose(full, GPT(GPTConfig(vocab_size=11, context=16, layers=2, heads=2, dim=16))(idx))
    with pytest.raises(ValueError, match=r"\(--window\): 0 is out of range: must be at least 1"):
        GPTConfig(window=0)


def test_sinusoidal_positions_train_within_reach_of_learned_ones(tmp_path):
    """The GPT scales its token embeddings by √dim under --pos sinusoidal (as the paper does):
    at the same 200-step budget it lands near learned positions; without the scale (a checkpoint
    from before it) the unit-amplitude code drowns the 0.02-scale embeddings, far behind."""
    from attnlab.data.text import prepare
    from attnlab.models import GPT, GPTConfig
    from attnlab.training import LanguageModelTask, TrainConfig, Trainer

    data = prepare(None, tmp_path / "corpus")
    best = {}
    for name, pos, scale in (
        ("learned", "learned", None),
        ("sin", "sinusoidal", None),
        ("unscaled", "sinusoidal", False),
    ):
        torch.manual_seed(0)
        config = GPTConfig(
            vocab_size=data.tokenizer.vocab_size, context=64, layers=2, heads=2, dim=64, pos=pos, embed_scale=scale
        )
        cfg = TrainConfig(
            max_iters=200,
            batch_size=16,
            lr=3e-3,
            warmup_iters=20,
            eval_interval=200,
            eval_iters=4,
            progress=False,
            **PINNED_TRAINING,
        )
        best[name] = Trainer(GPT(config), LanguageModelTask(data, 64, 16), cfg, tmp_path / name).fit()["best_val"]
    assert best["sin"] - best["learned"] < 0.35, best
    assert best["unscaled"] - best["learned"] > 2 * (best["sin"] - best["learned"]), best
    assert GPTConfig.from_dict({"pos": "sinusoidal"}).embed_scale is False  # old checkpoints load unchanged


def test_fine_tuning_from_a_run_beats_training_from_scratch(tmp_path, capsys):
    """attnlab train gpt --init RUN: the pretrained shape, weights and tokenizer (context may
    shorten); after 20 steps on a related corpus it is far below a fresh model's loss at the same
    budget. Another family, a shape option or text the tokenizer lacks are refused in one line."""
    import json

    from attnlab.cli import main

    first, second = tmp_path / "c1.txt", tmp_path / "c2.txt"
    first.write_text("the cat sat on the mat. the dog ran to the log. " * 300)
    second.write_text("a cat ran on the mat. a dog sat to the log. " * 300)
    common = ["--no-progress", "--sample-chars", "0", *PINNED_FLAGS]
    pre = tmp_path / "pre"
    assert (
        main(
            [
                "train",
                "gpt",
                "--data",
                str(first),
                "--preset",
                "nano",
                "--max-iters",
                "150",
                "--eval-interval",
                "150",
                "--eval-iters",
                "2",
                "--out",
                str(pre),
                *common,
            ]
        )
        == 0
    )
    short = [
        "--data",
        str(second),
        "--context",
        "32",
        "--max-iters",
        "20",
        "--eval-interval",
        "20",
        "--eval-iters",
        "4",
    ]
    assert main(["train", "gpt", *short, "--init", str(pre), "--out", str(tmp_path / "tuned"), *common]) == 0
    assert main(["train", "gpt", *short, "--preset", "nano", "--out", str(tmp_path / "fresh"), *common]) == 0
    val = {n: json.loads((tmp_path / n / "last" / "trainer.json").read_text())["best_val"] for n in ("tuned", "fresh")}
    assert val["tuned"] < 0.5 * val["fresh"], val
    saved = json.loads((tmp_path / "tuned" / "last" / "config.json").read_text())
    assert saved["init"] == str(pre) and saved["model"]["context"] == 32 and saved["model"]["dim"] == 64
    capsys.readouterr()
    (tmp_path / "c3.txt").write_text("xyz " * 300)
    for extra, words in (
        (["--data", str(second), "--layers", "3"], "--init fixes the model's shape; drop --layers"),
        (["--data", str(second), "--context", "128"], "fine-tuning can shorten the context"),
        (["--data", str(tmp_path / "c3.txt")], "is not in this tokenizer's vocabulary"),
    ):
        assert main(["train", "gpt", "--init", str(pre), *extra, "--out", str(tmp_path / "bad"), *common]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err


def test_attention_variants_in_the_gpt_refuse_gpt2_export_and_bad_values(tmp_path):
    """--attn-tie and --attn-scale reach every block; GPT-2 export refuses them; bad values are refused."""
    import attnlab
    from attnlab.errors import CheckpointError
    from attnlab.models import GPT, GPTConfig

    tied = GPT(GPTConfig(vocab_size=20, context=8, layers=2, heads=2, dim=16, attn_tie="kv", attn_scale=1.0))
    assert all(b.attn.tie == "kv" and b.attn.scale == 1.0 for b in tied.blocks)
    assert tied(torch.randint(20, (1, 8))).shape == (1, 8, 20)
    with pytest.raises(CheckpointError, match="attn_tie='kv'"):
        attnlab.export_hf(tied, tmp_path / "hf")
    with pytest.raises(ValueError, match=r"\(--attn-tie\): choose one of none, qk, kv"):
        GPTConfig(attn_tie="vq")
    with pytest.raises(ValueError, match=r"\(--attn-scale\): 0.0 is out of range: must be more than 0"):
        GPTConfig(attn_scale=0.0)


def test_post_ln_blocks_normalise_after_each_residual_sum():
    """--post-ln: each block computes LN₂(m + MLP(m)), m = LN₁(x + Attn(x)) (the original Transformer),
    checked by hand against the block's own parts; refused beside parallel or sandwich blocks and by
    every exporter."""
    import pytest

    from attnlab.errors import CheckpointError
    from attnlab.interop import export_hf

    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=30, context=16, layers=2, heads=2, dim=16, pos="rope", post_ln=True)).eval()
    block, x = gpt.blocks[0], torch.randn(2, 5, 16)
    with torch.no_grad():
        mid = block.ln1(x + block.attn(x))
        torch.testing.assert_close(block(x), block.ln2(mid + block.mlp(mid)))
    for other in ("parallel_residual", "sandwich_norm"):
        with pytest.raises(ValueError, match="--post-ln"):
            GPTConfig(vocab_size=30, context=16, layers=2, heads=2, dim=16, post_ln=True, **{other: True})
    with pytest.raises(CheckpointError):
        export_hf(GPT(GPTConfig(vocab_size=30, context=16, layers=1, heads=2, dim=16, post_ln=True)), "/nonexistent")
