"""Open models (issue 49): HuggingFace Llama, Qwen2, Qwen3, Mistral, Phi-3, Gemma 2, Gemma 3 and
GPT-NeoX (Pythia) models built by ``transformers`` from their config classes with random weights
(no download) are read into attnlab's own GPT and give HuggingFace's logits (float32, a
left-padded batch) and its greedy tokens, and the exported folder loads back into
``transformers`` with the same logits; the look-inside kit and TransformerLens's hook values on
them; sharded bf16 checkpoints."""

import pytest
import torch

from attnlab.generate import generate
from attnlab.interop import export_hf, load_hf

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=112, num_hidden_layers=2, max_position_embeddings=128)
# (family, config class, options): per family one with grouped-query attention at a ratio other than
# 1, one with the family's own parts (Qwen3: heads wider than dim / heads; Mistral: a sliding window
# of 5 keys; Qwen2: q/k/v biases, linear RoPE scaling; Llama: biases everywhere, a tied head and
# another rotary base, Llama 3's RoPE scaling; Phi-3: partial rotary; Gemma: caps, windows, QK-norm)
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
    # Llama 3.1/3.2's frequency rescaling: the slow frequencies divided, the fast kept, those between blended
    (
        "llama",
        "LlamaConfig",
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=10000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
    ),  # fmt: skip
    ("qwen2", "Qwen2Config", dict(num_attention_heads=8, num_key_value_heads=2)),
    # dynamic NTK: the base raised once a call passes max_position_embeddings (18: the 20-token
    # batch and the 32 greedy tokens after either prompt pass it; attnlab's context is 3 x 18)
    (
        "llama",
        "LlamaConfig",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=18,
            rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=3.0),
        ),
    ),  # fmt: skip
    (
        "qwen2",
        "Qwen2Config",
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
        ),
    ),  # fmt: skip
    # YaRN (Qwen2.5's long contexts): the slow frequencies divided, the fast kept, a ramp between,
    # cos and sin scaled by its attention factor (here HuggingFace's default from the factor)
    (
        "qwen2",
        "Qwen2Config",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32),
        ),
    ),  # fmt: skip
    # Qwen2's windows on the layers from max_window_layers on
    (
        "qwen2",
        "Qwen2Config",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=3,
            use_sliding_window=True,
            sliding_window=5,
            max_window_layers=1,
        ),
    ),  # fmt: skip
    ("qwen3", "Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32)),
    # YaRN with the ramp's ends unrounded (truncate: false), as some of Qwen3's long-context configs ask
    (
        "qwen3",
        "Qwen3Config",
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            max_position_embeddings=72,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=3.0,
                original_max_position_embeddings=24,
                truncate=False,
                beta_fast=16.0,
            ),
        ),
    ),  # fmt: skip
    ("qwen3", "Qwen3Config", dict(num_attention_heads=8, num_key_value_heads=8, head_dim=8)),
    ("mistral", "MistralConfig", dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
    ("mistral", "MistralConfig", dict(num_attention_heads=4, num_key_value_heads=1, sliding_window=5)),
    ("phi3", "Phi3Config", dict(num_attention_heads=4, num_key_value_heads=2)),
    (
        "phi3",
        "Phi3Config",
        dict(num_attention_heads=4, num_key_value_heads=4, partial_rotary_factor=0.75, sliding_window=7),
    ),  # fmt: skip
    # LongRoPE (Phi-3/3.5 mini 128k): a factor per rotated pair, the long set once a position of the
    # call reaches the original context (16: the 20-token batch is past it; generating after the 9-token
    # prompt crosses it, the cached keys keeping their short rotation, as in HuggingFace)
    (
        "phi3",
        "Phi3Config",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            original_max_position_embeddings=16,
            rope_parameters=dict(
                rope_type="longrope",
                partial_rotary_factor=1.0,
                rope_theta=10000.0,
                original_max_position_embeddings=16,
                short_factor=[1.0 + 0.1 * i for i in range(8)],
                long_factor=[1.5 + 0.5 * i for i in range(8)],
            ),
        ),
    ),  # fmt: skip
    # Gemma 2: soft-capped scores and logits, a window on every other layer, sandwich norms, GeGLU
    (
        "gemma2",
        "Gemma2Config",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=6,
            num_hidden_layers=4,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
        ),
    ),  # fmt: skip
    (
        "gemma2",
        "Gemma2Config",
        dict(
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=24,
            sliding_window=6,
            query_pre_attn_scalar=20,
            num_hidden_layers=2,
        ),
    ),  # fmt: skip
    # Gemma 3: QK-norm, a global layer every 3rd whose RoPE is scaled (linear, as in Gemma 3 4B and
    # above), windowed layers rotating unscaled with another base
    (
        "gemma3_text",
        "Gemma3TextConfig",
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            sliding_window=6,
            num_hidden_layers=3,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            rope_parameters={
                "full_attention": dict(rope_type="linear", rope_theta=1000000.0, factor=8.0),
                "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
            },
        ),
    ),  # fmt: skip
    (
        "gemma3_text",
        "Gemma3TextConfig",
        dict(num_attention_heads=2, num_key_value_heads=2, head_dim=16, sliding_window=4, num_hidden_layers=2),
    ),  # fmt: skip
    # GPT-NeoX (Pythia): no grouped-query attention; parallel blocks, a quarter of each head rotated
    ("gpt_neox", "GPTNeoXConfig", dict(num_attention_heads=4, partial_rotary_factor=0.25)),
    (
        "gpt_neox",
        "GPTNeoXConfig",
        dict(num_attention_heads=2, partial_rotary_factor=1.0, use_parallel_residual=False, hidden_act="gelu_new"),
    ),  # fmt: skip
]


def hf_model(config_class: str, options: dict, seed: int):
    """A HuggingFace causal LM with random weights (its norms' gains too: ones would hide a swap)."""
    rope = {k: options.pop(k) for k in ("rope_theta", "partial_rotary_factor") if k in options}
    rope = {"rope_theta": 10000.0, **rope, "rope_type": "default"} if rope else options.pop("rope_parameters", None)
    ids = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)  # (no early stop; Phi-3's lie past 97)
    config = getattr(transformers, config_class)(**{**SMALL, **ids, **options}, attn_implementation="eager")
    if rope:
        config.rope_parameters = rope
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
            elif name.endswith(("proj.weight", "dense.weight", "4h.weight", "query_key_value.weight")):
                p.normal_(0, 0.2)  # (scores and logits large enough for the soft-caps and windows to bite)
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
    hf = hf_model(config_class, dict(options), seed=len(str(options)))
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf(tmp_path / "hf").eval()
    c = ours.config
    if family == "gpt_neox":
        assert c.norm == "layer" and c.parallel_residual == options.get("use_parallel_residual", True)
        assert c.rotary_dim == int(c.d_head * options["partial_rotary_factor"])
    else:
        assert c.norm == "rms" and c.gated_mlp and c.pos == "rope" and c.kv_heads == options["num_key_value_heads"]
    ids, mask, positions = padded_batch(SMALL["vocab_size"])
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
        mine = ours(ids, positions=positions, key_mask=mask)
    torch.testing.assert_close(mine[mask], theirs[mask], atol=1e-4, rtol=1e-4)
    # 32 greedy tokens, as HuggingFace's generate gives them, after the longest and the shortest prompt
    for row in (0, 2):
        prompt = ids[row, mask[row]].tolist()
        with torch.no_grad():
            expected = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                   max_new_tokens=32, do_sample=False, pad_token_id=0)[0].tolist()  # fmt: skip
        assert generate(ours, [prompt], 32, temperature=0.0)[0] == expected
    # exported back: transformers reads the folder to the same logits
    export_hf(ours, tmp_path / "back")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").float().eval()
    # (a Mistral without a window, a Phi-3 rotating whole heads: shapes a Llama has, exported as one)
    as_llama = (family == "mistral" and not options["sliding_window"]) or (
        family == "phi3" and "partial_rotary_factor" not in options
    )
    assert type(again).__name__ == ("LlamaForCausalLM" if as_llama else type(hf).__name__)
    with torch.no_grad():
        back = again(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
    torch.testing.assert_close(back[mask], theirs[mask], atol=1e-4, rtol=1e-4)


# (config class, rope_type, seeds of the weights and the prompt, the name a refusal gives, N, the most new
# tokens a batched request of 9 may ask for)
ROTATION_CHANGES = [
    ("Phi3Config", "longrope", 11, 2, "LongRoPE", 16, 8),
    ("LlamaConfig", "dynamic", 5, 3, "dynamic NTK scaling", 18, 10),
]


@pytest.mark.parametrize("config_class, kind, seed, prompt_seed, name, limit, within", ROTATION_CHANGES)
def test_a_rotation_that_changes_past_n_decodes_as_huggingface_and_batched_paths_refuse_past_n(
    config_class, kind, seed, prompt_seed, name, limit, within, tmp_path
):
    """LongRoPE rotates by its long factors once a text passes N tokens: the fixed-shape decoder
    refills its cache there, as eager decoding and HuggingFace do. Dynamic NTK rotates by a base
    raised from each call's own length: one token a call, the fixed-shape decoder follows it without
    refilling. Either way it gives HuggingFace's 32 greedy tokens after 9, across N. Continuous
    batching, whose rows share one rotation, refuses a request that would pass N and takes one that
    stays within; speculative decoding, which verifies several tokens in one call, refuses to cross N."""
    from attnlab.generate.batching import ContinuousBatcher, Request
    from attnlab.generate.fast import FastDecoder
    from attnlab.generate import speculative_generate

    options = next(o for _, _, o in CASES if o.get("rope_parameters", {}).get("rope_type") == kind)
    hf = hf_model(config_class, dict(options, rope_parameters=dict(options["rope_parameters"])), seed=seed)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_hf(tmp_path / "hf").eval()
    if kind == "dynamic":  # (HuggingFace's max_position_embeddings is the N it extends, by F = 3)
        assert ours.config.rope_scaling == "dynamic:3.0:18" and ours.config.context == 54
    prompt = torch.randint(97, (9,), generator=torch.Generator().manual_seed(prompt_seed)).tolist()
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 9, dtype=torch.long),
                               max_new_tokens=32, do_sample=False, pad_token_id=0)[0, 9:]  # fmt: skip
    ids, mask = torch.tensor([prompt]), torch.ones(1, 9, dtype=torch.bool)
    fast = FastDecoder(ours, 1, compile=False).generate(ids, mask, 32, lambda logits: logits.argmax(-1))
    assert fast[0].tolist() == expected.tolist()
    batcher = ContinuousBatcher(ours, 2)
    with pytest.raises(ValueError, match=rf"{name}.*passes {limit} tokens.*at most {within} new tokens"):
        batcher.submit(Request(prompt, 32, temperature=0))
    assert batcher.run([Request(prompt, within, temperature=0)])[0].tokens == expected[:within].tolist()
    with pytest.raises(ValueError, match=name):
        speculative_generate(ours, ours, prompt, 32, temperature=0)


def test_rope_scaling_specs_parse_and_refuse_in_one_line():
    from attnlab.models.gpt import GPTConfig
    from attnlab.position import rope_scaling_parts

    assert rope_scaling_parts("yarn:4:32768:32:1:1.1")[1][-1] == 1.0  # (rounded ends by default)
    assert rope_scaling_parts("yarn:4:32768:32:1:1.1:untruncated")[1] == [4.0, 32768.0, 32.0, 1.0, 1.1, 0.0]
    assert rope_scaling_parts("dynamic:2:4096") == ("dynamic", [2.0, 4096.0])
    # which scalings make a call's rotation depend on its longest position (batching and speculative
    # decoding ask every model; the others have fewer numbers than these two)
    from attnlab.models import GPT
    from attnlab.position import rotation_changes_from

    for spec, changes in (("linear:2", None), ("llama3:8:1:4:64", None), ("yarn:4:32:32:1:1.1", None),
                          ("dynamic:2:16", ("dynamic NTK scaling", 16)),
                          ("longrope:16:1.0:1,1,1,1:2,2,2,2", ("LongRoPE", 16))):  # fmt: skip
        model = GPT(GPTConfig(vocab_size=20, context=64, layers=1, heads=2, dim=16, pos="rope", rope_scaling=spec))
        assert rotation_changes_from(model) == changes, spec
    for bad in ("dynamic:2", "dynamic:2:0", "linear:2:untruncated", "ntk:2"):
        with pytest.raises(ValueError, match=r"--rope-scaling .*dynamic:FACTOR:ORIGINAL_CONTEXT"):
            rope_scaling_parts(bad)
    with pytest.raises(ValueError, match="rotate more than 2"):
        GPTConfig(dim=8, heads=4, pos="rope", rope_scaling="dynamic:2:16")
    with pytest.raises(ValueError, match="--window-from .* give the --window"):
        GPTConfig(window_from=2)


INSIDE = {  # a Llama and a Qwen3 (RMSNorm, SwiGLU, 4 query heads on 2 key/value heads, wider heads; Qwen3's
    # QK-norm), a Gemma 2, a Pythia
    "llama": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32)),
    "qwen3": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32)),
    "gemma2": ("Gemma2Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=4)),
    "gpt_neox": ("GPTNeoXConfig", dict(num_attention_heads=4, partial_rotary_factor=0.25)),
}


@pytest.fixture(scope="module", params=sorted(INSIDE))
def model(request, tmp_path_factory):
    """An attnlab GPT read from a random HuggingFace model of the family."""
    folder = tmp_path_factory.mktemp(request.param)
    hf = hf_model(*INSIDE[request.param], seed=3)
    hf.save_pretrained(folder)
    return load_hf(folder).eval()


def test_the_look_inside_kit_on_modern_families(model):
    """Every hook point named as for GPT-2 (the norms' scales, the gated MLP's gate and up
    projection), the logit lens ending at the logits, direct logit attribution summing to the
    logit through RMSNorm, weight processing keeping the log-probabilities, head detectors and
    activation patching."""
    from attnlab.inspect.detectors import head_scores, repeated_random_tokens
    from attnlab.inspect.lens import direct_logit_attribution, logit_lens
    from attnlab.inspect.patching import logit_difference, patch_activations
    from attnlab.inspect.weights import process_weights

    idx = torch.randint(97, (2, 12), generator=torch.Generator().manual_seed(1))
    logits, cache = model.run_with_cache(idx)
    gated = model.config.gated_mlp
    for name in ("ln1.hook_scale", "ln1.hook_normalized", "mlp.hook_pre", "mlp.hook_post", "attn.hook_q",
                 "attn.hook_k", "attn.hook_pattern", "hook_resid_post") + (("mlp.hook_pre_linear",) if gated else ()):  # fmt: skip
        assert f"blocks.1.{name}" in cache.keys(), name
    if gated:
        assert cache["blocks.0.attn.hook_q"].shape == (2, 4, 12, 32) and cache["blocks.0.attn.hook_k"].shape[1] == 2
        assert cache["blocks.0.ln1.hook_scale"].shape == (2, 12, 1)
        scale = cache["blocks.1.ln1.hook_scale"]
        resid = cache["blocks.1.hook_resid_pre"]
        assert torch.allclose(scale, (resid.pow(2).mean(-1, keepdim=True) + model.blocks[1].ln1.eps).sqrt())
    with torch.no_grad():
        assert torch.allclose(logit_lens(model, idx)[-1], model(idx), atol=1e-4)
        for token, position in ((5, -1), (40, 6)):
            parts = direct_logit_attribution(model, idx, token, position)
            per_head = 0 if model.config.sandwich_norm else 2 * 4  # (Gemma: one attention term per layer)
            assert len([k for k in parts if ".H" in k]) == per_head and "L1.mlp" in parts
            total = torch.stack(list(parts.values())).sum(0)
            assert torch.allclose(total, logits[:, position, token], atol=1e-4), (total, logits[:, position, token])
        processed = process_weights(model, center_unembed=not model.config.logit_softcap)  # (a cap is no shift)
        assert torch.allclose(processed(idx).log_softmax(-1), logits.log_softmax(-1), atol=1e-4)
        assert torch.allclose(processed.blocks[0].ln2.weight, torch.ones(64))  # (the gains went into the readers)
    scores = head_scores(model, repeated_random_tokens(2, 6, 97, torch.Generator().manual_seed(5)))
    assert all(s.shape == (2, 4) and ((s >= 0) & (s <= 1)).all() for s in scores.values())
    clean = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    corrupt = clean.clone()
    corrupt[0, 3] = 9
    with torch.no_grad():
        last = model(clean)[0, -1]
    metric = logit_difference(int(last.argmax()), int(last.argmin()))
    restored = patch_activations(model, (clean,), (corrupt,), metric)
    assert abs(restored[0, 3] - 1) < 1e-4 and restored[0, [0, 1, 2, 4, 5, 6, 7]].abs().max() < 1e-4


def test_a_sharded_bf16_checkpoint_is_read_and_named_layers_need_their_weights(tmp_path):
    """A checkpoint saved in bf16 shards (model.safetensors.index.json) reads to the model's own
    logits (its weights widened to float32); a missing shard is named in one line."""
    hf = hf_model("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=2), seed=5).to(torch.bfloat16)
    hf.save_pretrained(tmp_path / "hf", max_shard_size="40KB")
    shards = sorted(p.name for p in (tmp_path / "hf").glob("*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    ours = load_hf(tmp_path / "hf").eval()
    assert all(p.dtype == torch.float32 and not p.is_meta for p in ours.parameters())
    ids = torch.randint(97, (2, 9), generator=torch.Generator().manual_seed(0))
    # (read back by transformers in float32: casting the bf16 model itself would leave its rotary
    # frequencies rounded to bf16)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), again(ids).logits, atol=1e-4, rtol=1e-4)
    # dtype="bf16": the checkpoint's bf16 weights kept as they are; the verbs run in bf16
    import attnlab
    from attnlab.interop import write_hf_tokenizer
    from attnlab.tokens import CharTokenizer

    write_hf_tokenizer(CharTokenizer(sorted(["\n"] + [chr(i) for i in range(32, 128)])), tmp_path / "hf")  # 97 ids
    half = attnlab.load(tmp_path / "hf", dtype="bf16")
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        torch.testing.assert_close(half(ids).float(), ours(ids), atol=0.15, rtol=0.05)
    assert len(half.generate("abc", max_new_tokens=5, temperature=0)) >= 3
    # in bf16 on both sides, attnlab's plain layers compute what transformers' do, rounding for
    # rounding (RoPE's θ kept in float32 when the model is cast): the same logits to the bit and
    # the same greedy tokens, where near-ties make any other rounding pick others
    assert all(m.inv_freq.dtype == torch.float32 for m in half.modules() if hasattr(m, "inv_freq"))
    hf16 = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.bfloat16).eval()
    long = torch.randint(97, (1, 60), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(half(long), hf16(long).logits)
        theirs = hf16.generate(long[:, :8], max_new_tokens=40, do_sample=False, pad_token_id=0)[0, 8:]
    assert generate(half, long[:, :8], 40, temperature=0)[0][8:] == theirs.tolist()
    from attnlab.errors import OptionError

    with pytest.raises(OptionError, match="dtype='int4': choose one of fp32, bf16, fp16"):
        attnlab.load(tmp_path / "hf", dtype="int4")
    (tmp_path / "hf" / shards[1]).unlink()
    from attnlab.errors import CheckpointError

    with pytest.raises(CheckpointError, match=f"lacks {shards[1]}, a shard"):
        load_hf(tmp_path / "hf")


def test_the_same_hook_values_as_transformer_lens_on_a_llama(tmp_path, monkeypatch):
    """A random Llama (grouped-query attention) booted by TransformerLens's TransformerBridge
    (offline, from a local folder) and loaded by attnlab: the same logits, and the same values
    under the same hook names, RMSNorm's scale and the gated MLP's up projection included.
    attnlab's hook_q / hook_k come after the rotation: TransformerLens's hook_rot_q / hook_rot_k."""
    pytest.importorskip("transformer_lens")
    from tokenizers import Tokenizer, models, pre_tokenizers

    import attnlab

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import transformer_lens.model_bridge.sources.transformers  # noqa: F401 (attaches boot_transformers)
    from transformer_lens.model_bridge import TransformerBridge

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      bos_token_id=0, eos_token_id=0, pad_token_id=None)  # fmt: skip
    transformers.LlamaForCausalLM(config).eval().save_pretrained(tmp_path / "llama")
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(50)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", bos_token="t0",
                                         eos_token="t0").save_pretrained(tmp_path / "llama")  # fmt: skip
    tl_model = TransformerBridge.boot_transformers(str(tmp_path / "llama"), device="cpu")
    ours = attnlab.load(tmp_path / "llama")
    ids = torch.randint(50, (2, 10), generator=torch.Generator().manual_seed(1))
    tl_logits, tl = tl_model.run_with_cache(ids)
    logits, cache = ours.run_with_cache(ids)
    assert torch.allclose(logits, tl_logits, atol=1e-5)
    for i in range(2):
        for name in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out",
                     "attn.hook_pattern", "mlp.hook_pre", "mlp.hook_pre_linear", "mlp.hook_post", "ln1.hook_scale",
                     "ln1.hook_normalized", "ln2.hook_scale"):  # fmt: skip
            key = f"blocks.{i}.{name}"
            assert torch.allclose(cache[key], tl[key], atol=1e-5), key
        for ours_name, theirs_name in (("hook_q", "hook_rot_q"), ("hook_k", "hook_rot_k"), ("hook_v", "hook_v"),
                                       ("hook_z", "hook_z")):  # TL: (B, T, H, d); attnlab (B, H, T, d)  # fmt: skip
            a, b = cache[f"blocks.{i}.attn.{ours_name}"].transpose(1, 2), tl[f"blocks.{i}.attn.{theirs_name}"]
            assert torch.allclose(a, b, atol=1e-5), ours_name
