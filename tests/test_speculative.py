"""Speculative decoding (attnlab.generate.speculative_generate): greedy gives the model's own
tokens; sampling follows the model's distribution (a chi-square test that a sampler drawing
from the draft instead fails)."""

import pytest
import torch

from attnlab.cli import main
from attnlab.generate import generate, next_token_probs, speculative_generate
from attnlab.models import GPT, GPTConfig


def gpt(seed, layers=2, vocab=11, context=32, **kw):
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=vocab, context=context, layers=layers, heads=2, dim=16, tie_output=False, **kw)
    m = GPT(cfg).eval()
    with torch.no_grad():  # sharper predictions than a fresh model's, so that drafts get refused and kept
        m.lm_head.weight.mul_(10)
    return m


def noisy_copy(model, std, seed=7):
    """A draft that agrees with the model often but not always."""
    import copy

    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)
    return draft


@pytest.mark.parametrize("draft_tokens", [1, 3, 5])
@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_greedy_speculative_tokens_are_the_models_own(draft_tokens, pos):
    model = gpt(3, pos=pos)
    draft = noisy_copy(model, 0.008)
    prompt = [1, 2, 3]
    stats = {}
    got = speculative_generate(model, draft, prompt, 25, draft_tokens=draft_tokens, temperature=0, stats=stats)
    assert got == generate(model, [prompt], 25, temperature=0)[0]
    assert stats["rounds"] < 25 or draft_tokens == 1
    assert 0 < stats["accepted"] < stats["proposed"]  # kept and refused proposals both happened


def test_a_perfect_draft_is_always_accepted():
    model = gpt(0)
    stats = {}
    got = speculative_generate(model, model, [4], 20, draft_tokens=4, temperature=0, stats=stats)
    assert got == generate(model, [[4]], 20, temperature=0)[0]
    assert stats["accepted"] == stats["proposed"] == 16 and stats["rounds"] == 4  # 4 rounds of 4 + 1


@pytest.mark.parametrize("prompt", [[1, 2], [1, 2, 3, 4, 5, 6, 7, 8, 9]], ids=["short", "longer-than-context"])
@pytest.mark.parametrize("draft_context", [8, 5])
def test_text_longer_than_the_context_slides_the_window_as_generate_does(prompt, draft_context):
    model = gpt(3, context=8)
    draft = noisy_copy(model, 0.008) if draft_context == 8 else gpt(4, layers=1, context=draft_context)
    got = speculative_generate(model, draft, prompt, 30, draft_tokens=3, temperature=0)
    assert len(got) == len(prompt) + 30
    assert got == generate(model, [prompt], 30, temperature=0)[0]


def exact_joint(model, prompt, vocab, **kw):
    """P(t1, t2 | prompt) under the sampling distribution, for every pair."""
    with torch.no_grad():
        p1 = next_token_probs(model(torch.tensor([prompt]))[0, -1], **kw)
        second = torch.stack([model(torch.tensor([prompt + [t]]))[0, -1] for t in range(vocab)])
        p2 = next_token_probs(second, **kw)
    return p1[:, None] * p2  # (V, V)


def chi_square_p_value(counts, probs):
    """Pearson's goodness-of-fit test of ``counts`` against ``probs`` (cells with probability 0
    must be empty): P(chi² >= the statistic) with cells - 1 degrees of freedom."""
    keep = probs > 0
    assert counts[~keep].sum() == 0, "samples fell where the distribution has no mass"
    expected = probs[keep] / probs[keep].sum() * counts.sum()
    stat = ((counts[keep] - expected) ** 2 / expected).sum()
    dof = keep.sum() - 1
    return float(torch.special.gammaincc(dof / 2, stat / 2))


@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.7, top_k=3)], ids=["t1", "t0.7-top3"])
def test_sampled_pairs_follow_the_models_distribution(kw):
    vocab = 4
    model, draft = gpt(0, vocab=vocab), gpt(5, layers=1, vocab=vocab)  # a draft that disagrees often
    prompt = [1, 2]
    p, q = exact_joint(model, prompt, vocab, **kw), exact_joint(draft, prompt, vocab, **kw)
    assert (p - q).abs().sum() > 0.8  # the draft alone would be told apart
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(vocab, vocab)
    stats, accepted = {}, 0
    for _ in range(3000):
        a, b = speculative_generate(model, draft, prompt, 2, draft_tokens=2, generator=gen, stats=stats, **kw)[2:]
        counts[a, b] += 1
        accepted += stats["accepted"]
    assert 0.2 < accepted / 6000 < 0.95  # both branches (kept and refused drafts) ran often
    assert chi_square_p_value(counts, p) > 1e-3
    # the test has the power to see a sampler that draws from the draft
    assert chi_square_p_value(counts, q + 1e-9) < 1e-6


def test_sample_with_a_draft_from_the_command_line(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be, that is the question. " * 100)
    common = ["--data", str(corpus), "--preset", "nano", "--max-iters", "30", "--eval-interval", "30"]
    common += ["--eval-iters", "1", "--no-progress", "--sample-chars", "0"]
    assert main(["train", "gpt", *common, "--out", str(tmp_path / "big")]) == 0
    assert main(["train", "gpt", *common, "--layers", "1", "--out", str(tmp_path / "small")]) == 0
    args = ["sample", "--ckpt", str(tmp_path / "big"), "--prompt", "to be", "--max-new-tokens", "40"]
    args += ["--temperature", "0"]
    capsys.readouterr()
    assert main(args) == 0
    alone = capsys.readouterr().out
    assert main([*args, "--draft", str(tmp_path / "small"), "--draft-tokens", "3"]) == 0
    assert capsys.readouterr().out == alone
    other = tmp_path / "o.txt"
    other.write_text("xyzzy plugh " * 300)
    assert main(["train", "gpt", *common[2:], "--data", str(other), "--out", str(tmp_path / "other")]) == 0
    assert main([*args, "--draft", str(tmp_path / "other")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --draft") and "tokenizer" in err[-1]


def test_batch_of_prompts_with_a_draft_is_refused():
    model = gpt(0)
    with pytest.raises(ValueError, match="one prompt at a time"):
        generate(model, [[1], [2]], 3, draft=model)
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(model, gpt(1, vocab=7), [1], 3)
