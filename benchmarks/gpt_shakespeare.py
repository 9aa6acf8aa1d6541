"""nanoGPT's documented CPU run, reproduced with attnlab:

    python train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20
      --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
      --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0

nanoGPT reports validation loss 1.88 for it. Here: Tiny Shakespeare (char-level) from the
data directory, 2000 iterations, lr 1e-3 cosine to 1e-4, warmup 100, weight decay 0.1,
clip 1.0, beta2 0.99. Prints the validation loss (nanoGPT's 20-batch estimate and the
full validation split), wall time and tokens/s.

    ATTNLAB_DATA=../shared/data python benchmarks/gpt_shakespeare.py [--dtype fp32|bf16] [--compile]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--max-iters", type=int, default=2000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="attnlab-shakespeare-"))
    cmd = [sys.executable, "-m", "attnlab", "train", "gpt", "--data", "shakespeare", "--preset", "shakespeare-cpu",
           "--out", str(out), "--max-iters", str(args.max_iters), "--lr-decay-iters", str(args.max_iters),
           "--batch-size", "12", "--block-size", "64", "--dropout", "0.0", "--lr", "1e-3", "--min-lr", "1e-4",
           "--warmup-iters", "100", "--weight-decay", "0.1", "--beta2", "0.99", "--grad-clip", "1.0",
           "--eval-interval", "250", "--eval-iters", "20", "--dtype", args.dtype, "--no-progress", "--no-bias",
           "--sample-chars", "0", *(["--compile"] if args.compile else [])]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    last_eval = [r for r in recs if "val_loss" in r][-1]
    tok_s = [r["items_per_s"] for r in recs if "items_per_s" in r][-1]
    full = subprocess.run([sys.executable, "-m", "attnlab", "eval", "--ckpt", str(out / "last"), "--json"],
                          check=True, capture_output=True, text=True)
    full = json.loads(full.stdout)
    print(f"| dtype | compile | iters | val loss (20 batches) | val loss (full split) | wall s | tokens/s |")
    print(f"|---|---|---|---|---|---|---|")
    print(f"| {args.dtype} | {args.compile} | {args.max_iters} | {last_eval['val_loss']:.4f} | {full['loss']:.4f} "
          f"| {wall:.0f} | {tok_s:,.0f} |")


if __name__ == "__main__":
    main()
