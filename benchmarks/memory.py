"""Peak memory of a GPT training step against sequence length, with and without activation
checkpointing (--checkpoint-activations), and the time it costs.

    python benchmarks/memory.py [--lengths 256,512,1024,2048]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from attention import peak_extra_bytes  # noqa: E402
from common import print_table, time_it  # noqa: E402

from attnlab.models import GPT, GPTConfig  # noqa: E402
from attnlab.training.trainer import set_activation_checkpointing  # noqa: E402


def main() -> None:
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None and sys.platform == "linux":
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # so the resident set tracks live tensors
        os.execv(sys.executable, [sys.executable, *sys.argv])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="256,512,1024,2048")
    args = ap.parse_args()
    rows = []
    for t in [int(x) for x in args.lengths.split(",")]:
        row = {"T": t}
        for ckpt in (False, True):
            torch.manual_seed(0)
            m = GPT(GPTConfig(vocab_size=65, context=t, layers=6, heads=6, dim=384))
            set_activation_checkpointing(m, ckpt)
            m.train()
            x = torch.randint(0, 65, (4, t))

            def step():
                F.cross_entropy(m(x).flatten(0, 1), x.flatten()).backward()
                m.zero_grad(set_to_none=True)

            step()
            label = "checkpointed" if ckpt else "plain"
            row[f"{label} MiB"] = peak_extra_bytes(step) / 2**20
            row[f"{label} s"] = time_it(step, warmup=0, repeat=2)
        row["memory saved"] = 1 - row["checkpointed MiB"] / row["plain MiB"]
        rows.append(row)
        print(f"  T={t}", file=sys.stderr, flush=True)
    print("\n## GPT 6/6/384, batch 4, forward+backward\n")
    print_table(rows, list(rows[0]))


if __name__ == "__main__":
    main()
