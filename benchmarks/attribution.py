"""Pointing game for attributions: does the most relevant pixel (or patch) fall on the digit's
stroke, or on the object a caption word names, more often than chance?

    python benchmarks/attribution.py [--run RUN] [--images 200]                  # digits
    python benchmarks/attribution.py --what scenes --captioners RUN,RUN [--scene-images 40]

Trains the embedded ViT (`attnlab train vit`, about 25 s on 2 cores) unless ``--run`` names one,
then for each test image and the model's predicted class: integrated gradients and gradient x
input per pixel (hit: the arg-max of |attribution| is a stroke pixel, intensity > 0.5), and the
class-specific gradient-weighted rollout and plain rollout per patch (hit: the arg-max patch holds
a stroke pixel). Chance: the share of stroke pixels (or stroke patches) per image, averaged.

Scenes: for each held-out scene of a captioning run (the test split `attnlab eval` scores) and
every size, colour and shape word of its generated caption that names an object, the word's
logit (teacher-forced, at the step that writes it) attributed to the pixels: a hit when the
arg-max of |attribution| lies inside the object's box. Chance: the box's share of the image.
The decoder's own attention (the pointing game of `attnlab eval`, at grid resolution: the
arg-max cell overlaps the box; chance: the share of cells that overlap) is scored on the same
words for comparison. Without ``--captioners`` the default captioner is trained (~2.5 minutes).
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
    ap.add_argument("--what", choices=["digits", "scenes", "both"], default="digits")
    ap.add_argument("--run", default=None, help="a ViT run on digits (default: train one)")
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument(
        "--captioners", default=None, help="captioning runs on scenes, comma-separated (default: train one)"
    )
    ap.add_argument("--scene-images", type=int, default=40)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = digits(args) if args.what in ("digits", "both") else []
    if args.what in ("scenes", "both"):
        rows += scenes(args)
    save_json(rows, args.json)


def digits(args) -> list[dict]:
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
    return rows


def scenes(args) -> list[dict]:
    from attnlab.data.captions import load_captions
    from attnlab.inspect.analysis import pointing_hit
    from attnlab.inspect.attribution import caption_attributions
    from attnlab.recipes.caption import SCENE_OPTS, caption_ids, object_words, word_attention

    runs = args.captioners.split(",") if args.captioners else []
    if not runs:
        runs = [
            attnlab.train("caption", out=Path(tempfile.mkdtemp(prefix="attnlab-attr-")) / "cap", progress=False).out
        ]
    rows = []
    for run in runs:
        model = attnlab.load(run)
        meta, size = model.run_meta, model.config.image_size
        ds = load_captions("scenes", image_size=size, vocab=meta["vocab"], **meta.get("data_opts", SCENE_OPTS))
        images, objects = ds.images["test"][: args.scene_images], ds.objects["test"][: args.scene_images]
        ids = caption_ids(model, images, meta)
        gh, gw = model.grid
        hits: dict[str, list[bool]] = {"integrated gradients": [], "gradient x input": [], "attention": []}
        chance_px, chance_cell = [], []
        for i in range(len(images)):
            named = object_words(model.vocab, ids[i], objects[i])
            if not named:
                continue
            steps = [step for _, step, _ in named]
            x = normalize(images[i : i + 1], meta["mean"], meta["std"])
            for name, method in (
                ("integrated gradients", "integrated_gradients"),
                ("gradient x input", "gradient_x_input"),
            ):
                maps = caption_attributions(model, x, ids[i], positions=steps, method=method)["pixels"].abs()
                hits[name] += [pointing_hit(m, obj.box, size) for m, (_, _, obj) in zip(maps, named)]
            if model.config.arch != "rnn":
                att, _ = word_attention(model, images[i : i + 1], meta, [ids[i]])
                hits["attention"] += [pointing_hit(att[0][step], obj.box, size) for _, step, obj in named]
            for _, _, obj in named:
                x0, y0, x1, y1 = obj.box
                chance_px.append((x1 - x0) * (y1 - y0) / size**2)
                cells = [pointing_hit(torch.eye(gh * gw)[c].reshape(gh, gw), obj.box, size) for c in range(gh * gw)]
                chance_cell.append(sum(cells) / len(cells))
        for name, got in hits.items():
            if got:
                rows.append(
                    {
                        "run": f"{Path(run).name} ({model.config.arch})",
                        "method": name,
                        "unit": "cell" if name == "attention" else "pixel",
                        "words": len(got),
                        "pointing": sum(got) / len(got),
                        "chance": sum(chance_cell if name == "attention" else chance_px) / len(got),
                    }
                )
    print_table(rows, ["run", "method", "unit", "words", "pointing", "chance"])
    return rows


if __name__ == "__main__":
    main()
