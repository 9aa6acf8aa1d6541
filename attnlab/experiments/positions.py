"""Claims of the positional-encoding lecture: attention alone ignores order, what a positional
encoding must be, sinusoidal offsets as linear maps, encodings and longer inputs, and adding vs
concatenating the code."""

from __future__ import annotations

import numpy as np
import torch

from ..inspect.plots import plt, save_figure
from .registry import Context, Control, Result, claim, markdown_table
from .runs import LENGTH_STEPS, corpus, gpt_losses, length_gpt, loss_at, loss_bars, spread_ends
from .stats import aa_seeds, aa_spread, same_verdict, seeds_for, seeds_note, seeds_verdict


@claim("permutation")
def permutation(ctx: Context) -> Result:
    from ..attention import MultiHeadAttention
    from ..position import SinusoidalPosition

    torch.manual_seed(0)
    mha, pe = MultiHeadAttention(32, 4).eval(), SinusoidalPosition(32, 64)
    x = torch.randn(2, 12, 32)
    perm = torch.randperm(12)
    with torch.no_grad():
        eq = (mha(x)[:, perm] - mha(x[:, perm])).abs().max().item()
        inv = (mha(x).mean(1) - mha(x[:, perm]).mean(1)).abs().max().item()
        eq_pe = (mha(pe(x))[:, perm] - mha(pe(x[:, perm]))).abs().max().item()
        inv_pe = (mha(pe(x)).mean(1) - mha(pe(x[:, perm])).mean(1)).abs().max().item()
        # the control: a causal mask, which tells each token how many came before it (order without positions)
        causal = MultiHeadAttention(32, 4, causal=True).eval()
        causal.load_state_dict(mha.state_dict())
        eq_causal = (causal(x)[:, perm] - causal(x[:, perm])).abs().max().item()
        inv_causal = (causal(x).mean(1) - causal(x[:, perm]).mean(1)).abs().max().item()
    ok = eq < 1e-5 and inv < 1e-5 and eq_pe > 1e-2 and inv_pe > 1e-3
    return Result(
        f"without PE: max |f(Px) − Pf(x)| = {eq:.1e}, pooled difference {inv:.1e}; with sinusoidal PE: "
        f"{eq_pe:.3f} and {inv_pe:.3f}",
        ok,
        "differences below 1e-5 without PE; above 1e-2 (equivariance) and 1e-3 (pooled) with PE",
        control=Control(
            "the same attention with a causal mask, still without PE (the mask itself carries order)",
            f"max |f(Px) − Pf(x)| = {eq_causal:.3f}, pooled difference {inv_causal:.3f}",
            eq_causal < 1e-5 and inv_causal < 1e-5,
        ),
    )


def _requirements(encode) -> dict[str, tuple[bool, float]]:
    """The three requirements on a position code, measured on ``encode(n) -> (n, d)``, the code
    of positions 0..n-1 for a sequence of n tokens: {requirement: (met, the number that judged it)}."""
    long = encode(4096).double()
    short = encode(64).double()
    # unique: the closest two of 4,096 positions are distinct codes
    closest = (torch.cdist(long, long) + torch.eye(len(long), dtype=long.dtype) * 1e9).min().item()
    largest = long.abs().max().item()  # bounded: entries do not grow with the position
    drift = (long[:64] - short).abs().max().item()  # consistent: position p keeps its code at every length
    return {
        "unique (the closest two of 4,096 codes more than 1e-6 apart)": (closest > 1e-6, closest),
        "bounded (largest entry up to position 4,095 ≤ 1)": (largest <= 1.0, largest),
        "consistent across lengths (positions 0-63 coded alike in 64 and 4,096 tokens)": (drift < 1e-9, drift),
    }


@claim("pe-requirements")
def pe_requirements(ctx: Context) -> Result:
    from ..position import sinusoidal_encoding

    d = 64
    codes = {
        "sinusoidal": lambda n: sinusoidal_encoding(n, d),
        "raw index p": lambda n: torch.arange(n, dtype=torch.float64)[:, None].expand(n, d),
        "p / (n − 1)": lambda n: (torch.arange(n, dtype=torch.float64) / max(n - 1, 1))[:, None].expand(n, d),
    }
    judged = {name: _requirements(encode) for name, encode in codes.items()}
    rows = [[name, *(f"{'yes' if ok else 'no'} ({v:.3g})" for ok, v in r.values())] for name, r in judged.items()]
    met = {name: all(ok for ok, _ in r.values()) for name, r in judged.items()}
    failed = {
        name: [req.split(" (")[0] for req, (ok, _) in r.items() if not ok]
        for name, r in judged.items()
        if name != "sinusoidal"
    }
    return Result(
        "sinusoidal (d = 64): "
        + ", ".join(f"{req.split(' (')[0]} {v:.3g}" for req, (_, v) in judged["sinusoidal"].items())
        + "; the naive codes fail: "
        + "; ".join(f"{name}: {', '.join(f) or 'none'}" for name, f in failed.items()),
        met["sinusoidal"],
        "the sinusoidal code meets all three: " + "; ".join(judged["sinusoidal"]),
        table=markdown_table(["code", *(req.split(" (")[0] for req in judged["sinusoidal"])], rows),
        control=Control(
            "the lecture's naive codes: the raw index and the index divided by the length",
            "; ".join(f"{name} fails {', '.join(f) or 'nothing'}" for name, f in failed.items()),
            any(met[name] for name in failed),
        ),
    )


def _offset_fit(pe: torch.Tensor, offsets=(1, 5, 20, 50)) -> tuple[float, float, list]:
    """(largest residual of the least-squares M_k with PE(pos) M_k ≈ PE(pos + k), largest spread of
    PE(pos)·PE(pos + k) across pos, table rows) over ``offsets``; ``pe``: (positions, d) float64."""
    n = len(pe)
    worst_fit, worst_spread, rows = 0.0, 0.0, []
    for k in offsets:
        a, b = pe[: n - k], pe[k:]
        m = torch.linalg.lstsq(a, b).solution  # least-squares M_k with a M_k ≈ b
        fit = (a @ m - b).abs().max().item()
        dots = (a * b).sum(-1)
        spread = (dots.max() - dots.min()).item()
        worst_fit, worst_spread = max(worst_fit, fit), max(worst_spread, spread)
        rows.append([k, fit, dots.mean().item(), spread])
    return worst_fit, worst_spread, rows


@claim("sinusoidal")
def sinusoidal(ctx: Context) -> Result:
    from ..position import sinusoidal_encoding

    pe = sinusoidal_encoding(256, 64).double()
    worst_fit, worst_spread, rows = _offset_fit(pe)
    # the control: a random table of the same shape and scale (what a learned table starts as)
    table = torch.randn(256, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64) / 2**0.5
    control_fit, control_spread, _ = _offset_fit(table)
    dist = torch.stack([(pe[:192] * pe[k : 192 + k]).sum(-1).mean() for k in range(64)])
    fig, (heat, ax) = plt.subplots(
        1, 2, figsize=(10, 3.2), dpi=100, gridspec_kw={"width_ratios": [1.4, 1], "wspace": 0.5}
    )
    # the lecture's picture: 50 positions of a 128-dimensional encoding, one row per position
    shown = heat.imshow(sinusoidal_encoding(50, 128).numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
    heat.set_xlabel("dimension i (sin at even i, cos at odd i)")
    heat.set_ylabel("position")
    heat.set_title("PE, 50 positions × 128 dimensions", fontsize=9)
    fig.colorbar(shown, ax=heat, fraction=0.04, label="PE value")
    ax.plot(range(64), dist.numpy())
    ax.set_xlabel("offset k")
    ax.set_ylabel("PE(pos)·PE(pos+k)")
    ax.set_title("the dot product depends on the offset alone", fontsize=9)
    save_figure(fig, ctx.out / "sinusoidal.png")
    ok = worst_fit < 1e-6 and worst_spread < 1e-6
    return Result(
        f"largest residual of PE(pos+k) − PE(pos) M_k over all pos: {worst_fit:.1e}; largest spread of "
        f"PE(pos)·PE(pos+k) across pos: {worst_spread:.1e}",
        ok,
        "both below 1e-6 for k = 1, 5, 20, 50 (d = 64, 256 positions)",
        "sinusoidal.png",
        markdown_table(["k", "fit residual", "mean dot", "dot spread"], rows),
        control=Control(
            "a random position table of the same shape (entries of std 1/√2, as the sinusoids')",
            f"largest residual {control_fit:.2f}, largest dot spread {control_spread:.1f}",
            control_fit < 1e-6 and control_spread < 1e-6,
        ),
    )


def length_criterion(losses: dict, untrained: dict, good: tuple[str, ...], bad: tuple[str, ...]) -> bool:
    """The length criterion on each encoding's losses at 64 … 512 tokens (``losses``: encoding ->
    [loss per length], the first at the trained 64): every ``good`` one's loss at 512 within 0.1 of
    its own at 64, and every ``bad`` one's rising by more than 0.1 beyond the good ones' changes; each
    of them trained, its loss at 64 at least 0.5 below an untrained model's (``untrained``: encoding
    -> loss at 64), so that a model that learned nothing, whose loss is flat at every length, fails."""
    change = {p: ys[-1] - ys[0] for p, ys in losses.items()}
    trained = all(untrained[p] - losses[p][0] >= 0.5 for p in (*good, *bad))
    flat = all(change[p] <= 0.1 for p in good)
    return trained and flat and all(change[p] > max(change[g] for g in good) + 0.1 for p in bad)


LENGTHS = [64, 128, 256, 512]
LENGTH_ENCODINGS = ("learned", "sinusoidal", "rope", "alibi", "relative")


def length_losses(ctx: Context) -> tuple[list[dict], list[dict], int]:
    """(per seed, encoding -> [loss at each of LENGTHS]; the same for the untrained models; steps):
    one GPT per encoding and seed (its initial weights and batches) built for 512 positions and
    trained on 64-token windows (once per report), each length predicting the same 8 spans of 64
    validation tokens with more preceding context."""
    from ..models import GPT

    def measure():
        steps = ctx.steps(*LENGTH_STEPS)
        data = corpus(ctx)
        ends = spread_ends(len(data.val), max(LENGTHS), 8)  # 8 fixed target spans
        runs, nulls = [], []
        for seed in seeds_for(ctx):
            losses, untrained = {}, {}
            for pos in LENGTH_ENCODINGS:
                # built for 512 positions and trained on 64: the learned table's rows past 63 never receive
                # a gradient, so reading a longer input asks it about positions it never learned
                model, data = length_gpt(ctx, pos, seed)
                losses[pos] = [loss_at(model, data, n, ends) for n in LENGTHS]
                torch.manual_seed(seed)  # the untrained model: the criterion's "trained" guard
                null = GPT(model.config).eval()
                untrained[pos] = [loss_at(null, data, n, ends) for n in LENGTHS]
            runs.append(losses)
            nulls.append(untrained)
        return runs, nulls, steps

    return ctx.cached("length_losses", measure)


def length_verdicts(
    runs: list[dict], nulls: list[dict], good: tuple[str, ...], bad: tuple[str, ...], stand_in: str = "learned"
):
    """The length criterion judged seed by seed, each seed's models against its own untrained ones:
    (passed, verdict or None) as :func:`seeds_verdict` gives them, and whether the control holds in
    every seed: the same criterion with ``stand_in``, an encoding that should not extrapolate, in
    the place of the ``good`` ones (and nothing judged as bad). The control goes through the claim's
    own measurement on trained models: it clears when the stand-in's loss stays flat too (the
    criterion then cannot tell an encoding that extrapolates from one that does not), where
    untrained models could never clear the criterion's "trained" guard."""

    def per_seed(good: tuple[str, ...], bad: tuple[str, ...]) -> list[bool]:
        return [length_criterion(m, {p: ys[0] for p, ys in null.items()}, good, bad) for m, null in zip(runs, nulls)]

    passed, verdict = seeds_verdict(per_seed(good, bad))
    return passed, verdict, all(per_seed((stand_in,), ()))


def mean_over_seeds(runs: list[dict]) -> dict:
    """encoding -> [mean loss over seeds at each of LENGTHS]."""
    return {p: list(np.mean([r[p] for r in runs], axis=0)) for p in runs[0]}


def change_of(runs: list[dict], pos: str) -> str:
    """An encoding's change from 64 to 512 tokens: its mean over seeds and, with several, the range."""
    changes = [r[pos][-1] - r[pos][0] for r in runs]
    spread = f" [{min(changes):+.2f}, {max(changes):+.2f}]" if len(changes) > 1 else ""
    return f"{np.mean(changes):+.2f}{spread}"


def change_words(runs: list[dict], encodings) -> str:
    return ", ".join(f"{p} {change_of(runs, p)}" for p in encodings)


def length_figure(ctx: Context, runs: list[dict]) -> None:
    fig, ax = plt.subplots(figsize=(5.2, 3.4), dpi=100, layout="constrained")
    for pos, ys in mean_over_seeds(runs).items():
        line = ax.plot(LENGTHS, ys, "o-", label=pos)[0]
        for r in runs if len(runs) > 1 else ():  # every seed, when there are several
            ax.plot(LENGTHS, r[pos], ".", color=line.get_color(), ms=3)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("window length (trained at 64); the same 8 x 64 targets")
    ax.set_ylabel("loss on the last 64 tokens")
    ax.set_title("loss as the input grows past the trained 64 tokens", fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, ctx.out / "length.png")


@claim("length")
def length(ctx: Context) -> Result:
    runs, nulls, steps = length_losses(ctx)
    length_figure(ctx, runs)
    mean = mean_over_seeds(runs)
    rows = [[pos, *ys] for pos, ys in mean.items()]
    # each encoding judged on its own change from the trained length (a model worse everywhere is not
    # thereby worse at length), seed by seed; the null: the same models untrained, by the same criterion
    # (flat at every length, having learned nothing: a criterion that only asked for flat losses would pass them)
    judged = ("alibi", "relative"), ("learned",)
    ok, verdict, null = length_verdicts(runs, nulls, *judged)
    shown = ", ".join(f"{p} {v[0]:.2f} → {v[-1]:.2f}" for p, v in mean.items())
    return Result(
        f"loss at 64 → 512 tokens (means over {len(runs)} seed(s)): {shown}; change from the trained length "
        "(mean [range over seeds]): " + change_words(runs, mean),
        ok,
        "in every seed's models (INCONCLUSIVE when the seeds disagree): ALiBi's and relative positions' (Shaw, clipped at 16) loss at 512 within 0.1 of "
        "their own loss at 64, and learned positions' rising by more than 0.1 beyond both; each trained (its loss "
        "at 64 at least 0.5 below the untrained model's). Sinusoids and RoPE are not judged here: the deck's own "
        "statement about sinusoids is the `sinusoid-length` claim",
        "length.png",
        markdown_table(["positions (mean over seeds)", *map(str, LENGTHS)], rows),
        note=f"2-layer 64-wide GPTs built for 512 positions, {steps} steps of 64-token windows, one per encoding "
        "and seed. Every length predicts the same 8 spans of 64 validation tokens, with more preceding context as "
        "the window grows. The learned table's rows 64-511 never trained (a model whose table holds only 64 rows "
        "refuses a longer input outright: `sequence of 128 tokens is longer than the model's context`)"
        + seeds_note(ctx),
        control=Control(
            "learned positions, which should not extrapolate, judged in ALiBi's and relative's place (flat within "
            "0.1 and trained), by the same criterion on the same models",
            f"learned positions' change from 64 to 512 tokens {change_of(runs, 'learned')}; the untrained models' "
            "(the criterion's guard): " + change_words(nulls, (*judged[0], *judged[1])),
            null,
        ),
        verdict=verdict,
    )


@claim("sinusoid-length")
def sinusoid_length(ctx: Context) -> Result:
    runs, nulls, steps = length_losses(ctx)
    ok, verdict, null = length_verdicts(runs, nulls, ("sinusoidal",), ())
    ys = mean_over_seeds(runs)["sinusoidal"]
    return Result(
        f"sinusoidal positions' loss at 64, 128, 256, 512 tokens (means over {len(runs)} seed(s)): "
        + ", ".join(f"{v:.2f}" for v in ys)
        + f" (change {change_of(runs, 'sinusoidal')}; ALiBi's {change_of(runs, 'alibi')} on the same targets)",
        ok,
        "in every seed's model (INCONCLUSIVE when the seeds disagree): the sinusoidal model's loss at 512 tokens within 0.1 of its loss at the trained 64, "
        "having trained (its loss at 64 at least 0.5 below the untrained model's)",
        "length.png",
        note=f"The `length` claim's sinusoidal GPTs (2 layers, 64 wide, built for 512 positions, {steps} steps of "
        "64-token windows, one per seed) on the same 8 spans of validation tokens. Sinusoids give every position a "
        "code, but the layers only ever saw the codes of positions 0-63: the deck's desirable property is a "
        "property of the code, and whether a trained model reads the unseen codes is what this measures"
        + seeds_note(ctx),
        control=Control(
            "learned positions, which should not extrapolate, judged in the sinusoids' place (flat within 0.1 and "
            "trained), by the same criterion on the same models",
            f"learned positions' change {change_of(runs, 'learned')} (the untrained sinusoidal models': "
            f"{change_of(nulls, 'sinusoidal')})",
            null,
        ),
        verdict=verdict,
    )


CONCAT_POSITION_DIMS = 16  # (add-concat: a quarter of the 64-wide stream for the positions, ample for 64 of them)


@claim("add-concat")
def add_concat(ctx: Context) -> Result:
    steps = ctx.steps(20, 120, 1500)
    seeds = seeds_for(ctx)
    # the same 64-wide stream: added, tokens and positions share all 64 dims; concatenated, the tokens
    # get 48 and the positions 16 of their own (untied heads on both: the 48-wide table cannot be one)
    added = {"pos": "learned", "tie_output": False}
    concatenated = {**added, "pos_combine": "concat", "pos_dim": CONCAT_POSITION_DIMS}
    losses, params, windows = gpt_losses(ctx, {"add": added, "concat": concatenated}, steps, seeds)
    add, concat = np.array(losses["add"]), np.array(losses["concat"])
    loss_bars(losses, ctx.out / "add_concat.png", "learned positions: added or concatenated")
    # the A/A run: the added model again, its initial weights from other seeds and its batches the claim's
    # own: its spread is the floor of the seeds' (an equivalence is not judged more finely than that)
    again, _, again_windows = gpt_losses(ctx, {"add": added}, steps, seeds, init_seeds=aa_seeds(seeds, "add-concat"))
    floor = aa_spread(again_windows["add"] - windows["add"])
    passed, verdict, interval = same_verdict(
        concat - add, 0.03, "concatenated loss − added loss", items=windows["concat"] - windows["add"], floor=floor
    )
    # the control: a model known to be worse, the added one trained half the steps, must not count as
    # "working as well" (else the margin and seeds could not see a real gap)
    half, _, half_windows = gpt_losses(ctx, {"add, half the steps": added}, max(1, steps // 2), seeds)
    control_passed, control_verdict, control_words = same_verdict(
        np.array(half["add, half the steps"]) - add, 0.03, "half-trained loss − added loss",
        items=half_windows["add, half the steps"] - windows["add"], floor=floor,
    )  # fmt: skip
    return Result(
        f"validation loss after {steps} steps (means over {len(seeds)} seed(s)): added {add.mean():.3f}, "
        f"concatenated {concat.mean():.3f}; {interval}",
        passed,
        "the 95 % interval (over seeds and validation windows) of the paired loss difference (concatenated − added) "
        "inside ±0.03",
        "add_concat.png",
        markdown_table(
            ["positions", "parameters", "validation loss (mean)"],
            [[n, params[n], float(np.mean(losses[n]))] for n in params],
        ),
        note="2-layer GPTs with a 64-wide stream, learned positions and untied output heads. Added: x = E(token) + "
        f"P(pos), both 64 wide. Concatenated (`--pos-combine concat --pos-dim {CONCAT_POSITION_DIMS}`): x = "
        f"[E(token); P(pos)], {64 - CONCAT_POSITION_DIMS} + {CONCAT_POSITION_DIMS} wide, each in dimensions of "
        "its own" + seeds_note(ctx),
        verdict=verdict,
        control=Control(
            f"the added model trained {max(1, steps // 2)} steps", control_words, control_passed, control_verdict
        ),
    )
