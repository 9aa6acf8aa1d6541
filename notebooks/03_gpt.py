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
# # A GPT: next-token prediction, sampling, and a look inside
#
# A decoder-only Transformer trained to predict the next character of a text. With no data
# folder it trains on English text that ships with Python; set `DATA = "shakespeare"` (and
# `ATTNLAB_DATA` to a folder holding Tiny Shakespeare) for the classic corpus.
#
# Full size: the default recipe, about 2 minutes on 2 CPU cores. `ATTNLAB_QUICK=1`: 30 steps.

# %%
import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from IPython.display import Image, display

import attnlab

QUICK = os.environ.get("ATTNLAB_QUICK") == "1"
DATA = None  # the embedded corpus; "shakespeare" with ATTNLAB_DATA set
out = Path(tempfile.mkdtemp(prefix="attnlab-nb-")) / "gpt"

# %% [markdown]
# ## 1. Train
#
# `attnlab.train` is `attnlab train gpt` from Python: same options (`max_iters` is
# `--max-iters`), same run folder (`best/`, `last/`, `metrics.jsonl`, `loss.png`).

# %%
options = dict(max_iters=30, eval_interval=15, eval_iters=2) if QUICK else {}
run = attnlab.train("gpt", data=DATA, out=out, progress=False, **options)
print(f"step {run.step}, best validation loss {run.best_val:.3f}")
steps = [r["step"] for r in run.metrics if "loss" in r]
plt.plot(steps, [r["loss"] for r in run.metrics if "loss" in r], lw=0.8, label="train (batch)")
evals = [r for r in run.metrics if "val_loss" in r]
plt.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "s-", label="validation")
plt.xlabel("step")
plt.ylabel("cross-entropy (nats)")
plt.legend()
plt.show()

# %% [markdown]
# ## 2. Sample
#
# $x_{t+1} \sim \mathrm{softmax}(f(x_{1..t}) / \tau)$, with the KV cache so each new token
# costs one token's forward pass. Temperature 0 is greedy; a seed makes sampling repeatable.

# %%
gpt = attnlab.load(out)
for temperature in (0.0, 0.8):
    print(f"--- temperature {temperature}")
    print(gpt.generate("The ", 120, temperature=temperature, seed=1))
print(gpt.evaluate())  # loss, perplexity and bits per character on the validation split

# %% [markdown]
# ## 3. The attention of every head
#
# The explorer renders inline: hover a token to see where it attends, click a thumbnail to
# pick a head; the logit lens and the neuron view (q, k and q·k of one attention row) sit
# beside it. `.save("page.html")` writes the same page as one offline file.

# %%
text = "The attention of the model"
gpt.explore(text=text)

# %% [markdown]
# ## 4. The logit lens
#
# Read every layer's residual stream through the final norm and the unembedding: what would
# the model predict if it stopped there?

# %%
display(Image(filename=gpt.inspect("lens", out.parent / "lens.png", text=text)))
table = gpt.logit_lens(text, top_k=1)
for layer, guesses in zip(table["layers"], table["top_tokens"]):
    print(f"{layer:8s}", "".join(g[0] if g[0] != "\n" else "⏎" for g in guesses))

# %% [markdown]
# ## 5. Which heads do what
#
# Head detectors score each head against a known pattern (previous token, duplicate token,
# induction) on random tokens repeated twice; direct logit attribution splits one logit into
# what each head and MLP wrote.

# %%
display(Image(filename=gpt.inspect("heads", out.parent / "heads.png")))
display(Image(filename=gpt.inspect("logit-attribution", out.parent / "dla.png", text=text, answer=" ")))
ids = gpt.token_ids(text, "text")
logits, cache = gpt.run_with_cache(ids)
print("cached hook points:", len(cache), "| e.g.", [n for n in cache if n.startswith("blocks.0.")][:6])
print("the model's top next character:", repr(gpt.tokenizer.decode([int(torch.argmax(logits[0, -1]))])))
