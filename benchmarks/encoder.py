"""The text encoder on the embedded data: masked-LM pretraining on the Python help pages, then
the documentation-section classifier with and without that pretraining (same steps, same seed).

    python benchmarks/encoder.py [--pretrain-iters 1500] [--classify-iters 600] [--json encoder.json]

Every model is trained by `attnlab train encoder` with the default (tiny) preset and scored by
`attnlab eval --json` on the held-out split (masked-LM: validation paragraphs; classification: test
topics, which no training paragraph comes from). Run alone.
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


def run(out: Path, **options) -> float:
    t0 = time.perf_counter()
    attnlab.train("encoder", out=out, progress=False, **options)
    return time.perf_counter() - t0


def evaluate(out: Path) -> dict:
    return attnlab.evaluate(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pretrain-iters", type=int, default=1500)
    ap.add_argument("--classify-iters", type=int, default=600)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="attnlab-encoder-"))
    rows = []
    s = run(root / "mlm", max_iters=args.pretrain_iters)
    mlm = evaluate(root / "mlm")
    rows.append(
        {
            "run": "masked-LM pretraining",
            "steps": args.pretrain_iters,
            "train s": s,
            "result": f"val masked-token loss {mlm['loss']:.3f}, accuracy {mlm['accuracy_masked']:.3f}",
        }
    )
    results = {"mlm": mlm}
    for name, extra in (("classify, from scratch", {}), ("classify, from the pretrained run", {"init": root / "mlm"})):
        out = root / name.split(",")[1].strip().replace(" ", "_")
        s = run(out, task="classify", max_iters=args.classify_iters, eval_interval=100, **extra)
        res = evaluate(out)
        results[name] = res
        rows.append(
            {
                "run": name,
                "steps": args.classify_iters,
                "train s": s,
                "result": f"test accuracy {res['accuracy']:.3f}, macro-F1 {res['macro_f1']:.3f}",
            }
        )
    print_table(rows, list(rows[0]))
    save_json(results, args.json)


if __name__ == "__main__":
    main()
