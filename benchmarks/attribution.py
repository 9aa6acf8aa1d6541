"""Pointing game for attributions on the embedded digits: does the most relevant pixel (or patch)
fall on the digit's stroke more often than chance?

    python benchmarks/attribution.py [--run RUN] [--images 200]

Trains the embedded ViT (`attnlab train vit`, about 25 s on 2 cores) unless ``--run`` names one,
then for each test image and the model's predicted class: integrated gradients and gradient x
input per pixel (hit: the arg-max of |attribution| is a stroke pixel, intensity > 0.5), and the
class-specific gradient-weighted rollout and plain rollout per patch (hit: the arg-max patch holds
a stroke pixel). Chance: the share of stroke pixels (or stroke patches) per image, averaged.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import print_table, save_json  # noqa: E402

import attnlab  # noqa: E402
from attnlab.data.images import load_images, normalize  # noqa: E402
from attnlab.inspect.analysis import rollout  # noqa: E402
from attnlab.inspect.attribution import gradient_rollout, image_attributions  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default=None, help="a ViT run on digits (default: train one)")
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    run = (
        args.run or attnlab.train("vit", out=Path(tempfile.mkdtemp(prefix="attnlab-attr-")) / "vit", progress=False).out
    )
    vit = attnlab.load(run)
    x, _ = load_images("digits").test
    x = x[: args.images]
    stroke = x[:, 0] > 0.5  # (N, 8, 8)
    p = vit.config.patch_size
    stroke_patch = stroke.unfold(1, p, p).unfold(2, p, p).flatten(-2).any(-1)  # (N, gh, gw)
    inputs = normalize(x, vit.mean, vit.std)
    with torch.no_grad():
        pred = vit(inputs).argmax(-1)
    hits = {"integrated gradients": 0, "gradient x input": 0, "gradient-weighted rollout": 0, "attention rollout": 0}
    for i in range(len(x)):
        one, target = inputs[i : i + 1], int(pred[i])
        for name, method in (
            ("integrated gradients", "integrated_gradients"),
            ("gradient x input", "gradient_x_input"),
        ):
            a = image_attributions(vit, one, target, method=method)["pixels"][0].abs()
            hits[name] += bool(stroke[i].flatten()[a.argmax()])
        g = gradient_rollout(vit, one, target)[0]
        hits["gradient-weighted rollout"] += bool(stroke_patch[i].flatten()[g.argmax()])
        _, cache = vit.run_with_cache(one, names="encoder.blocks.*.attn.hook_pattern")
        plain = rollout(cache.layers("attn.hook_pattern"), n_prefix=vit.n_prefix)[0, 0, vit.n_prefix :]
        hits["attention rollout"] += bool(stroke_patch[i].flatten()[plain.argmax()])
    n = len(x)
    chance_px = stroke.float().mean((1, 2)).mean().item()
    chance_patch = stroke_patch.float().mean((1, 2)).mean().item()
    rows = [
        {
            "method": k,
            "unit": "pixel" if "gradient" in k and "rollout" not in k else "patch",
            "pointing": v / n,
            "chance": chance_px if "rollout" not in k else chance_patch,
        }
        for k, v in hits.items()
    ]
    print_table(rows, ["method", "unit", "pointing", "chance"])
    save_json(rows, args.json)


if __name__ == "__main__":
    main()
