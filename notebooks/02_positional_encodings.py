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
# # Positional encodings
#
# Attention is a weighted average over a *set*: permute the tokens and every output permutes
# with them. Order has to be written in. This notebook draws every encoding attnlab has —
# sinusoidal, learned, 2-D sin-cos, Fourier features, relative (Shaw et al.), rotary (RoPE),
# ALiBi, PEG — checks the property each is built for, and ends with what happens when a model
# reads inputs longer than it was trained on.
#
# `ATTNLAB_QUICK=1` trains the small models of the last section for 30 steps instead of 400.

# %%
import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

from attnlab.attention import MultiHeadAttention
from attnlab.data.text import prepare
from attnlab.models import GPT, GPTConfig
from attnlab.position import (
    PEG,
    ALiBi,
    FourierFeatures,
    LearnedPosition,
    RelativePosition,
    RotaryEmbedding,
    alibi_slopes,
    sincos_2d_encoding,
    sinusoidal_encoding,
)
from attnlab.training import LanguageModelTask, TrainConfig, Trainer

QUICK = os.environ.get("ATTNLAB_QUICK") == "1"
torch.manual_seed(0)

# %% [markdown]
# ## 1. Self-attention alone does not know the order
#
# Shuffle the tokens: the outputs are the same vectors, shuffled the same way.

# %%
mha = MultiHeadAttention(d_model=16, n_heads=4).eval()
x = torch.randn(1, 7, 16)
perm = torch.randperm(7)
with torch.no_grad():
    assert torch.allclose(mha(x)[:, perm], mha(x[:, perm]), atol=1e-6)
print("attention(shuffled tokens) == shuffled attention(tokens): permutation-equivariant")

# %% [markdown]
# ## 2. Sinusoidal encoding (Attention is all you need)
#
# $PE(pos, 2i) = \sin(pos / 10000^{2i/d})$, $PE(pos, 2i+1) = \cos(pos / 10000^{2i/d})$: every
# pair of dimensions is a clock of its own frequency. The lecture's picture, 50 positions × 128
# dimensions:

# %%
pe = sinusoidal_encoding(50, 128)
plt.figure(figsize=(9, 3.5))
plt.imshow(pe.numpy(), cmap="RdBu", aspect="auto")
plt.xlabel("dimension")
plt.ylabel("position")
plt.colorbar()
plt.title("sinusoidal encoding, 50 positions × 128 dimensions")
plt.show()

# %% [markdown]
# The dot product of two encodings depends only on their distance (a sum of cosines of the
# offset), so "how far apart" is something attention can read:

# %%
pe = sinusoidal_encoding(200, 128)
sim = pe @ pe.T
for a in (20, 100):
    plt.plot(np.arange(200) - a, sim[a].numpy(), label=f"PE({a}) · PE(p)")
plt.xlabel("offset p − a")
plt.ylabel("dot product")
plt.legend()
plt.show()
assert torch.allclose(sim[20, 25], sim[100, 105], atol=1e-3)  # same offset, same similarity

# %% [markdown]
# ## 3. Learned positions, 2-D sin-cos for images, Fourier features
#
# A learned table has one vector per position it was trained on — and nothing beyond.
# Images use two coordinates: half the dimensions encode the row, half the column.
# Fourier features $\gamma(v) = [\cos 2\pi Bv, \sin 2\pi Bv]$ encode any real coordinates
# (here a random B of 16 frequencies for 2-D points).

# %%
learned = LearnedPosition(dim=16, max_len=32)
print("learned table:", tuple(learned.weight.shape), "(positions, d_model): position 32 does not exist")
grid = sincos_2d_encoding(8, 8, 64)  # (64 patches, 64 dims)
sim2d = F.cosine_similarity(grid[:, None], grid[None], dim=-1)
fourier = FourierFeatures(in_dim=2, n_features=16, sigma=3.0)
coords = torch.stack(torch.meshgrid(torch.linspace(0, 1, 8), torch.linspace(0, 1, 8), indexing="ij"), -1).reshape(64, 2)
with torch.no_grad():
    ff = fourier(coords)
sim_ff = F.cosine_similarity(ff[:, None], ff[None], dim=-1)
fig, axes = plt.subplots(1, 2, figsize=(8, 3.5))
for ax, s, name in ((axes[0], sim2d, "2-D sin-cos"), (axes[1], sim_ff, "Fourier features")):
    ax.imshow(s[27].reshape(8, 8).numpy(), cmap="viridis")
    ax.set_title(f"{name}: similarity of patch (3, 3) to every patch", fontsize=9)
    ax.axis("off")
plt.show()

# %% [markdown]
# ## 4. Relative positions (Shaw et al.), RoPE and ALiBi: distance, not place
#
# **Relative positions** add a learned term per clipped distance j − i to the scores.
# **RoPE** rotates q and k by angles proportional to their positions, so q·k depends on the
# offset only. **ALiBi** adds −slope·|i − j| per head: a fixed, linear recency bias with
# slopes $2^{-8h/H}$.

# %%
rel = RelativePosition(head_dim=8, max_distance=4)
print("Shaw et al. clipped distances (query rows, key columns):\n", rel.distances(6, 6))

rope = RotaryEmbedding(head_dim=8)
q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)


def rotated_dot(i: int, j: int) -> float:
    qi = rope(q, torch.tensor([i]))
    kj = rope(k, torch.tensor([j]))
    return float((qi * kj).sum())


print(f"RoPE: q·k at positions (3, 1) = {rotated_dot(3, 1):.5f}, at (40, 38) = {rotated_dot(40, 38):.5f}")
assert abs(rotated_dot(3, 1) - rotated_dot(40, 38)) < 1e-4

alibi = ALiBi(n_heads=8)
bias = alibi(torch.zeros(1, 8, 10, 4), 10)  # (heads, queries, keys)
print("ALiBi slopes:", [round(s, 4) for s in alibi_slopes(8).tolist()])
fig, axes = plt.subplots(1, 4, figsize=(10, 2.6))
for h, ax in zip((0, 2, 4, 7), axes):
    ax.imshow(bias[h].numpy(), cmap="magma")
    ax.set_title(f"ALiBi head {h}", fontsize=9)
    ax.axis("off")
plt.show()

# %% [markdown]
# **PEG** (conditional positional encoding) computes positions from the content: a depth-wise
# convolution over the patch grid, added to the tokens. Shifting the image shifts the encoding.

# %%
peg = PEG(dim=16)
tokens = torch.randn(1, 16, 16)  # a 4 × 4 grid of patch tokens
with torch.no_grad():
    out = peg(tokens, grid=(4, 4))
print("PEG keeps the shape:", tuple(out.shape))

# %% [markdown]
# ## 5. Longer than trained: which encodings survive?
#
# Four small GPTs, identical except for their positions, trained on 64-token windows of the
# embedded corpus (English text shipped with Python), then asked to predict text in windows of
# 64 to 256 tokens. A learned table cannot even read position 64. The loss is measured on the
# last 64 tokens of each window. (`attnlab reproduce length` runs the full-size version.)

# %%
steps = 30 if QUICK else 400
work = Path(tempfile.mkdtemp(prefix="attnlab-nb-"))
data = prepare(None, work / "corpus")  # the embedded corpus, character-level
lengths = [64, 128, 256]


def loss_at(model, length: int, windows: int = 8) -> float:
    ids = np.asarray(data.val[: windows * length + 1], dtype=np.int64)
    n = (len(ids) - 1) // length
    x = torch.from_numpy(ids[: n * length].reshape(n, length))
    y = torch.from_numpy(ids[1 : n * length + 1].reshape(n, length))
    with torch.no_grad():
        logits = model(x)
    return F.cross_entropy(logits[:, -64:].flatten(0, 1), y[:, -64:].flatten()).item()


results = {}
for pos in ("learned", "sinusoidal", "rope", "alibi"):
    torch.manual_seed(0)
    context = 64 if pos == "learned" else max(lengths)
    config = GPTConfig(vocab_size=data.tokenizer.vocab_size, context=context, layers=2, heads=4, dim=64, pos=pos)
    model = GPT(config)
    cfg = TrainConfig(
        max_iters=steps,
        batch_size=16,
        lr=3e-3,
        warmup_iters=min(50, steps // 5),
        eval_interval=steps,
        eval_iters=2,
        progress=False,
        device="cpu",
        dtype="fp32",
        compile=False,
    )
    Trainer(model, LanguageModelTask(data, 64, 16), cfg, work / pos).fit()
    model.eval()
    results[pos] = [loss_at(model, n) if n <= context else None for n in lengths]
    print(pos, ["n/a" if v is None else round(v, 3) for v in results[pos]])

for pos, ys in results.items():
    xs = [n for n, y in zip(lengths, ys) if y is not None]
    plt.plot(xs, [y for y in ys if y is not None], "o-", label=pos)
plt.xscale("log", base=2)
plt.xlabel("window length (trained on 64)")
plt.ylabel("loss on the last 64 tokens")
plt.legend()
plt.show()
