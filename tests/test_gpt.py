import pytest
import torch

from attnlab.generate import generate, sample_next
from attnlab.models import GPT, GPTConfig


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
