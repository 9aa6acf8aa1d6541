"""Activation patching on the induction model of `attnlab reproduce induction`: which heads carry
the copy? (the README's patching figure)

    python benchmarks/induction_patching.py [--out docs/figures/induction_patching.png]

Trains the claim's 2-layer attention-only GPT (about 20 s), then patches each head's output from a
clean run (a random segment written twice: the last token's answer is the token that followed it
in the first copy) into a corrupted run (the first copy replaced by other random tokens, so
nothing can be copied), measuring the logit difference between the right answer and the token
the corrupted run predicts.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import attnlab
from attnlab.experiments import CLAIMS, Context
from attnlab.inspect.patching import logit_difference, patch_activations, patching_figure

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(FIGURES / "induction_patching.png"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Context(out=Path(tmp) / "out", work=Path(tmp) / "work", size="quick")
        ctx.out.mkdir()
        print(CLAIMS["induction"].check(ctx).measured)
        model = attnlab.load(ctx.work / "induction")
    g = torch.Generator().manual_seed(7)
    half = 12
    first = torch.randint(64, (1, half), generator=g)
    clean = torch.cat([first, first], 1)[:, :-1]  # ends inside the second copy: its next token is first[-1]
    corrupt = torch.cat([torch.randint(64, (1, half), generator=g), first], 1)[:, :-1]
    with torch.no_grad():
        wrong = int(model(corrupt)[0, -1].argmax())
    answer = int(first[0, -1])
    if wrong == answer:
        wrong = (answer + 1) % 64
    metric = logit_difference(answer, wrong)
    heads = patch_activations(model, (clean,), (corrupt,), metric, over="head")
    print("restored fraction per layer x head:\n", heads.numpy().round(3))
    patching_figure(heads, args.out, over="head", title="induction model: patching each head from the clean run")
    print(f"figure: {args.out}")


if __name__ == "__main__":
    main()
