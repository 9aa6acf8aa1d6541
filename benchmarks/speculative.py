"""Speculative decoding: a 12-layer GPT (the target) with a 2-layer draft trained on the same text
(Tiny Shakespeare, characters), greedy and sampled, tokens/s with the draft against the target
alone, measured one after the other in this process. Greedy output is checked identical.

Trains both models first with the speedrun-cpu recipe (a few minutes on 2 cores) unless
--target/--draft name existing runs.

    ATTNLAB_DATA=../shared/data python benchmarks/speculative.py [--target RUN --draft RUN]
        [--tokens 200] [--draft-tokens 2 3 4 6]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import print_table  # noqa: E402

SHAPES = {
    "target": ["--layers", "12", "--heads", "6", "--dim", "192", "--max-iters", "400"],
    "draft": ["--layers", "2", "--heads", "4", "--dim", "128", "--max-iters", "500"],
}


def train(name: str, out: Path) -> Path:
    cmd = [sys.executable, "-m", "attnlab", "train", "gpt", "--data", "shakespeare", "--preset", "speedrun-cpu"]
    cmd += [*SHAPES[name], "--context", "128", "--out", str(out), "--no-progress", "--sample-chars", "0"]
    cmd += ["--eval-interval", "1000", "--no-compile"]
    subprocess.run(cmd, check=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="the big model's run (default: train one)")
    ap.add_argument("--draft", default=None, help="the draft's run (default: train one)")
    ap.add_argument("--tokens", type=int, default=200, help="new tokens per generation (default 200)")
    ap.add_argument("--draft-tokens", type=int, nargs="+", default=[2, 3, 4, 6])
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="attnlab-speculative-"))
    target_run = Path(args.target) if args.target else train("target", root / "target")
    draft_run = Path(args.draft) if args.draft else train("draft", root / "draft")

    import attnlab
    from attnlab.generate import generate, speculative_generate

    target, draft = attnlab.load(target_run), attnlab.load(draft_run)
    prompt = target.tokenizer.encode("ROMEO:\n")
    n = args.tokens

    def best_of(f, repeat=3):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            out = f()
            times.append(time.perf_counter() - t0)
        return min(times), out

    rows = []
    for temperature in (0.0, 0.8):
        kw = dict(temperature=temperature, top_k=None)
        t_alone, alone = best_of(
            lambda: generate(target, [prompt], n, generator=torch.Generator().manual_seed(0), **kw)[0]
        )
        for k in args.draft_tokens:
            stats = {}
            t_spec, spec = best_of(
                lambda: speculative_generate(
                    target,
                    draft,
                    prompt,
                    n,
                    draft_tokens=k,
                    stats=stats,
                    generator=torch.Generator().manual_seed(0),
                    **kw,
                )
            )
            rows.append(
                {
                    "decoding": "greedy" if temperature == 0 else f"sampled, T={temperature}",
                    "draft tokens": k,
                    "accepted": f"{stats['accepted'] / stats['proposed']:.2f}",
                    "tokens per target pass": f"{n / stats['rounds']:.2f}",
                    "alone tok/s": n / t_alone,
                    "with draft tok/s": n / t_spec,
                    "speed-up": t_alone / t_spec,
                    "same tokens": str(spec == alone) if temperature == 0 else "-",
                }
            )
    print(
        f"target {target_run} ({sum(p.numel() for p in target.parameters()) / 1e6:.1f}M), draft {draft_run} "
        f"({sum(p.numel() for p in draft.parameters()) / 1e6:.2f}M), {n} new tokens, batch 1, "
        f"{torch.get_num_threads()} threads"
    )
    print_table(rows, list(rows[0]))


if __name__ == "__main__":
    main()
