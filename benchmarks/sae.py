"""Sparse autoencoders on the Shakespeare GPT: what a ReLU (L1) and a top-k SAE reach on the
residual stream after block 1, the numbers of benchmarks/README.md ("Sparse autoencoders").

    python benchmarks/sae.py [--data-dir ../shared/data] [--steps 2000]

Trains the default GPT recipe on Tiny Shakespeare (1,000 steps), then each SAE for ``--steps``
steps of 1,024 activations, and prints their metrics (attnlab.sae.evaluate on the validation
text: 8 batches of 8 windows) and the top-k SAE's most frequent latents with their top contexts.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import attnlab


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=os.environ.get("ATTNLAB_DATA"))
    p.add_argument("--steps", type=int, default=2000)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="attnlab-sae-bench-"))
    t0 = time.perf_counter()
    run = attnlab.train("gpt", data="shakespeare", data_dir=args.data_dir, out=work / "gpt", progress=False)
    gpt = attnlab.load(run.out)
    print(f"GPT: {time.perf_counter() - t0:.0f} s, validation loss {run.best_val:.4f}")
    hook = "blocks.1.hook_resid_post"
    for kind, options in (("relu", {"l1_coefficient": 2.0}), ("topk", {"k": 16})):
        t0 = time.perf_counter()
        sae = attnlab.sae.train(gpt, hook, kind=kind, steps=args.steps, progress=False, **options)
        shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in sae.metrics.items()}
        print(f"{kind} {options}: {time.perf_counter() - t0:.0f} s {json.dumps(shown)}")
        if kind == "topk":
            for page in attnlab.sae.features(gpt, sae.sae, count=8):
                hits = [("".join(c["tokens"]), c["tokens"][c["at"]]) for c in page["contexts"][:3]]
                print(f"  latent {page['latent']} ({page['frequency']:.1%}): {hits}")


if __name__ == "__main__":
    main()
