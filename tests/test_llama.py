"""Llama-shaped families (issue 49): HuggingFace Llama, Qwen2, Qwen3 and Mistral models built by
``transformers`` from their config classes with random weights (no download) are read into
attnlab's own GPT and give HuggingFace's logits (float32, a left-padded batch) and its greedy
tokens, and the exported folder loads back into ``transformers`` with the same logits."""

import pytest
import torch

from attnlab.generate import generate
from attnlab.interop import export_hf, load_hf

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=112, num_hidden_layers=2, max_position_embeddings=128)
# (family, config class, options): one with grouped-query attention at a ratio other than 1, one with
# the family's own parts (Qwen3: heads wider than dim / heads; Mistral: a sliding window of 5 keys;
# Qwen2: q/k/v biases; Llama: biases everywhere, a tied head and another rotary base)
CASES = [
    ("llama", "LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2)),
    (
        "llama",
        "LlamaConfig",
        dict(
            num_attention_heads=4,
            num_key_value_heads=4,
            attention_bias=True,
            mlp_bias=True,
            tie_word_embeddings=True,
            rope_theta=500000.0,
        ),
    ),  # fmt: skip
    ("qwen2", "Qwen2Config", dict(num_attention_heads=8, num_key_value_heads=2)),
    ("qwen2", "Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)),
    ("qwen3", "Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32)),
    ("qwen3", "Qwen3Config", dict(num_attention_heads=8, num_key_value_heads=8, head_dim=8)),
    ("mistral", "MistralConfig", dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
    ("mistral", "MistralConfig", dict(num_attention_heads=4, num_key_value_heads=1, sliding_window=5)),
]


def hf_model(config_class: str, options: dict, seed: int):
    """A HuggingFace causal LM with random weights (its norms' gains too: ones would hide a swap)."""
    config = getattr(transformers, config_class)(**SMALL, **options, attn_implementation="eager")
    if "rope_theta" in options:
        config.rope_parameters = {"rope_theta": options["rope_theta"], "rope_type": "default"}
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


def padded_batch(vocab: int):
    """Three prompts of 20, 14 and 9 tokens, left-padded: ids (3, 20), mask (3, 20), positions."""
    g = torch.Generator().manual_seed(0)
    lengths = [20, 14, 9]
    ids = torch.zeros(3, 20, dtype=torch.long)
    mask = torch.zeros(3, 20, dtype=torch.bool)
    for row, n in enumerate(lengths):
        ids[row, 20 - n :] = torch.randint(vocab, (n,), generator=g)
        mask[row, 20 - n :] = True
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


@pytest.mark.parametrize("family, config_class, options", CASES)
def test_a_family_gives_huggingfaces_logits_and_tokens_both_ways(family, config_class, options, tmp_path):
    hf = hf_model(config_class, options, seed=len(str(options)))
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf(tmp_path / "hf").eval()
    assert ours.config.norm == "rms" and ours.config.gated_mlp and ours.config.pos == "rope"
    ids, mask, positions = padded_batch(SMALL["vocab_size"])
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
        mine = ours(ids, positions=positions, key_mask=mask)
    torch.testing.assert_close(mine[mask], theirs[mask], atol=1e-4, rtol=1e-4)
    # 32 greedy tokens, as HuggingFace's generate gives them
    prompt = ids[0, mask[0]].tolist()
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                               max_new_tokens=32, do_sample=False, pad_token_id=0)[0].tolist()  # fmt: skip
    assert generate(ours, [prompt], 32, temperature=0.0)[0] == expected
    # exported back: transformers reads the folder to the same logits
    export_hf(ours, tmp_path / "back")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").float().eval()
    windowless_mistral = family == "mistral" and not options["sliding_window"]  # (that is a Llama)
    assert type(again).__name__ == ("LlamaForCausalLM" if windowless_mistral else type(hf).__name__)
    with torch.no_grad():
        back = again(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
    torch.testing.assert_close(back[mask], theirs[mask], atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """A Qwen3-shaped attnlab GPT read from a random HuggingFace model: RMSNorm, SwiGLU,
    grouped-query attention (4 query heads on 2 key/value heads), QK-norm, wider heads."""
    folder = tmp_path_factory.mktemp("qwen3")
    hf = hf_model("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32), seed=3)
    with torch.no_grad():  # (larger weights: the terms below are far from zero)
        for name, p in hf.named_parameters():
            if name.endswith("proj.weight"):
                p.normal_(0, 0.2)
    hf.save_pretrained(folder)
    return load_hf(folder).eval()


def test_the_look_inside_kit_on_a_llama_shaped_model(qwen3):
    """Every hook point named as for GPT-2 (the norms' scales, the gated MLP's gate and up
    projection), the logit lens ending at the logits, direct logit attribution summing to the
    logit through RMSNorm, weight processing keeping the log-probabilities, head detectors and
    activation patching."""
    from attnlab.inspect.detectors import head_scores, repeated_random_tokens
    from attnlab.inspect.lens import direct_logit_attribution, logit_lens
    from attnlab.inspect.patching import logit_difference, patch_activations
    from attnlab.inspect.weights import process_weights

    idx = torch.randint(97, (2, 12), generator=torch.Generator().manual_seed(1))
    logits, cache = qwen3.run_with_cache(idx)
    for name in ("ln1.hook_scale", "ln1.hook_normalized", "mlp.hook_pre", "mlp.hook_pre_linear", "mlp.hook_post",
                 "attn.hook_q", "attn.hook_k", "attn.hook_pattern", "hook_resid_post"):  # fmt: skip
        assert f"blocks.1.{name}" in cache.keys(), name
    assert cache["blocks.0.attn.hook_q"].shape == (2, 4, 12, 32) and cache["blocks.0.attn.hook_k"].shape[1] == 2
    scale = cache["blocks.0.ln1.hook_scale"]
    resid = cache["blocks.0.hook_resid_pre"]
    assert torch.allclose(scale, (resid.pow(2).mean(-1, keepdim=True) + qwen3.blocks[0].ln1.eps).sqrt())
    with torch.no_grad():
        assert torch.allclose(logit_lens(qwen3, idx)[-1], qwen3(idx), atol=1e-4)
        for token, position in ((5, -1), (40, 6)):
            parts = direct_logit_attribution(qwen3, idx, token, position)
            assert len([k for k in parts if ".H" in k]) == 2 * 4
            total = torch.stack(list(parts.values())).sum(0)
            assert torch.allclose(total, logits[:, position, token], atol=1e-4), (total, logits[:, position, token])
        processed = process_weights(qwen3)
        assert torch.allclose(processed(idx).log_softmax(-1), logits.log_softmax(-1), atol=1e-4)
        assert torch.allclose(processed.blocks[0].ln2.weight, torch.ones(64))  # (the gains went into gate and up)
    scores = head_scores(qwen3, repeated_random_tokens(2, 6, 97, torch.Generator().manual_seed(5)))
    assert all(s.shape == (2, 4) and ((s >= 0) & (s <= 1)).all() for s in scores.values())
    clean = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    corrupt = clean.clone()
    corrupt[0, 3] = 9
    with torch.no_grad():
        last = qwen3(clean)[0, -1]
    metric = logit_difference(int(last.argmax()), int(last.argmin()))
    restored = patch_activations(qwen3, (clean,), (corrupt,), metric)
    assert abs(restored[0, 3] - 1) < 1e-4 and restored[0, [0, 1, 2, 4, 5, 6, 7]].abs().max() < 1e-4
