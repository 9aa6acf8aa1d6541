"""GGUF files (llama.cpp's format: what Ollama, LM Studio and llama-cpp-python run) read into
attnlab's GPT with the ``gguf`` package (``pip install 'attnlab[gguf]'``; no ``transformers``).

The file's metadata becomes the HuggingFace config of its family (Llama, Mistral, Qwen2, Qwen3),
its tensors that family's weights under their HuggingFace names, so the family's one converter
(:mod:`attnlab.interop.llama`) builds the model, as for a HuggingFace folder. Quantised tensors
(Q8_0, Q4_0, Q4_1, the K-quants and every other type gguf-py knows) are dequantised to float32 with
gguf-py's reference dequantisers; the Q4_0, Q4_1 and Q4_K ones are also kept as stored, which
``--quantize int4`` decodes with as they are (4-bit weights, their product in ATen's int4 CPU kernel). The tokenizer (a byte-level BPE: ``tokenizer.ggml.model`` gpt2)
is made from the file's vocabulary, merges and token types as ``transformers``' GGUF loader makes
it, so the ids are the same; the chat template and end ids come from the file too.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import CheckpointError, does_not_fit

MAGIC = b"GGUF"

# llama.cpp architecture -> the HuggingFace model_type whose converter reads it
ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}

# GGUF tensor names (blk.N.*) -> HuggingFace names (model.layers.N.*)
LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
MODEL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# how a byte-level vocabulary splits text before its merges (``tokenizer.ggml.pre``); the others
# split as GPT-2 does (the pre-tokenizer's own pattern)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPLITS = {"llama3": LLAMA3_SPLIT, "llama-v3": LLAMA3_SPLIT, "llama-bpe": LLAMA3_SPLIT, "smaug-bpe": LLAMA3_SPLIT,
          "qwen2": QWEN2_SPLIT, "deepseek-r1-qwen": QWEN2_SPLIT}  # fmt: skip
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` is a file that starts as a GGUF file does (or is named .gguf)."""
    p = Path(path)
    if not p.is_file():
        return False
    if p.suffix.lower() == ".gguf":
        return True
    with open(p, "rb") as f:
        return f.read(4) == MAGIC


def _gguf_package():
    try:
        import gguf
    except ImportError:
        raise CheckpointError("reading a GGUF file needs the gguf package: pip install 'attnlab[gguf]'") from None
    return gguf


def read(path: str | Path):
    """The file's ``gguf.GGUFReader``; a file that is not GGUF, or a damaged or truncated one, is
    refused in one line before anything is built."""
    gguf = _gguf_package()
    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(4)
    if head != MAGIC:
        raise CheckpointError(f"{p} is not a GGUF file (it starts with {head!r}, not b'GGUF')")
    try:
        return gguf.GGUFReader(p, "r")
    except (ValueError, IndexError, KeyError, OSError, struct.error, TypeError) as e:
        raise CheckpointError(f"{p} is a damaged or truncated GGUF file ({type(e).__name__}: {e})") from None


def metadata(reader) -> dict[str, Any]:
    """Every key-value field of the file, as Python values."""
    out = {}
    for name, field in reader.fields.items():
        try:
            out[name] = field.contents()
        except (ValueError, IndexError, UnicodeDecodeError):  # (a value gguf-py cannot decode: left out)
            continue
    return out


def hf_config(meta: dict[str, Any], tensors: set[str], path: Path) -> dict[str, Any]:
    """The HuggingFace config.json of the file's family, from its metadata."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(
            f"{path} is a GGUF file of architecture {arch!r}; attnlab reads {', '.join(ARCHITECTURES)} GGUF files"
        )

    def value(key: str, default: Any = None) -> Any:
        got = meta.get(f"{arch}.{key}", default)
        if got is None:
            raise CheckpointError(f"{path} has no {arch}.{key} (a GGUF file of {arch} states it); the file is damaged")
        return got

    heads = int(value("attention.head_count"))
    dim = int(value("embedding_length"))
    vocab = len(meta.get("tokenizer.ggml.tokens") or []) or int(value("vocab_size"))
    cfg: dict[str, Any] = {
        "model_type": ARCHITECTURES[arch],
        "hidden_size": dim,
        "num_hidden_layers": int(value("block_count")),
        "intermediate_size": int(value("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(value("attention.head_count_kv", heads)),
        "head_dim": int(value("attention.key_length", dim // heads)),
        "rms_norm_eps": float(value("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(value("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(value("context_length", 2048)),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in tensors,
        "hidden_act": "silu",
    }
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none") or "rope_freqs.weight" in tensors:  # (Llama 3.1's scaling is a tensor)
        raise CheckpointError(
            f"{path} scales its rotary positions ({scaling or 'rope_freqs'}); attnlab does not read that from GGUF "
            "yet: load the HuggingFace folder of the same model"
        )
    if arch == "mistral" and meta.get("mistral.attention.sliding_window"):
        cfg["sliding_window"] = int(meta["mistral.attention.sliding_window"])
    if arch == "llama" and "blk.0.attn_q.bias" in tensors:
        cfg["attention_bias"] = cfg["mlp_bias"] = True
    return cfg


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of a Llama or Mistral query or key projection (its converter
    interleaves each head's two rotary halves, for its own rotation)."""
    rows = w.shape[0]  # (llama.cpp: (heads, 2, rows/heads/2) -> (heads, rows/heads/2, 2); this turns it back)
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_state(reader, cfg: dict[str, Any], path: Path) -> tuple[dict[str, Tensor], dict[str, tuple]]:
    """The file's tensors, dequantised to float32, under their HuggingFace names; and the 4-bit ones'
    numbers as they are stored (:func:`int4_groups`), under the same names."""
    gguf = _gguf_package()
    permuted = cfg["model_type"] in ("llama", "mistral")
    state, groups = {}, {}
    for t in reader.tensors:
        base, _, kind = t.name.rpartition(".")
        parts = base.split(".")
        if parts[0] == "blk" and len(parts) == 3 and parts[2] in LAYER_TENSORS:
            name = f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}.{kind}"
        elif base in MODEL_TENSORS:
            name = f"{MODEL_TENSORS[base]}.{kind}"
        else:
            raise CheckpointError(f"{path} holds a tensor {t.name!r} that a {cfg['model_type']} model does not have")
        try:
            data = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise CheckpointError(f"{path}: tensor {t.name} is of quantisation type {t.tensor_type.name}, which "
                                  "gguf-py cannot dequantise") from None  # fmt: skip
        except (ValueError, IndexError) as e:
            raise CheckpointError(f"{path}: tensor {t.name} is damaged or truncated ({e})") from None
        data = np.array(data, dtype=np.float32).reshape([int(n) for n in reversed(t.shape)])  # (a copy: writable)
        stored = int4_groups(t.data, t.tensor_type.name, len(data)) if data.ndim == 2 and kind == "weight" else None
        heads = {"attn_q": "num_attention_heads", "attn_k": "num_key_value_heads"}.get(parts[-1])
        if permuted and heads and kind == "weight":
            data = unpermute(data, cfg[heads])
            if stored is not None:  # (the same rows, reordered alike)
                stored = (
                    unpermute(stored[0], cfg[heads]),
                    unpermute(stored[1], cfg[heads]),
                    unpermute(stored[2], cfg[heads]),
                )
        state[name] = torch.from_numpy(np.ascontiguousarray(data))
        if stored is not None:
            groups[name] = stored
    return state, groups


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's spelling of the 256 bytes as printable characters (what a byte-level BPE's vocabulary
    is written in)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def gguf_tokenizer(meta: dict[str, Any], path: Path):
    """The file's tokenizer as attnlab's BPE tokenizer (a ``tokenizers`` pipeline), or None when the
    file has none."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    from ..tokens import BPETokenizer

    tokens = meta.get("tokenizer.ggml.tokens")
    kind = meta.get("tokenizer.ggml.model")
    if not tokens:
        return None
    if kind != "gpt2":
        raise CheckpointError(
            f"{path} has a {kind!r} tokenizer; attnlab reads the byte-level BPE ones (tokenizer.ggml.model "
            "'gpt2': Llama 3, Qwen, SmolLM) from GGUF so far"
        )
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i for i, t in enumerate(tokens)
    }
    merges = [tuple(m.split(" ")) for m in meta.get("tokenizer.ggml.merges") or []]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False))  # fmt: skip
    split = SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )  # fmt: skip
    tok.decoder = decoders.ByteLevel()
    types = list(meta.get("tokenizer.ggml.token_type") or [])
    control = [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types)
               if k == CONTROL and set(t) <= alphabet]  # fmt: skip
    if control:
        tok.add_special_tokens(control)
    user = [AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types) if k == USER_DEFINED]
    if user:
        tok.add_tokens(user)
    return BPETokenizer(tok)


def gguf_generation(meta: dict[str, Any]):
    """The end, start and padding ids and the chat template the file states."""
    from .generation import ChatTemplate, GenerationSettings

    tokens = meta.get("tokenizer.ggml.tokens") or []

    def token_id(key: str) -> int | None:
        got = meta.get(f"tokenizer.ggml.{key}")
        return int(got) if isinstance(got, (int, np.integer)) and 0 <= int(got) < max(len(tokens), 1) else None

    eos = [i for i in (token_id("eos_token_id"), token_id("eot_token_id")) if i is not None]
    bos = token_id("bos_token_id")
    source = meta.get("tokenizer.chat_template")
    special = {"bos_token": tokens[bos] if bos is not None else None,
               "eos_token": tokens[eos[0]] if eos else None}  # fmt: skip
    return GenerationSettings(
        eos_ids=tuple(dict.fromkeys(eos)),
        bos_id=bos,
        pad_id=token_id("padding_token_id"),
        chat_template=ChatTemplate(source, {k: v for k, v in special.items() if v}) if source else None,
    )


def int4_groups(data: np.ndarray, kind: str, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A Q4_0, Q4_1 or Q4_K tensor's raw blocks (``data``: its ``rows`` rows' bytes, uint8) as
    :class:`~attnlab.generate.quantize.Int4Linear` takes them: (q (rows, cols) 0..15, scale and zero
    (rows, cols / 32)), W = (q − 8)·scale + zero exactly (the scales are float16 in the file, float32
    here); None for any other type. Q4_0: W = (q − 8)·d; Q4_1: W = q·d + m; Q4_K: each 32-weight
    sub-block of a 256-weight super-block W = q·(d·sc) − dmin·m, its 6-bit sc and m packed in 12 bytes
    (llama.cpp's ggml-quants.c; gguf-py's reference dequantisers read them the same way)."""
    f16 = lambda b: b.copy().view(np.float16).astype(np.float32)  # noqa: E731
    if kind in ("Q4_0", "Q4_1"):
        head = 2 if kind == "Q4_0" else 4
        blocks = data.reshape(-1, head + 16)
        d = f16(blocks[:, :2])[:, 0]
        nibbles = blocks[:, head:]
        q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1)  # (blocks, 32): low nibbles first
        zero = np.zeros_like(d) if kind == "Q4_0" else f16(blocks[:, 2:4])[:, 0] + 8 * d
        scale = d
    elif kind == "Q4_K":
        gguf = _gguf_package()
        blocks = data.reshape(-1, 144)
        d, dmin = f16(blocks[:, 0:2]), f16(blocks[:, 2:4])  # (blocks, 1)
        sc, m = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16])  # (blocks, 8) each
        scale, low = (d * sc.astype(np.float32)).reshape(-1), (dmin * m.astype(np.float32)).reshape(-1)
        nibbles = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        q = (nibbles & 0x0F).reshape(-1, 32)  # (sub-blocks, 32)
        zero = 8 * scale - low
    else:
        return None
    return q.reshape(rows, -1), scale.reshape(rows, -1), zero.reshape(rows, -1)


def file_int4(model, groups: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> dict[str, tuple]:
    """{module name: (q, scale, zero) tensors}: each Linear layer of ``model`` whose weight came from
    4-bit tensors of the file (``groups``: HuggingFace name -> :func:`int4_groups`), the fused
    ``qkv`` when its three projections are all 4-bit, the tied output head when the token embedding
    is. What ``--quantize int4`` keeps as the file stores it (:func:`attnlab.generate.quantize.quantize`)."""
    from .llama import key_map

    c = model.config
    pairs = [(hf, ours) for hf, ours in key_map(c.layers, c.qk_norm) if hf.endswith("_proj.weight")]
    pairs.append(("model.embed_tokens.weight" if c.tie_output else "lm_head.weight", "lm_head.weight"))
    sources = {ours[: -len(".weight")]: [hf] for hf, ours in pairs}
    for i in range(c.layers):
        sources[f"blocks.{i}.attn.qkv"] = [f"model.layers.{i}.self_attn.{p}_proj.weight" for p in "qkv"]
    return {
        name: tuple(torch.from_numpy(np.concatenate([groups[h][j] for h in hf_names])) for j in range(3))
        for name, hf_names in sources.items()
        if all(h in groups for h in hf_names)
    }


def load_gguf(path: str | Path, with_class=None, dtype=None):
    """(the attnlab model of a GGUF file, what it keeps of the file), from one read of it: the
    weights dequantised to float32, then ``dtype`` (the 4-bit ones also kept as stored, in
    ``model.gguf_int4``, for ``--quantize int4``); what is kept is what an attnlab run keeps in its
    config.json (its tokenizer, its generation settings), ``model_type`` None as for a HuggingFace
    folder. The tokenizer and the configuration are read first: a file refused is refused before
    any weight is dequantised or any model built."""
    from . import converters

    p = Path(path)
    reader = read(p)
    meta = metadata(reader)
    tokenizer = gguf_tokenizer(meta, p)
    cfg = hf_config(meta, {t.name for t in reader.tensors}, p)
    state, groups = hf_state(reader, cfg, p)
    converter = next(c for c in converters() if c.hf_type == cfg["model_type"])
    try:
        model = converter.load(cfg, state, with_class, dtype)
        model.gguf_int4 = file_int4(model, groups)  # (what --quantize int4 keeps as stored)
    except (RuntimeError, MemoryError) as e:
        raise does_not_fit(f"GGUF {cfg['model_type']}", e) from None
    except KeyError as e:
        raise CheckpointError(f"{p} is an incomplete GGUF {cfg['model_type']} file: it has no tensor for {e}") from None
    kept = {
        "model_type": None,
        "format": "gguf",
        "architecture": meta.get("general.architecture"),
        "tokenizer": tokenizer.to_dict() if tokenizer is not None else None,
        "generation": gguf_generation(meta).to_dict(),
    }
    return (model.to(dtype) if dtype is not None else model), kept
