"""How much of a demo sample is words (issue 68): the share of a sample's words that are words of
the corpus the model was trained on, over several seeds and temperatures.

    python benchmarks/demo_words.py --ckpt runs/demo                     # after `make demo`
    python benchmarks/demo_words.py --ckpt runs/demo --temperatures 0.6 0.8 --seeds 1 2 3

A word is a run of letters; the corpus's words are those of the run's own data (the embedded
Python help text for `make demo`). Each sample starts from "The " and has --chars new characters.
"""

from __future__ import annotations

import argparse
import re

import attnlab
from attnlab.data.text import load_corpus


def words_share(sample: str, vocabulary: set[str]) -> tuple[int, int]:
    """(how many of the sample's words are in ``vocabulary``, how many words it has)."""
    words = re.findall(r"[A-Za-z]+", sample)
    return sum(w in vocabulary for w in words), len(words)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", required=True, help="a GPT run folder")
    p.add_argument("--chars", type=int, default=400, help="new characters per sample (default 400)")
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(1, 11)))
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.6, 0.8])
    args = p.parse_args()
    model = attnlab.load(args.ckpt)
    _, text = load_corpus(model.run_meta.get("data_spec"))
    vocabulary = set(re.findall(r"[A-Za-z]+", text))
    for t in args.temperatures:
        shares = []
        for seed in args.seeds:
            ok, n = words_share("The " + model.generate("The ", args.chars, temperature=t, seed=seed), vocabulary)
            shares.append(ok / max(n, 1))
            print(f"temperature {t:g}, seed {seed}: {ok}/{n} = {ok / max(n, 1):.0%} words of the corpus")
        print(f"temperature {t:g}: mean {sum(shares) / len(shares):.0%}, from {min(shares):.0%} to {max(shares):.0%}")


if __name__ == "__main__":
    main()
