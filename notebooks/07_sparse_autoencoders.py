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
# # Sparse autoencoders: features in a character-level GPT and a digits ViT
#
# A neuron of a trained model rarely means one thing; a *direction* of its residual stream often
# does. A sparse autoencoder (SAE) learns an overcomplete dictionary of such directions: each
# activation x is rebuilt as a sparse, non-negative mix of them, x ≈ Σ_i f_i(x) d_i + b
# (Bricken et al. 2023, "Towards Monosemanticity"; top-k SAEs: Gao et al. 2024). This notebook
# trains a GPT on Shakespeare (the embedded English text without the data folder), trains SAEs
# on its residual stream after block 1, compares the ReLU + L1 and the top-k SAE, and looks at
# what single latents respond to and what they write.
#
# Full size: the GPT's default recipe (about 1 minute on 2 CPU cores) and 2,000 SAE steps per
# SAE (about 30 s each). `ATTNLAB_QUICK=1`: 40 GPT steps and 150 SAE steps (the cells run; the
# features are not yet clean).

# %%
import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
from IPython.display import HTML, display

import attnlab
from attnlab.inspect.sae import features_page

QUICK = os.environ.get("ATTNLAB_QUICK") == "1"
work = Path(tempfile.mkdtemp(prefix="attnlab-sae-"))
shakespeare = os.environ.get("ATTNLAB_DATA") and Path(os.environ["ATTNLAB_DATA"], "tinyshakespeare").is_dir()
data = "shakespeare" if shakespeare and not QUICK else None  # None: the embedded corpus
options = dict(max_iters=40, eval_interval=20, eval_iters=1) if QUICK else {}
run = attnlab.train("gpt", data=data, out=work / "gpt", data_dir=os.environ.get("ATTNLAB_DATA"), **options)
gpt = attnlab.load(run.out)
print("trained on", data or "the embedded corpus", "| validation loss", round(run.best_val, 3))

# %% [markdown]
# ## 1. Two SAEs on the residual stream after block 1
#
# The ReLU SAE pays an L1 price for every active latent (λ sets the trade-off between sparsity
# and reconstruction); the top-k SAE keeps exactly k latents per token. Both have 8 latents per
# dimension of the stream (1,024 for a 128-wide model). The metrics: L0 (latents active per
# token), explained variance, the share of dead latents, and the next-token loss with the SAE
# spliced into the model, between the clean model and the stream zeroed.

# %%
hook = "blocks.1.hook_resid_post"
steps = 150 if QUICK else 2000
relu = attnlab.sae.train(gpt, hook, kind="relu", l1_coefficient=2.0, steps=steps, progress=False)
topk = attnlab.sae.train(gpt, hook, kind="topk", k=16, steps=steps, progress=False)
for name, sae_run in (("ReLU + L1", relu), ("top-16", topk)):
    m = sae_run.metrics
    print(
        f"{name:10s} L0 {m['l0']:6.1f} | explained variance {m['explained_variance']:.3f} | dead "
        f"{m['dead_fraction']:.1%} | loss clean {m['ce_clean']:.3f}, with SAE {m['ce_with_sae']:.3f}, "
        f"zeroed {m['ce_zero_ablated']:.3f} ({m['ce_loss_recovered']:.1%} recovered)"
    )

# %% [markdown]
# ## 2. The training curves
#
# The reconstruction error falls while the sparsity settles; for the ReLU SAE, L0 falls as the
# L1 penalty pushes latents to zero.

# %%
fig, axes = plt.subplots(1, 2, figsize=(9, 3))
for name, sae_run in (("ReLU + L1", relu), ("top-16", topk)):
    steps_logged = [r["step"] for r in sae_run.history]
    axes[0].plot(steps_logged, [r["mse_loss"] for r in sae_run.history], label=name)
    axes[1].plot(steps_logged, [r["l0"] for r in sae_run.history], label=name)
axes[0].set(xlabel="step", ylabel="squared error per token", yscale="log", title="reconstruction")
axes[1].set(xlabel="step", ylabel="latents active per token", yscale="log", title="L0")
axes[0].legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 3. What single latents respond to
#
# For a few frequent latents of the top-k SAE: the contexts where it fires most (shaded by its
# activation on each character, the peak outlined) and the characters its direction raises and
# lowers through the unembedding. In a character-level model many latents turn out to track
# the position inside a word, a vowel after a consonant, the end of a line or the start of a
# speaker's name.

# %%
pages = attnlab.sae.features(gpt, topk.sae, count=6)
display(HTML(features_page(pages, f"top-k SAE features at {hook}")))

# %% [markdown]
# ## 4. How often latents fire
#
# A healthy dictionary has few dead latents and a spread of frequencies; a latent that fires
# on almost every token is more a bias than a feature.


# %%
def frequency_histogram(model, sae, title: str, bins: int) -> None:
    """How often each live latent fires: a histogram over the dictionary."""
    frequencies = [p["frequency"] for p in attnlab.sae.features(model, sae, count=sae.config.d_sae)]
    plt.figure(figsize=(5, 3))
    plt.hist(frequencies, bins=bins, log=True)
    plt.xlabel("share of tokens it fires on")
    plt.ylabel("latents")
    plt.title(title)
    plt.show()


frequency_histogram(gpt, topk.sae, "latent frequencies (live latents)", bins=40)

# %% [markdown]
# ## 5. The same on a ViT: features of digit patches
#
# A ViT trained on the 8×8 digits, and a top-k SAE on its residual stream after the first block:
# each latent's page shows the digits where it fires most, the patch outlined, and the classes
# its direction raises through the classifier head. Expect latents for strokes at a place (a
# bar across the top of a 7, the loop of a 0 or a 6) rather than for whole digits this early.

# %%
vit_options = dict(max_iters=40, eval_interval=20, eval_iters=1) if QUICK else dict(max_iters=600, eval_interval=200)
vit_run = attnlab.train("vit", out=work / "vit", progress=False, **vit_options)
vit = attnlab.load(vit_run.out)
vit_sae = attnlab.sae.train(vit, "encoder.blocks.0.hook_resid_post", kind="topk", k=8, steps=steps, progress=False)
m = vit_sae.metrics
print(
    f"ViT, block 0: L0 {m['l0']:.1f} | explained variance {m['explained_variance']:.3f} | the classifier's loss "
    f"clean {m['ce_clean']:.3f}, with the SAE {m['ce_with_sae']:.3f}, zeroed {m['ce_zero_ablated']:.3f}"
)
page = attnlab.sae.write_features(vit, vit_sae.sae, work / "vit_features.html", count=6)
display(HTML(page.read_text()))

# %%
frequency_histogram(vit, vit_sae.sae, "ViT SAE: latent frequencies", bins=30)
