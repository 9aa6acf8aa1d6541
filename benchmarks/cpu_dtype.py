"""fp32 vs bf16 autocast on this CPU: the measurements behind `--dtype auto`'s CPU rule.

For each embedded default and the nanoGPT / `shakespeare` shapes, one full training step
(forward, loss, backward, clip, AdamW) is timed in fp32 and under bf16 autocast, alternating
the two so both see the same machine state. The last column is what `--dtype auto` picks
(``attnlab.training.devices.auto_cpu_dtype``: fp32 below a width, else the trainer times a few
steps of each at start-up and takes bf16 only when it is clearly faster).

    python benchmarks/cpu_dtype.py [--repeat 10] [--json FILE]

Run it alone: two torch processes on 2 cores slow each other down.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from common import print_table, save_json, time_it  # noqa: E402

from attnlab.models import GPT, GPTConfig, Transformer, TransformerConfig, ViT, ViTConfig  # noqa: E402
from attnlab.models.vit import VIT_PRESETS  # noqa: E402
from attnlab.training.optim import adamw  # noqa: E402
from attnlab.training.devices import CPU_BF16_MIN_SPEEDUP, auto_cpu_dtype, cpu_has_fast_bf16, model_width  # noqa: E402


def shapes():
    """(name, model, make_batch, loss_fn, items per step)."""

    def gpt(name, n_layer, n_head, n_embd, block, batch, vocab=65):
        cfg = GPTConfig(vocab_size=vocab, context=block, layers=n_layer, heads=n_head, dim=n_embd)
        x = torch.randint(0, vocab, (batch, block))
        y = torch.randint(0, vocab, (batch, block))
        return name, GPT(cfg), (x,), lambda out: F.cross_entropy(out.float().flatten(0, 1), y.flatten()), batch * block

    def vit(name, preset, batch, classes=10):
        cfg = ViTConfig(**{**VIT_PRESETS[preset], "num_classes": classes})
        x = torch.randn(batch, cfg.in_chans, cfg.image_size, cfg.image_size)
        y = torch.randint(0, classes, (batch,))
        return name, ViT(cfg), (x,), lambda out: F.cross_entropy(out.float(), y), batch

    def seq2seq(name, dim, batch, length, vocab=40):
        cfg = TransformerConfig(src_vocab=vocab, tgt_vocab=vocab, dim=dim, heads=8, ff_dim=2 * dim, dropout=0.0)
        src = torch.randint(3, vocab, (batch, length))
        tgt = torch.randint(3, vocab, (batch, length + 1))
        mask = torch.ones(batch, length, dtype=torch.bool)
        return (
            name,
            Transformer(cfg),
            (src, tgt[:, :-1], mask),
            lambda out: F.cross_entropy(out.float().flatten(0, 1), tgt[:, 1:].flatten()),
            batch * length,
        )

    yield gpt("gpt nanoGPT-cpu 4/4/128 ctx64 b12 (shakespeare-cpu, the default)", 4, 4, 128, 64, 12)
    yield gpt("gpt 4/4/192 ctx128 b12", 4, 4, 192, 128, 12)
    yield gpt("gpt 4/4/256 ctx128 b12", 4, 4, 256, 128, 12)
    yield gpt("gpt shakespeare 6/6/384 ctx256 b16", 6, 6, 384, 256, 16)
    yield vit("vit digits preset b128 (the default)", "digits", 128)
    yield vit("vit mnist preset b128", "mnist", 128)
    yield vit("vit cifar preset b128", "cifar", 128)
    yield seq2seq("transformer seq2seq 3+3 layers 256 wide b64 len 20 (the default)", 256, 64, 20)


def step_fn(model, inputs, loss_fn, dtype):
    opt = adamw(model, 1e-4, 0.1, (0.9, 0.99))
    model.train()

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = loss_fn(model(*inputs))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    fast = cpu_has_fast_bf16()
    print(f"CPU fast bf16 (AVX512-BF16/AMX): {fast}; threads {torch.get_num_threads()}", file=sys.stderr)
    rows = []
    for name, model, inputs, loss_fn, items in shapes():
        t32, t16 = [], []
        for _ in range(2):
            t32.append(time_it(step_fn(model, inputs, loss_fn, torch.float32), warmup=2, repeat=args.repeat))
            t16.append(time_it(step_fn(model, inputs, loss_fn, torch.bfloat16), warmup=2, repeat=args.repeat))
        a, b = items / min(t32), items / min(t16)
        picked, why = auto_cpu_dtype(model, fast)
        rows.append(
            {
                "row": name,
                "width": model_width(model),
                "fp32 items/s": a,
                "bf16 items/s": b,
                "bf16 / fp32": b / a,
                "reason": why,
                "auto picks": "fp32"
                if picked is not None
                else f"times both: {'bf16' if b / a >= CPU_BF16_MIN_SPEEDUP else 'fp32'} here",
            }
        )
        print(f"  {name}: {b / a:.2f}x", file=sys.stderr, flush=True)
    print_table(rows, ["row", "width", "fp32 items/s", "bf16 items/s", "bf16 / fp32", "auto picks"])
    save_json(rows, args.json)


if __name__ == "__main__":
    main()
