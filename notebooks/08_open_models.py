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
# # Looking inside an open model: Llama-shaped, with every hook point
#
# attnlab reads the decoder-only models people study today (Llama, Qwen, Mistral, Phi-3, Gemma,
# Pythia) into its own GPT: RMSNorm, a gated MLP, grouped-query attention and rotary positions are
# options of the same model file (docs/open-models.md). This notebook loads SmolLM2-135M by name
# and walks the kit on it: the hook points, induction-head scores, the logit lens, activation
# patching and a sparse-autoencoder feature.
#
# The model comes from the HuggingFace hub cache and is never downloaded here. When the cache
# lacks it, a model of the same shape with random weights stands in, and the figures then show the
# methods, not findings. `ATTNLAB_QUICK=1` keeps 4 of its 30 layers.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
import torch

import attnlab
from attnlab.inspect.detectors import head_scores, repeated_random_tokens
from attnlab.inspect.lens import logit_lens
from attnlab.inspect.patching import logit_difference, patch_activations
from attnlab.inspect.sae import SAEConfig, SAETraining
from attnlab.inspect.sae import train as train_sae
from attnlab.models import GPT, GPTConfig

QUICK = os.environ.get("ATTNLAB_QUICK") == "1"
NAME = "HuggingFaceTB/SmolLM2-135M"


def in_hub_cache(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return isinstance(try_to_load_from_cache(name, "config.json"), str)


if in_hub_cache(NAME) and not QUICK:
    model = attnlab.load(NAME)
    print(f"{NAME} from the hub cache")
else:
    # SmolLM2-135M's shape: 30 layers, 576 wide, 9 query heads on 3 key/value heads, SwiGLU of 1,536
    shape = dict(vocab_size=49152, context=2048, layers=4 if QUICK else 30, heads=9, kv_heads=3, dim=576,
                 mlp_hidden=1536, norm="rms", norm_eps=1e-5, gated_mlp=True, activation="silu", pos="rope",
                 rope_base=100000.0, bias=False, tie_output=True)  # fmt: skip
    torch.manual_seed(0)
    model = GPT(GPTConfig(**shape)).eval()
    print(f"{NAME} is not in the hub cache: random weights of its shape ({model.config.layers} layers)")
c = model.config
print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters; norm={c.norm}, gated MLP={c.gated_mlp}, "
      f"{c.heads} query heads on {c.kv_heads} key/value heads, rotary base {c.rope_base:g}")  # fmt: skip

# %% [markdown]
# ## 1. The hook points of one block
#
# The names are TransformerLens's: the residual stream before and after each sublayer, each head's
# queries, keys, values, scores, pattern and output, RMSNorm's scale, and the gated MLP's gate
# (`hook_pre`), up projection (`hook_pre_linear`) and their product (`hook_post`).

# %%
print([name for name in model.hook_points() if name.startswith("blocks.0.")])

# %% [markdown]
# ## 2. Induction heads
#
# On a random sequence written twice, an induction head attends from each token of the second copy
# to the token after its first occurrence. `head_scores` measures how much of each head's attention
# goes where previous-token, duplicate-token and induction heads would put it.

# %%
gen = torch.Generator().manual_seed(1)
repeated = repeated_random_tokens(4, 24, c.vocab_size, gen)  # (4, 48): 24 tokens, then the same 24
scores = head_scores(model, repeated)
fig, ax = plt.subplots(figsize=(6, 0.25 * c.layers + 1.5))
im = ax.imshow(scores["induction"], cmap="viridis", vmin=0, aspect="auto")
ax.set(xlabel="head", ylabel="layer", title="induction score")
fig.colorbar(im)
plt.show()

# %% [markdown]
# ## 3. The logit lens
#
# The residual stream after each block, put through the final RMSNorm and the unembedding, gives
# what the model would predict if it stopped there. On the repeated sequence the second copy is
# predictable, and a trained model's probability of the right token rises with depth.

# %%
lens = logit_lens(model, repeated[:1])  # (layers + 1, 1, tokens, vocab): one sequence keeps it small
targets = repeated[:1, 25:]  # the second copy's tokens from its second one on
probs = lens[:, :, 24:-1].softmax(-1).gather(-1, targets.expand(lens.shape[0], -1, -1)[..., None])[..., 0]
plt.plot(probs.mean(dim=(1, 2)).numpy(), marker="o")
plt.xlabel("layer (0: the embeddings)")
plt.ylabel("p(the repeated token)")
plt.title("logit lens on the second copy")
plt.show()

# %% [markdown]
# ## 4. Activation patching
#
# Two inputs differ in one token. Copying the clean run's residual stream into the corrupted run,
# one layer and position at a time, shows where the information about that token travels: a
# value of 1 restores the clean logit difference entirely, and 0 changes nothing.

# %%
clean = repeated[:1, :16]
corrupt = clean.clone()
corrupt[0, 5] = (corrupt[0, 5] + 1) % c.vocab_size
with torch.no_grad():
    last = model(clean)[0, -1]
metric = logit_difference(int(last.argmax()), int(last.argmin()))
restored = patch_activations(model, (clean,), (corrupt,), metric)  # (layers, positions)
plt.imshow(restored.numpy(), cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
plt.xlabel("position (token 5 differs)")
plt.ylabel("layer")
plt.title("share of the logit difference restored")
plt.colorbar()
plt.show()

# %% [markdown]
# ## 5. A sparse-autoencoder feature
#
# A top-k sparse autoencoder writes the residual stream after block 1 as a sparse mix of learned
# directions. It is trained here on the activations of random token sequences: a real corpus
# would go in their place.

# %%
corpus = torch.randint(c.vocab_size, (20_000,), generator=gen).numpy()
model.config.context = 64  # (the SAE reads windows of the model's context: short ones here)
sae, history = train_sae(
    model,
    "blocks.1.hook_resid_post",
    corpus,
    config=SAEConfig(d_sae=4 * c.dim, kind="topk", k=16),
    training=SAETraining(steps=20 if QUICK else 300, batch_tokens=512, lr=1e-3, warmup=10),
)
print(f"final reconstruction loss {history[-1]['mse_loss']:.3f}, L0 {history[-1]['l0']:.1f}")
with model.caching("blocks.1.hook_resid_post") as cache:
    model(repeated, stop_at_layer=2)
latents = sae.encode(cache["blocks.1.hook_resid_post"].reshape(-1, c.dim))
frequency = (latents > 0).float().mean(0)
plt.hist(np.log10(frequency.numpy() + 1e-6), bins=40)
plt.xlabel("log10 firing frequency")
plt.ylabel("latents")
plt.title("SAE latents on the repeated sequences")
plt.show()
top = int(frequency.argmax())
print(f"latent {top} fires on {100 * float(frequency[top]):.0f} % of the tokens")
