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
# # Sequence to sequence and image captioning
#
# An encoder reads the input, a decoder writes the output one token at a time. Without
# attention the decoder sees the input only through one vector (the bottleneck); with
# attention (Bahdanau et al.; the Transformer's cross-attention) it looks back at every input
# position at every step — and where it looks is an alignment. The same story for images:
# a captioner without attention gets the picture once; Show, Attend and Tell looks at a region
# per word.
#
# Tasks that need no download: reversing letter strings, and captioning generated scenes of
# coloured shapes. Full size: about 6 minutes on 2 CPU cores. `ATTNLAB_QUICK=1`: a few steps each.

# %%
import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Image, display
from PIL import Image as PILImage

import attnlab
from attnlab.data.captions import make_scenes

QUICK = os.environ.get("ATTNLAB_QUICK") == "1"
work = Path(tempfile.mkdtemp(prefix="attnlab-nb-"))
quick = dict(max_iters=30, eval_interval=15, eval_iters=1) if QUICK else {}

# %% [markdown]
# ## 1. Reverse a string: the bottleneck and attention
#
# Three encoder–decoders on the same task, strings of 4 to 24 letters: an LSTM pair without
# attention, the same with Bahdanau attention, and a Transformer. Each stops once 99 % of
# held-out strings come out exactly right (or at its step budget: 1,000 steps for the LSTMs).

# %%
models = {}
for arch in ("rnn", "rnn-attention", "transformer"):
    if QUICK:
        options = dict(quick, max_iters=20, eval_interval=20, max_length=8)
    elif arch.startswith("rnn"):  # LSTMs of 128 units: about a minute each on 2 cores
        options = dict(max_iters=1000, eval_interval=250, dim=128, emb_dim=64)
    else:  # the default Transformer for synthetic tasks, until 99 % exact: about a minute
        options = {}
    run = attnlab.train("seq2seq", data="reverse", arch=arch, out=work / arch, progress=False, **options)
    models[arch] = attnlab.load(run.out)
    res = models[arch].evaluate()
    print(f"{arch:14s} step {run.step:5d}: exact match {res['exact_match']:.3f} on held-out strings")

# %%
source = "attentionisallyouneed"
for arch, model in models.items():
    print(f"{arch:14s} {source} -> {model.translate(source)}")

# %% [markdown]
# Exact match against the input length: the model without attention must squeeze the whole
# string into its final state, and long strings overflow it.

# %%
rng = np.random.default_rng(0)
lengths = [4, 8, 12, 16, 20, 24]
per_length = 3 if QUICK else 20
for arch, model in models.items():
    exact = []
    for n in lengths:
        words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), n)) for _ in range(per_length)]
        exact.append(np.mean([model.translate(w) == w[::-1] for w in words]))
    plt.plot(lengths, exact, "o-", label=arch)
plt.xlabel("string length")
plt.ylabel(f"exact match ({per_length} strings)")
plt.legend()
plt.show()

# %% [markdown]
# ## 2. Where the decoder looks: the alignment
#
# For reversal the right alignment is the anti-diagonal: output position t reads input
# position n − 1 − t.

# %%
display(Image(filename=models["rnn-attention"].inspect("alignment", work / "rnn_alignment.png", text=source)))
display(Image(filename=models["transformer"].inspect("alignment", work / "tf_alignment.png", text=source)))

# %% [markdown]
# The explorer shows encoder self-attention, decoder self-attention and cross-attention
# together (switch with the buttons above the view):

# %%
models["transformer"].explore(src=source)

# %% [markdown]
# ## 3. Captioning: one look, or a look per word
#
# Scenes of one to three shapes with captions from a small grammar ("a small red circle to the
# left of a large blue square"). Show, Attend and Tell attends over a 10 × 10 grid of CNN
# features at every word.

# %%
cap_options = dict(quick, train_scenes=200, image_size=32, dim=64) if QUICK else {}
cap_run = attnlab.train("caption", arch="rnn-attention", out=work / "caption", progress=False, **cap_options)
captioner = attnlab.load(cap_run.out)
res = captioner.evaluate(batch_size=128)
print(f"BLEU-4 {res['bleu'][3]:.1f}, exact captions {res['exact']:.3f}, pointing game {res['pointing']}")

scene = make_scenes(1, seed=2024, image_size=captioner.config.image_size)
png = work / "scene.png"
PILImage.fromarray((scene.images[0].permute(1, 2, 0).numpy() * 255).astype(np.uint8)).save(png)
print("reference:", scene.captions[0][0])
print("generated:", captioner.caption(png))

# %% [markdown]
# The attention of each word over the image (the lecture's Show, Attend and Tell figure), then
# the pixels whose change would most change each word (integrated gradients):

# %%
display(Image(filename=captioner.inspect("caption", work / "words.png", image=png)))
method = "gradient_x_input" if QUICK else "integrated_gradients"  # (IG runs the LSTM once per path step)
display(Image(filename=captioner.inspect("attribution", work / "attribution.png", image=png, method=method)))
