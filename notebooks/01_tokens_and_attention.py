# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Tokens and attention
#
# A transformer reads a sequence of vectors. This notebook builds that sequence (characters,
# byte-level BPE, WordPiece, image patches), then walks through scaled dot-product attention
# as the lectures write it — scores, softmax, weighted sum — and checks every step against
# `attnlab.attention`, the code every attnlab model uses. Then masks (causal, padding, a local
# window), why the scores are divided by √d_k, and multi-head attention.
#
# Runs in seconds on a laptop CPU; `ATTNLAB_QUICK=1` changes nothing here (nothing is trained).

# %%
import math

import matplotlib.pyplot as plt
import torch

from attnlab.attention import MultiHeadAttention, attention_scores, causal_mask, scaled_dot_product_attention
from attnlab.tokens import BPETokenizer, CharTokenizer, PatchEmbed, WordPieceTokenizer

torch.manual_seed(0)

# %% [markdown]
# ## 1. A token is an id, then a vector
#
# Three ways to cut text into tokens. Characters need no training; BPE learns merges of bytes
# (GPT-2's scheme); WordPiece learns sub-words marked with `##` (BERT's).

# %%
text = "the cat sat on the mat. the dog sat on the log. " * 20
char = CharTokenizer.from_corpus(text)
bpe = BPETokenizer.train(text, vocab_size=300)
wordpiece = WordPieceTokenizer.train([text], vocab_size=60, min_frequency=1)
sentence = "the cat sat on the log."
for name, tok in (("characters", char), ("byte-level BPE", bpe), ("WordPiece", wordpiece)):
    ids = tok.encode(sentence)
    print(f"{name:15s} {len(ids):3d} tokens: {ids[:12]}{' ...' if len(ids) > 12 else ''}")
print("WordPiece pieces:", wordpiece.tokens(sentence))

# %% [markdown]
# An embedding table turns each id into a vector of `d_model` numbers: a sequence of T tokens
# becomes a (T, d_model) matrix. An image becomes a sequence too: cut it into P×P patches,
# flatten each, project all with one shared matrix E (a strided convolution does exactly that).

# %%
embedding = torch.nn.Embedding(char.vocab_size, 16)
x_text = embedding(torch.tensor(char.encode(sentence)))
print("text:", tuple(x_text.shape), "(tokens, d_model)")

patches = PatchEmbed(patch_size=4, in_chans=1, dim=16)
image = torch.rand(1, 1, 16, 16)
print("image -> flattened patches:", tuple(patches.flatten_patches(image).shape), "(batch, patches, P·P·C)")
print("image -> patch tokens:     ", tuple(patches(image).shape), "(batch, patches, d_model)")

# %% [markdown]
# ## 2. Scaled dot-product attention, by hand
#
# $$S = \frac{QK^\top}{\sqrt{d_k}}, \qquad P = \mathrm{softmax}(S) \text{ row by row}, \qquad Z = PV$$
#
# A worked example with 4 tokens and d_k = 3: every number below is printed so it can be
# checked with a pencil.

# %%
Q = torch.tensor([[1.0, 0.0, 1.0], [0.0, 2.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
K = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
V = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])
S = Q @ K.T / math.sqrt(3)  # step 1: scores
P = S.softmax(dim=-1)  # step 2: each row sums to 1
Z = P @ V  # step 3: a weighted average of the values
print("scores S:\n", S.round(decimals=3))
print("weights P (rows sum to 1):\n", P.round(decimals=3), P.sum(-1))
print("output Z:\n", Z.round(decimals=3))

# %% [markdown]
# The same numbers from attnlab: `attention_scores` is step 1, and
# `scaled_dot_product_attention` (the fused kernel, or the readable reference path when the
# weights are asked for) is all three.

# %%
z_ref, p_ref = scaled_dot_product_attention(Q, K, V, return_weights=True)
z_fused = scaled_dot_product_attention(Q, K, V)
assert torch.allclose(attention_scores(Q, K), S) and torch.allclose(p_ref, P)
assert torch.allclose(z_ref, Z, atol=1e-6) and torch.allclose(z_fused, Z, atol=1e-6)
print("by hand == reference path == fused path")

# %% [markdown]
# ## 3. Masks: who may attend to whom
#
# A boolean mask is **True where a query may attend**. Masked scores become −∞ before the
# softmax, so their weights are exactly 0. Three masks from the lectures: causal (a decoder
# must not see the future), padding (nobody attends to the pad tokens of a short sequence in a
# batch), and a local window of ±1 (restricted attention).

# %%
T = 6
i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
masks = {
    "causal": causal_mask(T),
    "padding (last 2 are pad)": (j < 4).expand(T, T),
    "local window ±1": (i - j).abs() <= 1,
}
q, k, v = torch.randn(3, T, 8).unbind(0)
fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
for ax, (name, mask) in zip(axes, masks.items()):
    _, w = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    assert torch.all(w[~mask] == 0)  # masked keys get exactly zero weight
    ax.imshow(w, cmap="viridis")
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4. Why divide by √d_k?
#
# If q and k have independent unit-variance entries, q·k has variance d_k. Without the scale,
# scores grow with the width, the softmax saturates to one key, and its gradient vanishes.
# Entropy of the weights with and without the scale, as d_k grows:

# %%
widths = [4, 16, 64, 256, 1024]
entropy = {"QKᵀ/√d_k": [], "QKᵀ (unscaled)": []}
for d in widths:
    q, k = torch.randn(64, d), torch.randn(64, d)
    for name, scale in (("QKᵀ/√d_k", 1 / math.sqrt(d)), ("QKᵀ (unscaled)", 1.0)):
        w = attention_scores(q, k, scale=scale).softmax(-1)
        entropy[name].append(float(-(w * w.clamp_min(1e-12).log()).sum(-1).mean()))
for name, ys in entropy.items():
    plt.plot(widths, ys, marker="o", label=name)
plt.axhline(math.log(64), color="grey", lw=0.8, ls="--", label="uniform over 64 keys")
plt.xscale("log")
plt.xlabel("d_k")
plt.ylabel("entropy of the attention weights (nats)")
plt.legend()
plt.show()

# %% [markdown]
# ## 5. Multi-head attention
#
# H heads each attend with their own projections of width d_model/H, and W_O mixes the
# concatenated heads: $\mathrm{MultiHead}(X) = \mathrm{concat}(\mathrm{head}_1, \dots,
# \mathrm{head}_H) W_O$. attnlab's `MultiHeadAttention` passes every intermediate through a
# hook point (an identity that functions can be attached to), so the per-head weights can be
# read without changing the module.

# %%
mha = MultiHeadAttention(d_model=16, n_heads=4).eval()
x = torch.randn(1, T, 16)
seen = {}
detach = mha.hook_pattern.add(lambda value, hook: seen.update(pattern=value.detach()))  # read, change nothing
out = mha(x)
detach()
pattern = seen["pattern"]  # (batch, heads, queries, keys)
print("output", tuple(out.shape), "| per-head weights", tuple(pattern.shape))
fig, axes = plt.subplots(1, 4, figsize=(10, 2.6))
for h, ax in enumerate(axes):
    ax.imshow(pattern[0, h], cmap="viridis", vmin=0)
    ax.set_title(f"head {h}", fontsize=9)
    ax.axis("off")
plt.show()

# %% [markdown]
# By hand: split the fused projection into Q, K and V per head, attend, concatenate, project.

# %%
d_model, n_heads = 16, 4
d_head = d_model // n_heads
qkv = mha.qkv(x)  # (1, T, 3·d_model): Q, K and V of every head in one matrix product
q, k, v = (t.view(1, T, n_heads, d_head).transpose(1, 2) for t in qkv.split(d_model, dim=-1))
heads = (q @ k.transpose(-1, -2) / math.sqrt(d_head)).softmax(-1) @ v  # (1, H, T, d_head)
by_hand = mha.out_proj(heads.transpose(1, 2).reshape(1, T, d_model))
assert torch.allclose(by_hand, out, atol=1e-6)
print("multi-head attention by hand == MultiHeadAttention")
