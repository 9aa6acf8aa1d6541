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
# # A Vision Transformer against a CNN
#
# An image becomes a sequence of patch tokens; a ViT is then a Transformer encoder with a
# class token and a classification head. This notebook trains a ViT and a CNN baseline on the
# embedded 8×8 digits (scikit-learn's, no download), compares them, and looks inside the ViT
# with the lectures' tools: attention maps, attention rollout, mean attention distance, the
# similarity of the learned position embeddings, the principal components of the patch
# filters, and CKA between the layers of both models.
#
# Full size: about 2 minutes on 2 CPU cores (`mnist` with `ATTNLAB_DATA` set: longer).
# `ATTNLAB_QUICK=1`: 40 steps each.

# %%
import os
import tempfile
from pathlib import Path

import numpy as np
from IPython.display import Image, display
from PIL import Image as PILImage

import attnlab
from attnlab.data.images import load_images

QUICK = os.environ.get("ATTNLAB_QUICK") == "1"
DATA = "digits"
work = Path(tempfile.mkdtemp(prefix="attnlab-nb-"))
options = dict(max_iters=40, eval_interval=20, eval_iters=1) if QUICK else {}

# %% [markdown]
# ## 1. Train both

# %%
vit_run = attnlab.train("vit", data=DATA, out=work / "vit", progress=False, **options)
cnn_run = attnlab.train("cnn", data=DATA, out=work / "cnn", progress=False, **options)
vit, cnn = attnlab.load(vit_run.out), attnlab.load(cnn_run.out)
for name, model in (("ViT", vit), ("CNN", cnn)):
    n = sum(p.numel() for p in model.parameters())
    print(f"{name}: {n / 1e3:.1f}k parameters, test accuracy {model.evaluate()['accuracy']:.4f}")

# %% [markdown]
# ## 2. An image as a sequence of patches, and where the class token looks

# %%
images, labels = load_images(DATA).test
digit = work / "digit.png"
PILImage.fromarray((images[0, 0].numpy() * 255).astype(np.uint8)).save(digit)
print("true label:", int(labels[0]), "| ViT says:", vit.predict(digit, top_k=3))
display(Image(filename=vit.inspect("attention", work / "attention.png", image=digit)))
display(Image(filename=vit.inspect("rollout", work / "rollout.png", image=digit)))

# %% [markdown]
# ## 3. What the ViT learned about space
#
# Mean attention distance per head against depth (early heads local, later heads global, in
# large ViTs); the cosine similarity of each position embedding to all others (a learned 2-D
# structure); the principal components of the patch-embedding filters (like a CNN's first layer).

# %%
display(Image(filename=vit.inspect("distance", work / "distance.png", n_images=64)))
display(Image(filename=vit.inspect("positions", work / "positions.png")))
display(Image(filename=vit.inspect("embeddings", work / "embeddings.png")))

# %% [markdown]
# ## 4. Do the two models compute similar things? CKA
#
# Centred kernel alignment between every ViT block and every CNN stage on the same test images
# (1 = the same representation up to a rotation and scale).

# %%
display(Image(filename=vit.inspect("cka", work / "cka.png", compare=str(cnn_run.out), n_images=64, batch_size=32)))

# %% [markdown]
# ## 5. Why this class? Attribution and the class lens
#
# Integrated gradients per pixel and the class-specific gradient-weighted rollout; then the
# class each block's output would predict.

# %%
display(Image(filename=vit.inspect("attribution", work / "why.png", image=digit)))
display(Image(filename=vit.inspect("lens", work / "lens.png", image=digit)))
