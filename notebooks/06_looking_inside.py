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
# # Looking inside: the cache, ablation, patching and an induction circuit
#
# Every attnlab model passes its intermediate values through named hook points (the idea of
# TransformerLens): one mechanism reads them (the activation cache), replaces them (ablation)
# and copies them from another run (activation patching). This notebook trains the smallest
# model with a known circuit — a 2-layer attention-only GPT on random sequences that repeat,
# which forms induction heads (Olsson et al. 2022) — and finds the circuit three ways: head
# detectors, ablation and patching.
#
# Full size: 1,000 steps, about 20 s on 2 CPU cores. `ATTNLAB_QUICK=1`: 60 steps (too few for
# the circuit to form: the cells run, the heads stay unspecialised).

# %%
import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from IPython.display import Image, display

from attnlab.hooks import zero_heads
from attnlab.inspect.detectors import head_scores, repeated_random_tokens
from attnlab.inspect.patching import ablated, logit_difference, patch_activations, patching_figure
from attnlab.models import GPT, GPTConfig
from attnlab.training import TrainConfig, Trainer
from attnlab.training.tasks import RepeatedSequenceTask

QUICK = os.environ.get("ATTNLAB_QUICK") == "1"
work = Path(tempfile.mkdtemp(prefix="attnlab-nb-"))
vocab, length, half = 64, 40, 20

# %% [markdown]
# ## 1. Train a 2-layer attention-only GPT on repeated random sequences

# %%
torch.manual_seed(0)
model = GPT(GPTConfig(vocab_size=vocab, context=length, layers=2, heads=4, dim=64, pos="rope", mlp=False))
steps = 60 if QUICK else 1000
cfg = TrainConfig(
    max_iters=steps,
    batch_size=64,
    lr=1e-3,
    min_lr=1e-3,
    warmup_iters=0,
    weight_decay=0.0,
    beta2=0.999,
    grad_clip=0.0,
    eval_interval=steps,
    eval_iters=2,
    progress=False,
    device="cpu",
    dtype="fp32",
    compile=False,
)
Trainer(model, RepeatedSequenceTask(vocab, length, 64), cfg, work / "induction").fit()
model.eval()

x = repeated_random_tokens(32, half, vocab, torch.Generator().manual_seed(1234))  # a segment, then again
with torch.no_grad():
    per_position = F.cross_entropy(model(x[:, :-1]).transpose(1, 2), x[:, 1:], reduction="none").mean(0)
plt.plot(range(1, len(per_position) + 1), per_position)
plt.axvline(half - 0.5, color="grey", lw=0.8)
plt.xlabel("position")
plt.ylabel("loss (nats)")
plt.title("the second copy is predictable only by looking back")
plt.show()

# %% [markdown]
# ## 2. The activation cache
#
# `run_with_cache` returns the output and every hook point's value (or those matching a glob).

# %%
logits, cache = model.run_with_cache(x[:1])
print(len(cache), "hook points, e.g.:")
for name in list(cache)[:8]:
    print(f"  {name:32s} {tuple(cache[name].shape)}")
pattern = cache["blocks.1.attn.hook_pattern"][0]  # (heads, queries, keys)
fig, axes = plt.subplots(1, 4, figsize=(12, 3))
for h, ax in enumerate(axes):
    ax.imshow(pattern[h], cmap="viridis")
    ax.set_title(f"layer 1, head {h}", fontsize=9)
    ax.axis("off")
plt.show()

# %% [markdown]
# ## 3. Head detectors
#
# The share of each head's attention that follows a pattern (TransformerLens's definitions):
# the previous token, an earlier copy of the current token, or the token *after* an earlier
# copy (induction). A perfect induction head scores 0.5 here: only the second half has an
# earlier copy to look at.

# %%
scores = head_scores(model, x)
fig, axes = plt.subplots(1, 3, figsize=(12, 2.6))
for ax, (kind, s) in zip(axes, scores.items()):
    im = ax.imshow(s, cmap="viridis", vmin=0, vmax=max(0.5, float(s.max())))
    ax.set_title(kind.replace("_", "-"), fontsize=9)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    fig.colorbar(im, ax=ax)
plt.show()
induction_head = divmod(int(scores["induction"].flatten().argmax()), 4)
print("strongest induction head (layer, head):", induction_head)

# %% [markdown]
# ## 4. Ablation: silence a head, watch the loss on the second copy


# %%
def repeat_loss(m) -> float:
    with torch.no_grad():
        out = m(x[:, :-1])
    return F.cross_entropy(out[:, half - 1 :].transpose(1, 2), x[:, half:]).item()


print(f"nothing ablated:           {repeat_loss(model):.3f}")
for layer in range(2):
    for head in range(4):
        with ablated(model, [(layer, head)]):
            print(f"head {layer}.{head} zero-ablated: {repeat_loss(model):.3f}")
with model.hooks([(f"blocks.{induction_head[0]}.attn.hook_z", zero_heads(induction_head[1]))]):
    print("the same with a raw hook function:", round(repeat_loss(model), 3))

# %% [markdown]
# ## 5. Activation patching
#
# Run a corrupted input (the first copy replaced, so nothing can be copied), and put back one
# head's output from the clean run at a time: how much of the clean logit difference does
# each head restore?

# %%
g = torch.Generator().manual_seed(7)
first = torch.randint(vocab, (1, 12), generator=g)
clean = torch.cat([first, first], 1)[:, :-1]  # its next token is first[-1]
corrupt = torch.cat([torch.randint(vocab, (1, 12), generator=g), first], 1)[:, :-1]
answer = int(first[0, -1])
with torch.no_grad():
    wrong = int(model(corrupt)[0, -1].argmax())
wrong = wrong if wrong != answer else (answer + 1) % vocab
restored = patch_activations(model, (clean,), (corrupt,), logit_difference(answer, wrong), over="head")
display(Image(filename=patching_figure(restored, work / "patching.png", over="head")))

# %% [markdown]
# ## 6. Path patching: which head feeds the induction head's keys
#
# Activation patching says *which* heads matter; path patching (Wang et al. 2022) says *through
# which path*. Here each layer-0 head's clean output is delivered only to the induction head's
# **keys**, everything else frozen at the corrupted run: the previous-token head that the
# induction head K-composes with should restore the most (Olsson et al.'s circuit: layer 0
# writes "the token before me was A" into each position, and the layer-1 head's keys read it).

# %%
from attnlab.inspect.patching import path_patching

layer, head = induction_head
through_keys = path_patching(
    model, (clean,), (corrupt,), logit_difference(answer, wrong), receivers=[(layer, head, "k")]
)
through_queries = path_patching(
    model, (clean,), (corrupt,), logit_difference(answer, wrong), receivers=[(layer, head, "q")]
)
fig, ax = plt.subplots(figsize=(6, 2.4))
width = 0.4
heads = torch.arange(through_keys.shape[1])
ax.bar(heads - width / 2, through_keys[0], width, label=f"into L{layer}H{head}'s keys")
ax.bar(heads + width / 2, through_queries[0], width, label=f"into L{layer}H{head}'s queries")
ax.set(xlabel="layer-0 head", ylabel="restored", title="path patching from each layer-0 head")
ax.legend()
plt.show()
previous_token = int(scores["previous_token"][0].argmax())
print(
    f"previous-token head by the detector: L0H{previous_token}; "
    f"largest path into the keys: L0H{int(through_keys[0].abs().argmax())}"
)
