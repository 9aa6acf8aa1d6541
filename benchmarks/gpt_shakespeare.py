"""Tiny Shakespeare (char-level): nanoGPT's documented CPU recipe against attnlab's default
recipe for the same model, run one after the other on the same machine.

nanoGPT's recipe, reproduced with attnlab:

    python train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20
      --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
      --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0

(2000 iterations, lr 1e-3 cosine to 1e-4, warmup 100, weight decay 0.1, clip 1.0, beta2 0.99, no
biases; nanoGPT reports validation loss 1.88 for it). attnlab's recipe is `attnlab train gpt
--data shakespeare` with nothing else: the shakespeare-cpu preset's training defaults (lr 5e-3
cosine to 5e-4, warmup 50, 1000 iterations, biases). Each row prints nanoGPT's 20-batch
validation estimate, the loss over the whole validation split (`attnlab eval`, 64-token windows),
the training wall time and tokens/s.

    ATTNLAB_DATA=../shared/data python benchmarks/gpt_shakespeare.py [--only nanogpt|attnlab]
        [--dtype fp32|bf16] [--compile] [--max-iters N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from common import print_table  # noqa: E402

NANOGPT = [
    "--preset",
    "shakespeare-cpu",
    "--max-iters",
    "2000",
    "--lr-decay-iters",
    "2000",
    "--batch-size",
    "12",
    "--context",
    "64",
    "--dropout",
    "0.0",
    "--lr",
    "1e-3",
    "--min-lr",
    "1e-4",
    "--warmup-iters",
    "100",
    "--weight-decay",
    "0.1",
    "--beta2",
    "0.99",
    "--grad-clip",
    "1.0",
    "--eval-interval",
    "250",
    "--eval-iters",
    "20",
    "--no-bias",
]
RECIPES = {"nanogpt": ("nanoGPT CPU recipe", NANOGPT), "attnlab": ("attnlab default (shakespeare-cpu)", [])}


def train_and_eval(label: str, recipe: list[str], extra: list[str], out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "attnlab",
        "train",
        "gpt",
        "--data",
        "shakespeare",
        "--out",
        str(out),
        "--no-progress",
        "--sample-chars",
        "0",
        *recipe,
        *extra,
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    last_eval = [r for r in recs if "val_loss" in r][-1]
    full = subprocess.run(
        [sys.executable, "-m", "attnlab", "eval", "--ckpt", str(out / "last"), "--json"],
        check=True,
        capture_output=True,
        text=True,
    )
    return {
        "recipe": label,
        "iters": recs[-1]["step"],
        "val loss (20 batches)": f"{last_eval['val_loss']:.4f}",
        "val loss (full split)": f"{json.loads(full.stdout)['loss']:.4f}",
        "wall s": wall,
        # the median logging window (each is the rate of its steps alone, evaluations left out)
        "tokens/s": statistics.median(r["items_per_s"] for r in recs[1:] if "items_per_s" in r),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=sorted(RECIPES), default=None, help="run one recipe (default: both)")
    ap.add_argument("--dtype", default=None, help="fp32 | bf16 (default: attnlab's auto)")
    ap.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="force torch.compile on or off (default: attnlab's auto)",
    )
    ap.add_argument("--max-iters", type=int, default=None, help="override both recipes' iterations")
    ap.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="attnlab-shakespeare-"))
    extra = [
        *(["--dtype", args.dtype] if args.dtype else []),
        *({True: ["--compile"], False: ["--no-compile"]}.get(args.compile, [])),
        *(["--max-iters", str(args.max_iters), "--lr-decay-iters", str(args.max_iters)] if args.max_iters else []),
    ]
    rows = []
    for key in [args.only] if args.only else list(RECIPES):
        label, recipe = RECIPES[key]
        rows.append(train_and_eval(label, recipe, extra, root / key))
    if len(rows) == 2:
        rows[1]["wall vs nanoGPT"] = rows[1]["wall s"] / rows[0]["wall s"]
    print()
    print_table(
        rows,
        ["recipe", "iters", "val loss (20 batches)", "val loss (full split)", "wall s", "tokens/s", "wall vs nanoGPT"],
    )


if __name__ == "__main__":
    main()
