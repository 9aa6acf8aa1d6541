"""Claims of the attention lecture: the worked example, masks, why √d_k (computed and in
training), attention as a soft dictionary lookup, Table 1's costs, attention's N × M memory, and
why three projections."""

from __future__ import annotations

import math

import numpy as np
import torch

from ..figures import ticks_at
from ..inspect.plots import plt, save_figure
from .registry import Context, Control, Result, claim, markdown_table
from ..training.callbacks import quarter_steps
from .runs import (
    LOSS_WINDOWS,
    EntropyCurve,
    corpus,
    gpt_losses,
    loss_bars,
    parameter_matched,
    spread_ends,
    train_gpt,
    window_losses,
)
from .stats import aa_control, aa_seeds, aa_spread, better_verdict, parts_verdict, seeds_for, seeds_note


# ---- 1-5: attention and positions, computed --------------------------------------------------------
@claim("worked-example")
def worked_example(ctx: Context) -> Result:
    from ..attention import scaled_dot_product_attention

    q = torch.ones(1, 1, 3, dtype=torch.float64)
    k = torch.tensor([[[34.0, 34.0, 34.0], [33.0, 33.0, 33.0]]], dtype=torch.float64)  # q·k = 102, 99
    v = torch.eye(2, dtype=torch.float64)[None]

    def judged(scale: float | None) -> tuple[bool, torch.Tensor, torch.Tensor]:
        _, w = scaled_dot_product_attention(q, k, v, return_weights=True, scale=scale)
        scores = (q @ k.transpose(-1, -2))[0, 0] * (1 / math.sqrt(3) if scale is None else scale)
        w = w[0, 0]
        ok = abs(scores[0] - 58.9) < 0.05 and abs(scores[1] - 57.2) < 0.05 and abs(w[0] - 0.85) < 0.005
        return bool(ok), scores, w

    ok, scaled, w = judged(None)
    # the control: the same scores without the division by √d_k (weights 0.95 / 0.05)
    raw_ok, raw, w_raw = judged(1.0)
    return Result(
        f"scaled scores {scaled[0]:.2f} / {scaled[1]:.2f}, weights {w[0]:.3f} / {w[1]:.3f} "
        "(attnlab.attention.scaled_dot_product_attention)",
        ok,
        "scores within 0.05 of 58.9 / 57.2 and the first weight within 0.005 of 0.85",
        control=Control(
            "the same attention without dividing by √d_k",
            f"scores {raw[0]:.0f} / {raw[1]:.0f}, weights {w_raw[0]:.3f} / {w_raw[1]:.3f}",
            raw_ok,
        ),
    )


@claim("masks")
def masks(ctx: Context) -> Result:
    from ..attention import MultiHeadAttention

    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, causal=True)
    x = torch.randn(3, 10, 32)
    key_mask = torch.ones(3, 10, dtype=torch.bool)
    key_mask[1, 7:] = False  # the second sequence has 3 padding tokens
    future = torch.triu(torch.ones(10, 10, dtype=torch.bool), 1)

    def judged(w: torch.Tensor) -> tuple[bool, str]:  # w: (B, H, T, T)
        row_err = (w.sum(-1) - 1).abs().max().item()
        future_max = w[..., future].abs().max().item()
        pad_max = w[1, :, :, 7:].abs().max().item()
        words = (
            f"largest |row sum − 1| {row_err:.1e}; largest weight on a future position {future_max}; "
            f"on a padding position {pad_max}"
        )
        return row_err < 1e-6 and future_max == 0.0 and pad_max == 0.0, words

    _, w = mha(x, key_mask=key_mask, need_weights=True)
    ok, measured = judged(w)
    # the control: masking after the softmax (the masked weights zeroed, the rows not renormalised)
    unmasked = MultiHeadAttention(32, 4)  # the same weights, no mask inside the softmax
    unmasked.load_state_dict(mha.state_dict())
    _, w_all = unmasked(x, need_weights=True)
    allowed = ~future & key_mask[:, None, None, :]  # (B, 1, T, T)
    control_ok, control_measured = judged(w_all * allowed)
    return Result(
        measured,
        ok,
        "row sums within 1e-6 of 1, future and padding weights exactly 0",
        control=Control(
            "masking after the softmax (weights zeroed, rows not renormalised)", control_measured, control_ok
        ),
    )


def _lookup(keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """softmax(Q Kᵀ/√d) V for one dictionary: keys (n, d), values (n, d_v), queries (m, d) -> (m, d_v)."""
    from ..attention import scaled_dot_product_attention

    return scaled_dot_product_attention(queries[None], keys[None], values[None])[0]


@claim("soft-lookup")
def soft_lookup(ctx: Context) -> Result:
    g = torch.Generator().manual_seed(0)
    n, d = 8, 16
    keys = torch.nn.functional.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1)
    values = torch.randn(n, 4, generator=g, dtype=torch.float64)

    def error(out: torch.Tensor, want: torch.Tensor) -> float:  # relative, the worst query
        return ((out - want).norm(dim=-1) / want.norm(dim=-1)).max().item()

    sharpness = (0.0, 1.0, 4.0, 16.0, 64.0, 256.0)  # the query is β·k_i: β = 0 matches no key better than another
    rows = []
    for beta in sharpness:
        out = _lookup(keys, values, beta * keys)
        rows.append([beta, error(out, values), error(out, values.mean(0).expand_as(values))])
    hard, soft = rows[-1][1], rows[0][2]
    # the control: the exponent removed (weights proportional to the scores, rows normalised to sum 1): the
    # softmax's exponent is what turns similarity into a lookup
    scores = 256.0 * keys @ keys.T / d**0.5
    linear = (scores / scores.sum(-1, keepdim=True)) @ values
    linear_error = error(linear, values)
    return Result(
        f"query β·k_i against 8 keys: at β = 256 the output is v_i to {hard:.1e} (relative, worst of the 8); at β = 0 "
        f"it is the mean of the values to {soft:.1e}; in between it moves from one to the other (table)",
        hard < 1e-3 and soft < 1e-12,
        "each of the 8 sharp queries (β = 256) returns its own key's value to 1e-3; a query that matches no key "
        "better than another (β = 0) returns the mean of the values",
        table=markdown_table(["β", "error to own value", "error to the mean"], rows),
        control=Control(
            "the same sharp queries with weights proportional to the scores (rows normalised, no exponent)",
            f"error to the own value {linear_error:.2f}",
            linear_error < 1e-3,
        ),
        note="8 unit keys and 8 values of 4 components, float64, attnlab.attention.scaled_dot_product_attention",
    )


def _softmax_row(d: int, t: int, component_std: float = 1.0) -> list:
    """[d, entropy raw, entropy scaled, grad softmax raw, scaled, grad q raw, scaled] for 256
    random queries against ``t`` random keys of ``d`` components of std ``component_std``."""
    k = torch.randn(256, t, d) * component_std
    q0 = torch.randn(256, 1, d) * component_std
    upstream = torch.randn(256, t)  # a random gradient arriving at the weights
    out = {}
    for name, factor in (("raw", 1.0), ("scaled", 1 / math.sqrt(d))):
        q = q0.clone().requires_grad_(True)
        s = (q @ k.transpose(-1, -2))[:, 0] * factor  # (256, T): the softmax's input
        s.retain_grad()
        p = s.softmax(-1)
        entropy = -(p * p.clamp_min(1e-30).log()).sum(-1).mean().item()
        (p * upstream).sum().backward()
        # medians over the queries (a mean follows the few unsaturated ones): the gradient through the
        # softmax (its Jacobian, what saturation starves) and what reaches q (√d_k larger unscaled)
        out[name] = (entropy, s.grad.norm(dim=-1).median().item(), q.grad.flatten(1).norm(dim=-1).median().item())
    return [d, out["raw"][0], out["scaled"][0], out["raw"][1], out["scaled"][1], out["raw"][2], out["scaled"][2]]


SATURATED = 0.10  # a saturated softmax: its mean entropy below this fraction of log T (scaling, scaling-convergence)


def _saturates(rows: list, t: int) -> bool:
    """The criterion on the rows of :func:`_softmax_row`, one per d_k from the smallest to the largest:
    as d_k grows the raw softmax's entropy falls at every doubling and ends saturated (below
    ``SATURATED`` of log T), and the gradient that reaches the query through it, against the scaled
    softmax's, falls and ends below it (the raw scores' √d_k larger factor no longer makes up for a
    near one-hot softmax: vanishing); the scaled softmax stays well spread (above half of log T) and
    flat (within 0.5 nats) at every d_k. No bar is set on the size of the gradient's fall: it is
    judged against the scaled softmax's own."""
    raw, scaled = [r[1] for r in rows], [r[2] for r in rows]
    ratio = [r[5] / r[6] for r in rows]  # what reaches the query, raw over scaled
    return (
        all(b < a for a, b in zip(raw, raw[1:]))
        and raw[-1] < SATURATED * math.log(t)
        and ratio[-1] < min(1.0, ratio[0])
        and min(scaled) > 0.5 * math.log(t)
        and max(scaled) - min(scaled) < 0.5
    )


@claim("scaling")
def scaling(ctx: Context) -> Result:
    torch.manual_seed(0)
    dims = [16, 32, 64, 128, 256, 512, 1024]
    t = 64
    rows = [_softmax_row(d, t) for d in dims]
    # the control: components of std d^(-1/4), so the dot products have variance 1 at every d_k (the premise
    # "variance d_k" made false): the raw softmax then does not saturate
    control = [_softmax_row(d, t, d**-0.25) for d in dims]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2), dpi=100, layout="constrained")
    panels = (
        ("softmax entropy (nats)", 1, f"the softmax's entropy over {t} keys"),
        ("gradient norm w.r.t. the scores", 3, "its gradient"),
    )
    for j, (label, col, title) in enumerate(panels):
        axes[j].plot(dims, [r[col] for r in rows], "o-", label="QKᵀ")
        axes[j].plot(dims, [r[col + 1] for r in rows], "o-", label="QKᵀ/√d_k")
        axes[j].set_xscale("log", base=2)
        axes[j].set_xlabel("d_k (head width)")
        axes[j].set_ylabel(label)
        axes[j].set_title(title, fontsize=9)
        axes[j].legend(fontsize=8)
    axes[0].axhline(math.log(t), color="gray", lw=0.8, ls="--", label="uniform")  # its largest value, log T
    axes[0].legend(fontsize=8)
    save_figure(fig, ctx.out / "scaling.png")
    raw_1024, scaled_1024 = rows[-1][1], rows[-1][2]
    return Result(
        f"at d_k = 1024 the raw softmax has entropy {raw_1024:.2f} nats (uniform: {math.log(t):.2f}), the "
        f"scaled one {scaled_1024:.2f}; median over the queries of the gradient through the softmax (w.r.t. its "
        f"input) {rows[-1][3]:.2e} raw vs {rows[-1][4]:.2e} scaled, and of what reaches the query (where the "
        f"unscaled scores' √d_k comes back) {rows[-1][5]:.2e} raw vs {rows[-1][6]:.2e} scaled; from d_k = "
        f"{dims[0]} up, the raw entropy " + " → ".join(f"{r[1]:.2f}" for r in rows) + " nats and the query's "
        "gradient, raw over scaled, " + " → ".join(f"{r[5] / r[6]:.2g}" for r in rows),
        _saturates(rows, t),
        f"as d_k grows from {dims[0]} to {dims[-1]}: the raw softmax's entropy falls at every doubling and ends below "
        f"{SATURATED:g} of log T (saturated); the median gradient that reaches the query, raw over scaled, falls "
        "and ends below 1 (vanishing: a near one-hot softmax passes back less than the scaled one, though the raw "
        "scores carry a √d_k times larger factor to q); the scaled softmax's entropy above 50 % of log T and "
        "within 0.5 nats at every d_k. Medians, since a mean follows the few queries that do not saturate",
        "scaling.png",
        markdown_table(
            [
                "d_k",
                "entropy raw",
                "entropy scaled",
                "grad softmax raw",
                "grad softmax scaled",
                "grad q raw",
                "grad q scaled",
            ],
            rows,
        ),  # fmt: skip
        note="The criterion reads the trend over d_k, as the statement does, and sets no bar on the gradient's "
        "size: until issue 66 it judged d_k = 1024 alone against a tenth of the scaled gradient, a bar set with "
        "the value (1.8 %) known",
        control=Control(
            "keys and queries whose dot products have variance 1 at every d_k (components of std d_k^(-1/4))",
            f"raw entropy {control[0][1]:.2f} → {control[-1][1]:.2f} nats from d_k = {dims[0]} to {dims[-1]}, "
            f"median gradient reaching the query, raw over scaled, {control[0][5] / control[0][6]:.2f} → "
            f"{control[-1][5] / control[-1][6]:.2f}",
            _saturates(control, t),
        ),
    )


WINDOW = 16  # the restricted self-attention row's r
KERNEL = 3  # the convolution row's k
TABLE1_KINDS = (
    "self-attention",
    f"restricted self-attention (r = {WINDOW})",
    "recurrent",
    f"convolution (k = {KERNEL})",
)


POSITION_WISE = "position-wise linear"  # the table's null: a layer with no path between positions
SA_LONG_N = 2048  # table1: a length far above d, where self-attention's n²·d term shows its exponent in d


def _flops(fn) -> int:
    """FLOPs of ``fn()``, counted by torch.utils.flop_counter (attention through the math kernel,
    whose matrix products it can count; the fused CPU kernel is invisible to it)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        fn()
    return counter.get_total_flops()


def _layer(kind: str, d: int):
    """One layer of ``kind`` as a function (B, n, d) -> (B, n, d)."""
    from ..attention import MultiHeadAttention

    if kind.startswith("self-attention"):
        return MultiHeadAttention(d, 1)
    if kind.startswith("restricted"):
        return MultiHeadAttention(d, 1, window=WINDOW)  # the block-by-block path (attention.local_attention)
    if kind == "recurrent":
        w_x, w_h = torch.randn(d, d) / math.sqrt(d), torch.randn(d, d) / math.sqrt(d)

        def rnn(x):  # h_t = tanh(x_t W_x + h_{t-1} W_h), one step after another
            h, rnn.states = torch.zeros(x.shape[0], d), []
            for t in range(x.shape[1]):
                h = torch.tanh(x[:, t] @ w_x + h @ w_h)
                rnn.states.append(h)  # (the hidden states, kept to measure the path through them)
            return torch.stack(rnn.states, 1)

        return rnn
    if kind == POSITION_WISE:  # the control's: no mixing across positions at all
        return torch.nn.Linear(d, d)
    conv = torch.nn.Conv1d(d, d, KERNEL, padding=KERNEL // 2)
    return lambda x: conv(x.transpose(1, 2)).transpose(1, 2)


def _depends(layer, n: int, d: int) -> np.ndarray:
    """(n, n) booleans from autograd: output position i depends on input position j."""
    x = torch.randn(1, n, d, requires_grad=True)
    out = layer(x)
    rows = []
    for i in range(n):
        (g,) = torch.autograd.grad(out[0, i].sum(), x, retain_graph=True)
        rows.append(g[0].abs().sum(-1) > 0)
    return torch.stack(rows).numpy()


def _longest_chain(out: torch.Tensor) -> int:
    """The longest chain of operations in ``out``'s autograd graph: the operations that must run
    one after another, however many cores there are."""
    memo: dict = {}

    def depth(fn) -> int:
        if fn is None:
            return 0
        if fn not in memo:
            memo[fn] = 1 + max((depth(child) for child, _ in fn.next_functions), default=0)
        return memo[fn]

    return depth(out.grad_fn)


def _path_and_sequence(kind: str, n: int, d: int = 8) -> tuple[int, float]:
    """Measured on the layer itself: (maximum path length: the states a signal from the first
    position passes to reach the last: the layers needed, from the dependency pattern autograd
    reports, times the hidden states it crosses inside a layer (a recurrent layer's h_t, through
    which its last output depends on its first input); sequential operations: how the longest
    chain of operations in one layer's graph grows from n/2 to n positions, × 1 = constant)."""
    torch.manual_seed(0)
    layer = _layer(kind, d)
    reach = _depends(layer, n, d).astype(np.int64)
    seen, layers = reach.copy(), 1
    while not seen[n - 1, 0] and layers < n:
        seen, layers = np.minimum(seen @ reach, 1), layers + 1
    crossed = 1
    states = getattr(layer, "states", None)
    if states is not None:  # a recurrent layer: its last output reaches back through every h_t
        x = torch.randn(1, n, d, requires_grad=True)
        out = layer(x)
        grads = torch.autograd.grad(out[0, -1].sum(), layer.states, allow_unused=True, retain_graph=True)
        crossed = sum(g is not None and bool(g.abs().sum() > 0) for g in grads)
    chains = [_longest_chain(layer(torch.randn(1, m, d, requires_grad=True))) for m in (n // 2, n)]
    return layers * crossed, chains[1] / chains[0]


def _dilated_path(n: int, d: int = 8) -> int:
    """The layers a signal needs from the first position to the last through a stack of causal
    convolutions of kernel k whose layer i is dilated k^i (ByteNet's and WaveNet's): after L layers
    each output sees the k^L - 1 positions before it, so ⌈log_k n⌉ of them (from autograd's
    dependency patterns, as :func:`_path_and_sequence` measures the others)."""
    torch.manual_seed(0)
    seen, layers = np.eye(n, dtype=np.int64), 0
    while not seen[n - 1, 0] and layers < n:
        dilation = KERNEL**layers
        conv = torch.nn.Conv1d(d, d, KERNEL, dilation=dilation, padding=(KERNEL - 1) * dilation)

        def causal(x, conv=conv):  # (B, n, d): output t sees inputs t - (k-1)·dilation … t
            return conv(x.transpose(1, 2))[..., :n].transpose(1, 2)

        seen, layers = np.minimum(_depends(causal, n, d).astype(np.int64) @ seen, 1), layers + 1
    return layers


def _table1_checks(
    sa, local, rnn, conv, m_sa, m_local, m_rnn, m_conv, p_dilated: int, sa_d_long: float, n_path: int
) -> dict[str, bool]:
    """Table 1's statements, each judged on the layer given for its row: ``sa`` … ``conv`` the fitted
    (exponent in n, exponent in d, FLOPs), ``m_*`` the (path length, chain growth) of that row's
    layer, ``p_dilated`` the dilated convolutions' path length and ``sa_d_long`` self-attention's
    exponent in d at a length far above d."""
    (p_sa, s_sa), (p_local, s_local), (p_rnn, s_rnn), (p_conv, s_conv) = m_sa, m_local, m_rnn, m_conv
    want_local, want_conv = math.ceil((n_path - 1) / WINDOW), math.ceil((n_path - 1) / (KERNEL // 2))
    want_dilated = math.ceil(math.log(n_path) / math.log(KERNEL) - 1e-9)
    return {
        "self-attention's exponent in n above 1.7": sa[0] > 1.7,
        f"self-attention ≈ 1 in d (0.9–1.2) at n = {SA_LONG_N}, where its n²·d term dominates": 0.9 < sa_d_long < 1.2,
        "restricted, recurrent and convolution ≈ 1 in n (0.9–1.2)": all(0.9 < f[0] < 1.2 for f in (local, rnn, conv)),
        "recurrent and convolution above 1.8 in d, restricted below that (its r·n·d term is linear in d)": rnn[1] > 1.8
        and conv[1] > 1.8
        and local[1] < 1.8,
        f"path lengths at n = {n_path}: 1, ⌈(n−1)/r⌉ = {want_local}, ≥ n−1, ⌈(n−1)/⌊k/2⌋⌉ = {want_conv}": (
            p_sa == 1 and p_local == want_local and p_rnn >= n_path - 1 and p_conv == want_conv
        ),
        f"dilated convolutions' path length ⌈log_k n⌉ = {want_dilated}": p_dilated == want_dilated,
        f"sequential operations: the longest chain of operations stays the same from n = {n_path // 2} to "
        f"{n_path} for attention, restricted and convolution (× 1.0) and doubles for recurrent (× 1.8 or more)": (
            max(s_sa, s_local, s_conv) < 1.05 and s_rnn >= 1.8
        ),
    }


@claim("table1")
def table1(ctx: Context) -> Result:
    ns, ds = [128, 256, 512, 1024], [32, 64, 128, 256]
    n_path = 64
    fit, measured = {}, {}
    for kind in (*TABLE1_KINDS, POSITION_WISE):
        by_n = [_flops(lambda: _layer(kind, 32)(torch.randn(1, n, 32))) for n in ns]
        by_d = [_flops(lambda: _layer(kind, d)(torch.randn(1, 256, d))) for d in ds]
        slope = lambda xs, ys: float(np.polyfit(np.log(xs), np.log(ys), 1)[0])  # noqa: E731
        fit[kind] = (slope(ns, by_n), slope(ds, by_d), by_n)
        measured[kind] = _path_and_sequence(kind, n_path)
    # self-attention's d-exponent where n ≫ d (at n = 256 its n·d² projections blur it), and the dilated
    # convolutions' path; the control's layer measured in both places
    d_long = [16, 32, 64]
    long_fit = lambda kind: float(np.polyfit(  # noqa: E731
        np.log(d_long), np.log([_flops(lambda: _layer(kind, d)(torch.randn(1, SA_LONG_N, d))) for d in d_long]), 1
    )[0])  # fmt: skip
    sa_d_long, null_d_long = long_fit(TABLE1_KINDS[0]), long_fit(POSITION_WISE)
    p_dilated = _dilated_path(n_path)
    # in n the self-attention FLOPs are n²·d + n·d² (projections): fit at d = 32 where n ≫ d
    rows = [
        [kind, f"{fit[kind][0]:.2f}", f"{fit[kind][1]:.2f}", measured[kind][0], f"× {measured[kind][1]:.2f}"]
        for kind in TABLE1_KINDS
    ]
    fig, ax = plt.subplots(figsize=(5, 3.4), dpi=100, layout="constrained")
    for kind in TABLE1_KINDS:
        ax.loglog(ns, fit[kind][2], "o-", label=kind)
    ticks_at(ax.xaxis, ns)  # (the lengths measured)
    ax.set_xlabel("sequence length n (d = 32)")
    ax.set_ylabel("FLOPs per layer")
    ax.set_title("FLOPs of one layer by sequence length", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, ctx.out / "table1.png")
    sa, local, rnn, conv = (fit[k] for k in TABLE1_KINDS)
    (p_sa, s_sa), (p_local, s_local), (p_rnn, s_rnn), (p_conv, s_conv) = (measured[k] for k in TABLE1_KINDS)
    checks = _table1_checks(
        *(fit[k] for k in TABLE1_KINDS), *(measured[k] for k in TABLE1_KINDS), p_dilated, sa_d_long, n_path
    )
    # the control, the mechanism removed: a position-wise linear layer (no path between positions) measured
    # in every row's place and judged by the same checks: a vacuous check would pass it
    null = _table1_checks(
        *[fit[POSITION_WISE]] * 4, *[measured[POSITION_WISE]] * 4, measured[POSITION_WISE][0], null_d_long, n_path
    )
    return Result(
        f"fitted exponents in n: self-attention {sa[0]:.2f}, restricted {local[0]:.2f}, recurrent {rnn[0]:.2f}, "
        f"convolution {conv[0]:.2f}; in d: {sa[1]:.2f}, {local[1]:.2f}, {rnn[1]:.2f}, {conv[1]:.2f} (FLOPs counted by "
        f"torch.utils.flop_counter), self-attention's in d at n = {SA_LONG_N} {sa_d_long:.2f}; at n = {n_path}, "
        f"maximum path length {p_sa}, {p_local}, {p_rnn}, {p_conv}, dilated convolutions {p_dilated}; "
        f"longest chain of operations from n = {n_path // 2} to {n_path}: × {s_sa:.2f}, × {s_local:.2f}, "
        f"× {s_rnn:.2f}, × {s_conv:.2f} (from the autograd graph)",
        all(checks.values()),
        "; ".join(checks),
        "table1.png",
        markdown_table(
            [
                "layer",
                "exponent in n",
                "exponent in d",
                f"max path length (n = {n_path})",
                f"sequential ops: chain n = {n_path // 2} → {n_path}",
            ],
            rows,
        ),
        note="Path length and sequential operations are measured on the layers: which input positions each "
        "output depends on (autograd) gives the layers a signal needs from the first position to the last, and "
        "inside the recurrent layer the signal also crosses every hidden state h_t; the longest chain of "
        "operations in the autograd graph (operations that must run one after another) is constant in n for "
        "attention and convolution and grows with n for the recurrence. The convolution row is a plain "
        "(contiguous) one, whose path is n/⌊k/2⌋ layers; the dilated case is a stack of causal convolutions "
        f"dilated 1, k, k², … (ByteNet's), measured the same way. Self-attention's exponent in d is fitted at "
        f"n = {SA_LONG_N} and d = 16-64, where its n²·d term dominates the n·d² of its projections.",
        control=Control(
            "the mechanism removed: a position-wise linear layer (no path between positions) measured in every "
            "row's place, by the same checks",
            f"exponents {fit[POSITION_WISE][0]:.2f} in n and {fit[POSITION_WISE][1]:.2f} in d, maximum path length "
            f"{measured[POSITION_WISE][0]} (never reaches), chain × {measured[POSITION_WISE][1]:.2f}: "
            f"{sum(null.values())} of {len(null)} checks hold",
            all(null.values()),
        ),
    )


def _largest_intermediate(fn) -> int:
    """The most elements any single tensor an aten operation produced while ``fn()`` ran: the
    peak working set of a layer, counted the same way on every machine."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Largest(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.most = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            sizes = [t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            self.most = max([self.most, *sizes])
            return out

    with Largest() as counter, torch.no_grad():
        fn()
    return counter.most


@claim("attention-memory")
def attention_memory(ctx: Context) -> Result:
    from ..attention import scaled_dot_product_attention

    d, heads = 32, 4

    def largest(n: int, m: int, fused: bool) -> int:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, heads, t, d, generator=g) for t in (n, m, m))
        # return_weights: the readable reference path, which forms P; otherwise the fused kernel
        return _largest_intermediate(lambda: scaled_dot_product_attention(q, k, v, return_weights=not fused))

    sizes = [256, 512, 1024, 2048]
    slope = lambda xs, ys: float(np.polyfit(np.log(xs), np.log(ys), 1)[0])  # noqa: E731
    fits, rows = {}, []
    for fused in (False, True):
        by_n = [largest(n, 512, fused) for n in sizes]  # queries grow, keys fixed
        by_m = [largest(512, m, fused) for m in sizes]  # keys grow, queries fixed
        by_t = [largest(t, t, fused) for t in sizes]  # self-attention: both grow
        fits[fused] = (slope(sizes, by_n), slope(sizes, by_m), slope(sizes, by_t))
        rows += [["fused kernel" if fused else "reference (forms P)", t, b] for t, b in zip(sizes, by_t)]

    def quadratic(f) -> bool:
        return 0.9 < f[0] < 1.1 and 0.9 < f[1] < 1.1 and 1.9 < f[2] < 2.1

    ref, fused = fits[False], fits[True]
    return Result(
        f"largest tensor of the attention layer (elements), fitted exponent in N {ref[0]:.2f}, in M {ref[1]:.2f}, "
        f"in T with N = M = T {ref[2]:.2f} (counted per aten operation; {heads} heads of {d})",
        quadratic(ref),
        "exponents ≈ 1 in N and in M (0.9–1.1) and ≈ 2 in T for self-attention (1.9–2.1)",
        table=markdown_table(["path", "T", "largest tensor (elements)"], rows),
        control=Control(
            "the fused kernel (torch's scaled_dot_product_attention, FlashAttention-style on the CPU), which never "
            "holds P",
            f"exponents {fused[0]:.2f} in N, {fused[1]:.2f} in M, {fused[2]:.2f} in T",
            quadratic(fused),
        ),
        note="The statement is about attention as written, P = softmax(QKᵀ/√d) held whole; a fused kernel computes "
        "the same output block by block, so its memory grows linearly: the time stays N × M, the memory does not.",
    )


@claim("three-projections")
def three_projections(ctx: Context) -> Result:
    steps = ctx.steps(20, 120, 1500)
    seeds = seeds_for(ctx)
    names = ("W_Q, W_K, W_V", "W_K = W_Q", "W_V = W_K")
    # each tie removes a projection per layer: its MLP is widened by as many weights, so that a tied
    # model is not worse only for being smaller
    ties = [parameter_matched(ctx, {"attn_tie": tie}, {}) for tie in ("qk", "kv")]
    losses, params, windows = gpt_losses(ctx, dict(zip(names, ({}, *ties))), steps, seeds)
    full, qk, kv = (np.array(losses[n]) for n in names)
    loss_bars(losses, ctx.out / "three_projections.png", "own or tied projections")
    # the A/A run: three projections again, its initial weights from other seeds and its batches the
    # claim's own (paired as the claim pairs its sides)
    again, _, again_windows = gpt_losses(
        ctx, {names[0]: {}}, steps, seeds, init_seeds=aa_seeds(seeds, "three-projections")
    )
    aa, aa_items = np.array(again[names[0]]) - full, again_windows[names[0]] - windows[names[0]]
    floor = aa_spread(aa)

    def judge(qk_diffs, kv_diffs, qk_items, kv_items):  # (the claim's criterion, and its A/A control's)
        parts = (
            better_verdict(qk_diffs, "loss difference (W_K = W_Q side − three projections)", items=qk_items,
                           floor=floor),
            better_verdict(kv_diffs, "loss difference (W_V = W_K side − three projections)", items=kv_items,
                           floor=floor),
        )  # fmt: skip
        return (*parts_verdict(parts), "; ".join(words for _, _, words in parts))

    base = windows[names[0]]
    passed, verdict, intervals = judge(qk - full, kv - full, windows[names[1]] - base, windows[names[2]] - base)
    return Result(
        f"validation loss after {steps} steps (means over {len(seeds)} seed(s)): three projections {full.mean():.3f}, "
        f"W_K = W_Q {qk.mean():.3f}, W_V = W_K {kv.mean():.3f}; {intervals}",
        passed,
        "for each tie, the 95 % interval (over seeds and validation windows) of the paired loss difference (tied − "
        "three projections) above 0, its seeds' spread at least the A/A run's",
        "three_projections.png",
        markdown_table(
            ["attention", "parameters", "validation loss (mean)"],
            [[n, params[n], float(np.mean(losses[n]))] for n in params],
        ),
        note="2-layer 64-wide GPTs with 4 heads and rotary positions, trained alike; parameter-matched: a tied "
        "model has one 64×64 projection per layer fewer, and its MLP is widened by as many weights (hidden "
        f"width {ties[0]['mlp_hidden']} with W_K = W_Q, {ties[1]['mlp_hidden']} with W_V = W_K, 256 untied). Loss on "
        f"{LOSS_WINDOWS} fixed windows of 64 validation tokens" + seeds_note(ctx),
        verdict=verdict,
        control=aa_control(judge(aa, aa, aa_items, aa_items)),
    )


@claim("scaling-convergence")
def scaling_convergence(ctx: Context) -> Result:
    steps = ctx.steps(5, 50, 1000)
    # (two even when tiny: its entropy curves are drawn over seeds; every trained claim's SEEDS at full size)
    seeds = (0, 1) if ctx.size != "full" else seeds_for(ctx)
    # one head of 256: d_k = 256. The premise needs scores large enough to saturate the softmax, which
    # the GPT's N(0, 0.02²) weights never give (unscaled scores of std ≈ 0.6). With W_Q and W_K drawn
    # from N(0, 1/256), q and k have entries of unit variance (their input is layer-normed, as the
    # paper's footnote 4 assumes): the unscaled scores have variance d_k = 256, the scaled ones 1. At
    # d_k = 128 the unscaled entropy starts near the premise's bar (0.09-0.13 of log T by seed): repeated
    # characters share their keys, which keeps some weight spread however large the scores.
    dim = 256
    qk_std = dim**-0.5
    data = corpus(ctx)
    ends = spread_ends(len(data.val), 64, LOSS_WINDOWS)
    val = np.asarray(data.val, dtype=np.int64)
    windows = torch.from_numpy(
        np.stack([val[e - 64 : e] for e in ends[:: LOSS_WINDOWS // 8]])
    )  # (8, 64): the entropy's
    arms = {"QKᵀ/√d_k": {}, "QKᵀ": {"attn_scale": 1.0}}

    def trained(arm: str, init_seeds=None) -> tuple[list[float], list[dict], np.ndarray]:
        """(loss per seed, entropy curve per seed, (seeds, windows) loss per window); ``init_seeds``:
        the initial weights' seeds of an A/A run (its batches the claim's seeds)."""
        losses, curves, items = [], [], []
        for i, seed in enumerate(seeds):  # each seed sets both arms' initial weights and batches alike
            curve = EntropyCurve(windows, quarter_steps(steps))
            model, _ = train_gpt(ctx, "rope", steps, context=64, seed=seed, heads=1, dim=dim, qk_std=qk_std,
                                 callbacks=[curve], init_seed=None if init_seeds is None else init_seeds[i],
                                 **arms[arm])  # fmt: skip
            items.append(window_losses(model, data, 64, ends))
            losses.append(float(items[-1].mean()))
            curves.append(curve.curve)
        return losses, curves, np.stack(items)

    runs = {arm: trained(arm) for arm in arms}
    scaled, raw = np.array(runs["QKᵀ/√d_k"][0]), np.array(runs["QKᵀ"][0])
    entropy = {arm: runs[arm][1] for arm in arms}
    start = {arm: float(np.mean([c[0] for c in entropy[arm]])) for arm in arms}
    end = {arm: float(np.mean([c[max(c)] for c in entropy[arm]])) for arm in arms}
    loss_bars(
        {arm: runs[arm][0] for arm in arms},
        ctx.out / "scaling_convergence.png",
        f"d_k = 256, W_Q, W_K ~ N(0, 1/256), {steps} steps, {len(seeds)} seeds; right: attention entropy / log T",
        curves=entropy,
    )

    # the A/A run: the scaled arm again, its initial weights from other seeds, its batches the claim's own
    again, _, again_items = trained("QKᵀ/√d_k", aa_seeds(seeds, "scaling-convergence"))
    floor = aa_spread(np.array(again) - scaled)

    def judge(diffs, items):  # (the claim's criterion, and its A/A control's)
        return better_verdict(diffs, "loss difference (the other side − scaled)", items=items, floor=floor)

    passed, verdict, interval = judge(raw - scaled, runs["QKᵀ"][2] - runs["QKᵀ/√d_k"][2])
    saturated = start["QKᵀ"] < SATURATED
    if not saturated:  # the mechanism the claim is about is absent: the losses say nothing of it
        passed, verdict = False, "INCONCLUSIVE"
    return Result(
        f"mean attention entropy (a fraction of log T, T = 64) at step 0: unscaled {start['QKᵀ']:.3f} "
        f"({'below' if saturated else 'not below'} the premise's {SATURATED}), scaled {start['QKᵀ/√d_k']:.3f}; "
        f"after {steps} steps {end['QKᵀ']:.3f} and {end['QKᵀ/√d_k']:.3f}. Validation loss (seeds "
        f"{', '.join(map(str, seeds))}): scaled {', '.join(f'{v:.3f}' for v in scaled)}, unscaled "
        f"{', '.join(f'{v:.3f}' for v in raw)}; {interval}",
        passed,
        f"the unscaled arm's softmax saturated at step 0 (mean entropy below {SATURATED} × log T), and the 95 % "
        "interval (over seeds and validation windows) of the paired loss difference (unscaled − scaled) above 0, its "
        "seeds' spread at least the A/A run's",
        "scaling_convergence.png",
        note="2-layer GPTs 256 wide with one head (d_k = 256) and rotary positions, W_Q and W_K drawn from "
        "N(0, 1/256) so that q and k have unit-variance entries (the GPT's own N(0, 0.02²) gives unscaled scores "
        "of std ≈ 0.6, which saturate nothing); each seed sets both models' initial weights and batches alike. "
        "The entropy is measured on 8 validation windows of 64 tokens before the first step and at each quarter "
        "of the run. The computed `scaling` claim shows the mechanism (entropy, gradients)",
        verdict=verdict,
        control=aa_control(judge(np.array(again) - scaled, again_items - runs["QKᵀ/√d_k"][2])),
    )
