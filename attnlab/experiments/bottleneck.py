"""The bottleneck experiment: on the reverse task, sequence accuracy against input length for an
RNN without attention (one context vector), an RNN with (Bahdanau) attention and a Transformer,
each trained with the same number of steps and batch size."""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from ..data.parallel import load_parallel, pad_batch, synthetic_pair
from ..generate.beam import greedy_decode
from ..models import RNNConfig, RNNSeq2Seq, Transformer, TransformerConfig
from ..training.runs import fit_model
from ..training import TrainConfig
from ..training.callbacks import MeasureAtSteps, quarter_steps
from ..training.tasks import Seq2SeqTask
from .stats import seed_suffix


def make_models(vocab: int, max_len: int, small: bool) -> dict:
    h = 64 if small else 128
    rnn = dict(src_vocab=vocab, tgt_vocab=vocab, emb_dim=h // 2, dim=h, dropout=0.0, context=max_len)
    return {
        "RNN (no attention)": RNNSeq2Seq(RNNConfig(**rnn, attention="none")),
        "RNN + attention": RNNSeq2Seq(RNNConfig(**rnn, attention="additive")),
        "Transformer": Transformer(
            TransformerConfig(
                src_vocab=vocab,
                tgt_vocab=vocab,
                dim=h,
                heads=4,
                enc_layers=2,
                dec_layers=2,
                mlp_dim=2 * h,
                dropout=0.0,
                context=max_len,
            )
        ),
    }


@torch.no_grad()
def accuracy_by_length(model, vocab, lengths, n: int = 100, seed: int = 0) -> dict[int, float]:
    rng = random.Random(seed)
    out = {}
    for length in lengths:
        pairs = [synthetic_pair("reverse", rng, length, length) for _ in range(n)]
        src, mask = pad_batch([vocab.encode(s) for s, _ in pairs])
        hyps = greedy_decode(model, src, mask, max_len=length + 2)
        out[length] = sum(vocab.decode(h) == t for h, (_, t) in zip(hyps, pairs)) / n
    return out


def run(
    lengths=(5, 10, 20, 30, 40, 60),
    steps: int = 1500,
    batch_size: int = 64,
    out: Path | None = None,
    small: bool = False,
    progress: bool = False,
    only: tuple[str, ...] | None = None,
    seed: int = 0,
    **train_options,
) -> dict:
    """Train the three models of ``make_models`` (or the ``only`` ones) on reversal up to
    ``max(lengths)`` and return each one's sequence accuracy per length at the end and along the
    run (``{name: {"accuracy": {length: acc}, "curve": {step: {length: acc}}, ...}}``); ``seed``:
    the initial weights and the batches (0: the trainer's default batches); ``train_options``:
    TrainConfig fields to set as well (``device="cpu", dtype="fp32"``)."""
    min_len, max_len = min(lengths), max(lengths)
    data = load_parallel("reverse", min_len=min_len, max_len=max_len)
    results = {}
    for name, model in make_models(data.src_vocab.size, 2 * max_len + 4, small).items():
        if only is not None and name not in only:
            continue
        if seed:  # another draw of the initial weights (seed 0: make_models' own)
            torch.manual_seed(seed)
            model = type(model)(model.config)
        torch.manual_seed(seed)
        cfg = TrainConfig(
            max_iters=steps,
            batch_size=batch_size,
            lr=3e-3,
            min_lr=3e-5,
            warmup_iters=min(100, steps // 5),
            weight_decay=0.0,
            eval_interval=steps,
            eval_iters=2,
            progress=progress,
            **({"seed": 1337 + seed} if seed else {}),
            **train_options,
        )
        folder = (out or Path("runs/bottleneck")) / name.replace(" ", "_").replace("(", "").replace(")", "")
        folder = folder.with_name(folder.name + seed_suffix(seed))
        t0 = time.perf_counter()
        along = MeasureAtSteps(
            model,
            lambda: accuracy_by_length(model, data.src_vocab, lengths),  # noqa: B023 (called within this loop)
            quarter_steps(steps, cfg.log_interval)[:-1],
        )
        fit_model(model, Seq2SeqTask(data, batch_size), cfg, folder, callbacks=[along])
        acc = accuracy_by_length(model.eval(), data.src_vocab, lengths)
        results[name] = {
            "accuracy": acc,
            "curve": {**along.curve, steps: acc},
            "seconds": time.perf_counter() - t0,
            "parameters": sum(p.numel() for p in model.parameters()),
        }
    return results


def plot(results: dict, path: Path) -> Path:
    """Accuracy against length at the end of the runs and, when the runs kept their curves, the
    accuracy at the longest length against the steps trained."""
    from ..inspect.plots import save_figure, plt

    curves = all("curve" in r for r in results.values())
    fig, axes = plt.subplots(
        1, 2 if curves else 1, figsize=(10 if curves else 5.5, 3.6), dpi=100, squeeze=False, layout="constrained"
    )
    ax = axes[0, 0]
    for name, r in results.items():
        xs = sorted(r["accuracy"])
        ax.plot(xs, [r["accuracy"][x] for x in xs], "o-", label=name)
    ax.set_xlabel("input length (symbols)")
    ax.set_ylabel("sequence accuracy (reverse task)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("accuracy by input length, after training", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if curves:
        ax = axes[0, 1]
        for name, r in results.items():
            steps, longest = sorted(r["curve"]), max(r["accuracy"])
            ax.plot(steps, [r["curve"][s][longest] for s in steps], "o-", label=name)
        ax.set_xlabel("steps trained (one run each, measured along it)")
        ax.set_ylabel(f"sequence accuracy at length {longest}")
        ax.set_title(f"the longest inputs ({longest} symbols) along the runs", fontsize=9)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    return save_figure(fig, path)
