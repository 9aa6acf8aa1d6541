"""GGUF files in (issue 80, part 1): a small Llama GGUF written here with the ``gguf`` package, in
each quantisation type, loads in attnlab with the same logits as ``transformers``' own GGUF loader
(its dequantisers and its reversal of llama.cpp's query/key reordering are written independently
of gguf-py's), the same token ids from the file's vocabulary and merges, hooks that fire, and its
chat template; a file that is not GGUF, a truncated one and an unknown architecture are refused in
one line. No download: the file is made from a model with random weights."""

import json

import numpy as np
import pytest
import torch

import attnlab

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
from gguf import GGMLQuantizationType as Q  # noqa: E402

TEXTS = ["Hello world, this is attnlab.", "  two  spaces\nand a line", "numbers 12345 and ümlauts"]
TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|endoftext|>{% endfor %}<|assistant|>"


def _bpe(size: int = 300):
    """A byte-level BPE vocabulary and its merges, learned here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator([" ".join(TEXTS) * 20, "the cat sat on the mat " * 50], trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    return tokens, merges


def _permute(w: torch.Tensor, heads: int) -> np.ndarray:
    """llama.cpp's converter's reordering of a query or key projection (convert_hf_to_gguf.py)."""
    w = w.numpy()
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _k_blocks(rows: int, cols: int, qtype) -> np.ndarray:
    """Random K-quant blocks with small finite scales (gguf-py reads K-quants but does not write them)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(0).integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
    if qtype == Q.Q4_K:  # d, dmin (f16) first
        raw[..., 0:2], raw[..., 2:4] = scale, scale
    else:  # Q6_K: d (f16) last
        raw[..., -2:] = scale
    return raw.reshape(rows, -1)


def write_gguf(path, qtype=Q.F32, arch: str = "llama"):
    """A 2-layer Llama (grouped-query attention) as llama.cpp's converter writes it; returns the
    HuggingFace model its weights came from."""
    tokens, merges = _bpe()
    config = transformers.LlamaConfig(vocab_size=len(tokens), hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(128)
    w.add_embedding_length(256)
    w.add_block_count(2)
    w.add_feed_forward_length(512)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(64)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3 if t == "<|endoftext|>" else 1 for t in tokens])
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|endoftext|>"))
    w.add_chat_template(TEMPLATE)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}  # fmt: skip
    layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}  # fmt: skip
    for name, t in hf.state_dict().items():
        if name.startswith("model.layers."):
            i, rest = name[len("model.layers.") :].split(".", 1)
            part = rest.rsplit(".", 1)[0]
            gname = f"blk.{i}.{layer[part]}.weight"
        else:
            gname = names[name]
        data = t.detach().float()
        if gname.endswith("attn_q.weight"):
            data = _permute(data, 4)
        elif gname.endswith("attn_k.weight"):
            data = _permute(data, 2)
        data = np.ascontiguousarray(np.asarray(data, dtype=np.float32))
        if data.ndim == 1 or qtype == Q.F32:
            w.add_tensor(gname, data)
        elif qtype in (Q.Q4_K, Q.Q6_K):
            raw = _k_blocks(data.shape[0], data.shape[1], qtype)
            w.add_tensor(gname, raw, raw_shape=raw.shape, raw_dtype=qtype)
        else:
            raw = gguf.quants.quantize(data, qtype)
            w.add_tensor(gname, raw, raw_shape=raw.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    made = {}
    for qtype in (Q.F32, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K):
        path = folder / f"llama-{qtype.name}.gguf"
        made[qtype.name] = (path, write_gguf(path, qtype))
    return made


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"])
def test_a_gguf_loads_with_transformers_logits_and_ids(files, qtype):
    path, _ = files[qtype]
    ours = attnlab.load(path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
    their_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in TEXTS:
        ids = ours.tokenizer.encode(text)
        assert ids == their_tok.encode(text, add_special_tokens=False), text
        assert ours.tokenizer.decode(ids) == text
    x = torch.tensor([ours.tokenizer.encode(TEXTS[0])])
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x).logits.float(), atol=1e-4, rtol=1e-4)


def test_an_unquantised_gguf_is_the_model_it_was_written_from(files):
    """Independently of transformers' GGUF path: the float32 file gives the logits of the HuggingFace
    model whose weights it holds (llama.cpp's query/key reordering undone)."""
    path, hf = files["F32"]
    ours = attnlab.load(path)
    x = torch.randint(0, ours.config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-4, rtol=1e-4)


def test_a_quantised_gguf_keeps_every_hook_and_its_chat_template(files):
    path, _ = files["Q4_0"]
    model = attnlab.load(path)
    ids = torch.tensor([model.tokenizer.encode("the cat sat")])
    logits, cache = model.run_with_cache(ids)
    assert cache["blocks.1.attn.hook_pattern"].shape == (1, 4, ids.shape[1], ids.shape[1])
    assert cache["blocks.0.hook_resid_post"].shape == (1, ids.shape[1], 256)
    assert model.eos_ids == (model.tokenizer.token_to_id("<|endoftext|>"),)
    assert model.chat_ids([{"role": "user", "content": "hi"}]) == model.tokenizer.encode(
        "<|user|>hi<|endoftext|><|assistant|>"
    )
    assert isinstance(model.generate("the cat", 5, temperature=0), str)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q4_K"])
def test_quantize_int4_keeps_the_files_4_bit_weights_and_hooks_read_them_dequantised(files, qtype):
    """``--quantize int4`` on a Q4_0, Q4_1 or Q4_K file keeps its projections' numbers as stored
    (Int4Linear: 4 bits, a scale and a zero per 32 weights; the fused qkv too): a weight read through
    the layer is gguf-py's dequantised one (its reference dequantiser, written apart from attnlab's
    block reading) up to the bf16 rounding of the scales and zeros; the product is the product with
    that weight in bf16; every hook still fires, and it decodes."""
    from attnlab.generate.quantize import Int4Linear, quantized_copy

    path, _ = files[qtype]
    dense = attnlab.load(path)
    model = quantized_copy(dense, "int4")
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if name.startswith("blocks.0.")}
    for name in ("attn.qkv", "attn.out_proj", "mlp.gate", "mlp.fc", "mlp.proj"):
        assert kinds[f"blocks.0.{name}"] == "Int4Linear", (name, kinds)
        assert f"blocks.0.{name}" in dense.gguf_int4  # (the file's numbers, not rounded again)
    reader = gguf.GGUFReader(path)
    down = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    layer = model.blocks[0].mlp.proj
    want = torch.from_numpy(np.asarray(gguf.quants.dequantize(down.data, down.tensor_type), dtype=np.float32))
    want = want.reshape(layer.out_features, layer.in_features)
    _, scale, zero = dense.gguf_int4["blocks.0.mlp.proj"]
    rounding = 2**-8 * (8 * scale.abs().max() + zero.abs().max())  # (bf16 keeps 8 bits of each)
    assert isinstance(layer, Int4Linear) and layer.weight_int4.dtype == torch.uint8
    assert (layer.weight - want).abs().max() <= rounding
    x = torch.randn(3, layer.in_features)
    torch.testing.assert_close(layer(x), x.bfloat16().float() @ layer.weight.T, atol=2e-2, rtol=2e-2)
    mlp = model.blocks[0].mlp  # (its gate and up as one product too: the same numbers, side by side)
    x = torch.randn(3, mlp.gate.in_features)
    assert isinstance(mlp.gate_up, Int4Linear) and torch.equal(mlp.gate_up(x), torch.cat([mlp.gate(x), mlp.fc(x)], -1))
    ids = torch.tensor([model.tokenizer.encode("the cat sat")])
    _, cache = model.run_with_cache(ids)
    assert cache["blocks.1.attn.hook_pattern"].shape[-1] == ids.shape[1]
    assert isinstance(model.generate("the cat", 5, temperature=0), str)


def test_quantize_int4_keeps_what_a_file_stores_finer_in_int8(files):
    """A file's layers stored finer than 4 bits (here every one, Q8_0) go int8 under --quantize int4,
    not rounded further; a model that is not from a GGUF file is rounded to 4 bits throughout."""
    from attnlab.generate.quantize import Int4Linear, Int8Linear, quantized_copy

    path, _ = files["Q8_0"]
    dense = attnlab.load(path)
    assert dense.gguf_int4 == {}
    kinds = {type(m) for m in quantized_copy(dense, "int4").modules()}
    assert Int8Linear in kinds and Int4Linear not in kinds
    del dense.gguf_int4  # (as a model from anywhere else)
    kinds = {type(m) for m in quantized_copy(dense, "int4").modules()}
    assert Int4Linear in kinds and Int8Linear not in kinds


def test_an_int4_layer_rounds_each_group_of_a_row_to_16_levels():
    """Int4Linear.from_linear (``--quantize int4`` on any model): each group of 32 weights of a row on
    16 levels from its smallest to its largest, by hand on one group (its scale and zero kept in
    bf16); the product is the product with the dequantised weight, in bf16."""
    from torch import nn

    from attnlab.generate.quantize import Int4Linear

    linear = nn.Linear(64, 2, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.linspace(-1.0, 2.0, 128).reshape(2, 64))
    layer = Int4Linear.from_linear(linear)
    group = linear.weight[0, :32].detach()
    step = (group.max() - group.min()) / 15
    by_hand = group.min() + torch.round((group - group.min()) / step) * step
    torch.testing.assert_close(layer.weight[0, :32], by_hand, atol=2e-2, rtol=0)  # (its scale and zero in bf16)
    assert (layer.weight - linear.weight).abs().max() <= step / 2 + 2e-2
    x = torch.randn(4, 64)
    torch.testing.assert_close(layer(x), x.bfloat16().float() @ layer.weight.T, atol=2e-2, rtol=2e-2)


def test_bad_gguf_files_are_refused_in_one_line(files, tmp_path, capsys):
    from attnlab.cli import main

    good, _ = files["Q8_0"]
    not_gguf = tmp_path / "not.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip file" * 10)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 3])
    other = tmp_path / "other.gguf"
    data = bytearray(good.read_bytes())
    at = data.index(b"llama", 0, 4096)  # general.architecture's value (same length: the file stays whole)
    data[at : at + 5] = b"mamba"
    other.write_bytes(bytes(data))
    for path, says in ((not_gguf, "is not a GGUF file"), (truncated, "damaged or truncated GGUF file"),
                       (other, "a GGUF file of architecture 'mamba'; attnlab reads llama, mistral, qwen2, qwen3")):  # fmt: skip
        assert main(["sample", "--ckpt", str(path), "--prompt", "the", "--max-new-tokens", "2"]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
