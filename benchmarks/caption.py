"""Captioning on synthetic scenes: the three decoders (no attention, Show-Attend-Tell, Transformer)
trained with the embedded default recipe, then scored on held-out scenes with generated captions:
exact-caption rate and BLEU-4 against the number of objects, and the pointing game.

    python benchmarks/caption.py [--archs rnn,rnn-attention,transformer] [--json caption.json]
        [--plot docs/figures/caption_objects.png] [--figure docs/figures/caption_attention.png]

Each model is trained by `attnlab train caption --arch A` (no other option), timed, then
evaluated by `attnlab eval --json` (greedy decoding). Run alone: it trains three models.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from common import print_table, save_json  # noqa: E402

import attnlab  # noqa: E402
from attnlab.inspect.plots import line_plot_png  # noqa: E402

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures"


def extra_options(text: str) -> dict:
    """'--max-iters 600 --dim 64' -> {'max_iters': '600', 'dim': '64'} (checked by attnlab.train)."""
    words = text.split()
    return {k.lstrip("-").replace("-", "_"): v for k, v in zip(words[::2], words[1::2])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", default="rnn,rnn-attention,transformer")
    ap.add_argument(
        "--extra", default="", help="more options for every `attnlab train caption` (e.g. '--max-iters 600')"
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=str(FIGURES / "caption_objects.png"))
    ap.add_argument(
        "--figure",
        default=str(FIGURES / "caption_attention.png"),
        help="per-word attention of the rnn-attention model on one held-out scene",
    )
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="attnlab-caption-"))
    rows, results = [], {}
    for arch in args.archs.split(","):
        out = root / arch
        t0 = time.perf_counter()
        attnlab.train("caption", out=out, arch=arch, progress=False, **extra_options(args.extra))
        seconds = time.perf_counter() - t0
        res = attnlab.evaluate(out)
        res["train_s"] = seconds
        results[arch] = res
        by = res["by_objects"]
        rows.append(
            {
                "arch": arch,
                "train s": seconds,
                "BLEU-4": res["bleu"][3],
                "exact": res["exact"],
                **{f"exact {k} obj": v["exact"] for k, v in by.items()},
                **{f"BLEU-4 {k} obj": v["bleu4"] for k, v in by.items()},
                "pointing": res["pointing"] if res["pointing"] is not None else "-",
                **{f"pointing {k}": v for k, v in (res["pointing_by_word"] or {}).items()},
            }
        )
        if arch == "rnn-attention" and args.figure:
            from attnlab.data.captions import make_scenes
            from PIL import Image

            scene = make_scenes(1, seed=12345, image_size=40, min_objects=2).images[0]
            img = root / "scene.png"
            Image.fromarray((scene.permute(1, 2, 0).numpy() * 255).astype("uint8")).save(img)
            attnlab.load(out).inspect("caption", args.figure, image=str(img))
    print_table(rows, list(dict.fromkeys(k for r in rows for k in r)))
    counts = sorted({int(k) for r in results.values() for k in r["by_objects"]})
    line_plot_png(
        counts,
        {a: [r["by_objects"].get(str(k), {}).get("exact", float("nan")) for k in counts] for a, r in results.items()},
        Path(args.plot),
        xlabel="objects in the scene",
        ylabel="exact captions (held-out scenes)",
        title="captioning: attention keeps up as scenes get busier",
    )
    print(f"\nplot: {args.plot}")
    save_json(results, args.json)


if __name__ == "__main__":
    main()
