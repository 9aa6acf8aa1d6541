"""Attention speed and memory, and the lecture's Table 1 measured.

Part 1 — forward+backward of one causal self-attention layer (B=1), for sequence lengths
256 … 8192 at width 64 (one head), and widths 64 … 1024 at length 1024 (heads of 64):
time and peak extra memory of attnlab's fast path (fused SDPA), attnlab's reference path
(forms the T×T matrix), and torch.nn.MultiheadAttention. Peak memory is the growth of the
process's resident set (VmHWM after resetting it) over the inputs, so it counts everything
the step allocates.

Part 2 — "Attention is all you need", Table 1: per-layer time of self-attention (the
QKᵀ/softmax/PV core), a recurrent layer (nn.RNN) and a 1-D convolution (k=3) as n and d
grow, with the fitted exponents printed next to the table's O(n²·d), O(n·d²), O(k·n·d²).

    python benchmarks/attention.py [--quick] [--long] [--very-long] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from common import print_table, save_json, time_it  # noqa: E402

from attnlab.attention import MultiHeadAttention, scaled_dot_product_attention  # noqa: E402


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def peak_extra_bytes(fn) -> int | None:
    """Peak resident memory fn() adds (Linux: reset VmHWM through clear_refs, then read it)."""
    if not os.path.exists("/proc/self/clear_refs"):
        return None
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status("VmRSS")
    fn()
    return max(0, _status("VmHWM") - base)


def layer_step(kind: str, d: int, t: int):
    heads = max(1, d // 64)
    x = torch.randn(1, t, d, requires_grad=True)
    if kind == "torch MHA":
        m = nn.MultiheadAttention(d, heads, batch_first=True)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)  # True = blocked (torch's convention)

        def step():
            out, _ = m(x, x, x, attn_mask=mask, need_weights=False)
            out.sum().backward()
    else:
        m = MultiHeadAttention(d, heads, causal=True)
        need = kind == "attnlab reference"

        def step():
            out = m(x, need_weights=need)
            out = out[0] if need else out
            out.sum().backward()

    return step


def part1(lengths, widths, repeat) -> list[dict]:
    rows = []
    kinds = ["attnlab fast", "attnlab reference", "torch MHA"]
    for d, t in [(64, t) for t in lengths] + [(w, 1024) for w in widths if w != 64]:
        row = {"T": t, "d": d}
        for kind in kinds:
            step = layer_step(kind, d, t)
            step()
            row[f"{kind} ms"] = time_it(step, warmup=1, repeat=repeat) * 1e3
            mem = peak_extra_bytes(step)
            row[f"{kind} MiB"] = mem / 2**20 if mem is not None else None
            del step
        row["fast vs torch"] = row["torch MHA ms"] / row["attnlab fast ms"]
        rows.append(row)
        print(f"  T={t} d={d} done", file=sys.stderr, flush=True)
    return rows


def long_fast_path(lengths) -> list[dict]:
    """Fast-path memory up to 16k tokens: should grow linearly (no T×T matrix)."""
    rows = []
    for t in lengths:
        step = layer_step("attnlab fast", 64, t)
        step()
        ms = time_it(step, warmup=0, repeat=2) * 1e3
        mem = peak_extra_bytes(step) / 2**20
        rows.append(
            {
                "T": t,
                "fast ms": ms,
                "fast MiB": mem,
                "MiB per 1k tokens": mem / (t / 1024),
                "T×T fp32 matrix MiB": t * t * 4 / 2**20,
            }
        )
    return rows


def very_long(lengths, window: int = 256) -> list[dict]:
    """Forward + backward at 4k..64k tokens (B=1, fp32), one step each (timed and its peak memory
    read from the same step): a causal attention layer (d=64) and a whole pre-LN GPT block
    (d=128, 2 heads, MLP 512), each with full causal attention (the fused kernel) and with
    restricted attention (``window``; the block-by-block path). Linear memory = flat MiB per
    1k tokens."""
    import time

    from attnlab.blocks import TransformerBlock

    rows = []
    for t in lengths:
        for what, d in (("attention layer", 64), ("GPT block", 128)):
            for win in (None, window):
                torch.manual_seed(0)
                x = torch.randn(1, t, d, requires_grad=True)
                if what == "GPT block":
                    m = TransformerBlock(d, 2, causal=True, window=win)
                else:
                    m = MultiHeadAttention(d, 1, causal=True, window=win)
                spent = []

                def step():
                    t0 = time.perf_counter()
                    m(x).sum().backward()
                    spent.append(time.perf_counter() - t0)

                mem = peak_extra_bytes(step)
                mem = mem / 2**20 if mem is not None else None
                rows.append(
                    {
                        "T": t,
                        "module": what,
                        "attention": "causal" if win is None else f"window {win}",
                        "s": spent[-1],
                        "peak MiB": mem,
                        "MiB per 1k tokens": mem / (t / 1024) if mem is not None else None,
                    }
                )
                print(f"  T={t} {what} window={win}: {spent[-1]:.1f} s", file=sys.stderr, flush=True)
    return rows


def fit_exponent(xs, ys) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def table1(ns, ds, batch, repeat) -> list[dict]:
    def attn(n, d):
        q, k, v = (torch.randn(batch, 1, n, d) for _ in range(3))
        return lambda: scaled_dot_product_attention(q, k, v)

    def rnn(n, d):
        m, x = nn.RNN(d, d, batch_first=True), torch.randn(batch, n, d)
        return lambda: m(x)

    def conv(n, d):
        m, x = nn.Conv1d(d, d, 3, padding=1), torch.randn(batch, d, n)
        return lambda: m(x)

    layers = {
        "self-attention": (attn, "O(n²·d)", 2, 1),
        "recurrent": (rnn, "O(n·d²)", 1, 2),
        "convolution k=3": (conv, "O(k·n·d²)", 1, 2),
    }
    rows = []
    with torch.no_grad():
        for name, (make, big_o, en, ed) in layers.items():
            d0, n0 = ds[len(ds) // 2], ns[len(ns) // 2]
            tn = [time_it(make(n, d0), warmup=1, repeat=repeat) for n in ns]
            td = [time_it(make(n0, d), warmup=1, repeat=repeat) for d in ds]
            row = {"layer": name, "table": big_o}
            row.update({f"n={n} ms": t * 1e3 for n, t in zip(ns, tn)})
            row.update(
                {
                    "n exponent (fit)": fit_exponent(ns, tn),
                    "n exponent (table)": en,
                    "d exponent (fit)": fit_exponent(ds, td),
                    "d exponent (table)": ed,
                }
            )
            rows.append(row)
    return rows


def main() -> None:
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None and sys.platform == "linux":
        # A fixed mmap threshold makes glibc return every large buffer to the OS when it is
        # freed, so the resident set tracks live tensors and peak memory can be read from it.
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sizes, one-minute version")
    ap.add_argument("--long", action="store_true", help="also the fast path at 4k..16k tokens")
    ap.add_argument(
        "--very-long",
        action="store_true",
        help="only forward + backward at 4k..64k tokens: attention layer and GPT block, causal and windowed",
    )
    ap.add_argument("--json", default=None, help="write all rows as JSON")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, CPU\n")
    if args.very_long:
        print("## Long inputs: forward + backward, B=1\n")
        vl = very_long([4096, 8192, 16384, 32768, 65536])
        print_table(vl, list(vl[0]))
        save_json({"very_long": vl}, args.json)
        return
    if args.quick:
        lengths, widths, repeat = [256, 1024, 2048], [64, 256], 3
        ns, ds = [256, 512, 1024], [64, 128, 256]
    else:
        lengths, widths, repeat = [256, 512, 1024, 2048, 4096, 8192], [64, 256, 1024], 5
        ns, ds = [512, 1024, 2048, 4096], [128, 256, 512, 1024]
    rows = part1(lengths, widths, repeat)
    cols = ["T", "d"] + [f"{k} {u}" for k in ["attnlab fast", "attnlab reference", "torch MHA"] for u in ("ms", "MiB")]
    print("\n## Causal self-attention layer, forward + backward (B=1)\n")
    print_table(rows, cols + ["fast vs torch"])
    all_rows = {"layer": rows}
    if args.long:
        print("\n## Fast path, long sequences (d=64, one head)\n")
        lr = long_fast_path([4096, 8192, 16384])
        print_table(lr, list(lr[0]))
        all_rows["long"] = lr
    print("\n## Table 1 of 'Attention is all you need', measured (forward, batch 8)\n")
    t1 = table1(ns, ds, batch=8, repeat=repeat)
    print_table(t1, list(t1[0]))
    all_rows["table1"] = t1
    save_json(all_rows, args.json)


if __name__ == "__main__":
    main()
