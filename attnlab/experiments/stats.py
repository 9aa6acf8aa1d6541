"""Seeds and intervals for the comparative claims: each seed trains both sides alike (initial
weights and batches), and a claim is decided on the 95 % t-interval of the paired differences."""

from __future__ import annotations

import math
import zlib

import numpy as np

from .design import design
from .registry import Context, Control

# two-sided 95 % Student t quantiles by degrees of freedom (scipy is not a dependency)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
       20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
       29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}  # fmt: skip


def t95(df: float) -> float:
    """The two-sided 95 % Student t quantile at ``df`` degrees of freedom (not necessarily whole:
    Satterthwaite's), interpolated in 1/df between the table's entries (t is smooth in 1/df, and
    1.96 at 1/df = 0): within 0.5 % of the exact value from df = 3 on, and wider than it between
    the whole numbers below."""
    df = max(float(df), 1.0)
    known = sorted(T95)
    lo = max(k for k in known if k <= df)
    hi = min((k for k in known if k > df), default=math.inf)  # (beyond the table: 1.96 at df = ∞)
    if lo == df:
        return T95[lo]
    t_hi = T95.get(hi, 1.96)
    return T95[lo] + (1 / lo - 1 / df) / (1 / lo - 1 / hi) * (t_hi - T95[lo])


SEEDS = 5  # every trained claim's seeds at the full size: one number, fixed before any run (docs: the design)


def seeds_for(ctx: Context) -> tuple[int, ...]:
    """Seeds per side of a trained claim: its design's at full size (:data:`SEEDS` for every trained
    claim, never raised after a result is seen), two at --quick (and says so), one tiny."""
    ctx.sized = True
    full = design(ctx.claim)["seeds"] if ctx.claim is not None else SEEDS
    return {"tiny": (0,), "quick": (0, 1), "full": tuple(range(full))}[ctx.size]


def seed_suffix(seed: int) -> str:
    """A seed's run name suffix: '' for seed 0 (the default run), then "_s1", "_s2" …"""
    return f"_s{seed}" if seed else ""


def seeds_note(ctx: Context) -> str:
    return {"tiny": " (tiny: one seed, no interval)", "quick": " (--quick: two seeds)", "full": ""}[ctx.size]


def paired_interval(diffs, resolution: float = 0.0, items=None, floor: float = 0.0) -> tuple[float, float, float]:
    """(mean, low, high): the 95 % t-interval of the mean of paired differences (one per seed: each
    seed sets both models' initial weights and batches); (mean, nan, nan) for a single seed.
    ``resolution``: the measurement's step (1/N for an accuracy on N test items): the spread is
    taken as at least one step, since equal differences on a coarse scale (two seeds that both
    differ by 5 of 144 texts) say nothing about the noise being zero. ``items`` (seeds, N): each
    seed's difference item by item on a test set (``diffs`` its rows' means): the interval is then
    :func:`seeds_items_interval`'s, over seeds and test items at once. ``floor``: the standard
    deviation over seeds of the claim's A/A differences (:func:`aa_spread`), a floor on the seeds'
    spread: two configurations that differ cannot be told apart more finely than one configuration
    from itself (a few seeds that happen to agree closely would otherwise give a narrow interval)."""
    if items is not None:
        return seeds_items_interval(items, resolution, floor)
    d = np.asarray(diffs, dtype=float)
    if len(d) < 2:
        return float(d.mean()), float("nan"), float("nan")
    half = t95(len(d) - 1) * max(d.std(ddof=1), resolution, floor) / math.sqrt(len(d))
    return float(d.mean()), float(d.mean() - half), float(d.mean() + half)


def seeds_items_interval(items, resolution: float = 0.0, floor: float = 0.0) -> tuple[float, float, float]:
    """(mean, low, high): the 95 % interval of the mean of ``items`` (S seeds, N test items: each
    seed's paired difference on each item), with the seeds and the test items both random draws:
    d[s, i] = μ + a[s] + b[i] + e[s, i] (a seed × item mixed model, every seed scored on the same
    items). The mean's variance is σ_a²/S + σ_b²/N + σ_e²/(S N), each variance component from the
    two-way analysis of variance's mean squares (σ_a² = (MS_seeds − MS_residual) / N, σ_b² =
    (MS_items − MS_residual) / S, σ_e² = MS_residual) and at least 0; its degrees of freedom are
    Satterthwaite's. Adding the seeds' and the items' standard errors in quadrature, as before,
    counted the seed × item noise (e) twice. ``resolution`` and ``floor``: as for
    :func:`paired_interval`, floors on the seeds' spread (of their mean differences). One
    seed: the items alone (the seed's own noise unmeasured, so no interval: nan)."""
    d = np.asarray(items, dtype=float)
    seeds, n = d.shape
    mean = float(d.mean())
    if seeds < 2:
        return mean, float("nan"), float("nan")
    row, col = d.mean(1), d.mean(0)
    ms_seeds = n * row.var(ddof=1)
    ms_items = seeds * col.var(ddof=1) if n > 1 else 0.0
    residual = d - row[:, None] - col[None, :] + mean
    ms_error = (residual**2).sum() / ((seeds - 1) * (n - 1)) if n > 1 else 0.0
    # (the seeds' spread: at least one step of the measure, and at least the A/A run's)
    ms_seeds = max(ms_seeds, n * max(resolution, floor) ** 2)
    # the variance components, each at least 0: the seeds' σ_a² = (MS_s − MS_e) / N, the items' σ_b² =
    # (MS_i − MS_e) / S, the rest σ_e² = MS_e; S N Var(mean) = S N (σ_a²/S + σ_b²/N + σ_e²/(S N)) is then
    # a sum of the mean squares, each with a coefficient: {name: [mean square, coefficient, its dof]}
    terms = {
        "error": [ms_error, 1, (seeds - 1) * (n - 1)],
        "seeds": [ms_seeds, 0, seeds - 1],
        "items": [ms_items, 0, n - 1],
    }
    for part in ("seeds", "items"):
        if terms[part][0] > ms_error:
            terms[part][1] += 1
            terms["error"][1] -= 1
    combined = sum(ms * c for ms, c, _ in terms.values())
    if combined <= 0:  # (every difference the same: nothing varies)
        return mean, mean, mean
    df = combined**2 / sum((ms * c) ** 2 / dof for ms, c, dof in terms.values() if c and dof)  # Satterthwaite's
    half = t95(df) * math.sqrt(combined / (seeds * n))
    return mean, mean - half, mean + half


def better_verdict(
    diffs, what: str, unit: str = "seeds", resolution: float = 0.0, items=None, floor: float = 0.0
) -> tuple[bool, str | None, str]:
    """A "A is better than B" claim on paired differences ``diffs`` (B's loss − A's, per seed, or
    per ``unit``): PASS when the interval lies above 0, FAIL when it lies below, INCONCLUSIVE when
    it straddles 0 or there is one seed. Returns (passed, verdict or None, the interval in words);
    ``resolution``, ``items`` (which then gives the differences) and ``floor``: as for :func:`paired_interval`."""
    mean, low, high = paired_interval(diffs, resolution, items, floor)
    n = len(diffs) if items is None else len(items)
    if math.isnan(low):
        return False, "INCONCLUSIVE", f"{what}: {mean:+.3f} (one seed: no interval; the full size runs several)"
    words = f"{what}: {mean:+.3f}, 95 % interval [{low:+.3f}, {high:+.3f}] over {n} {unit}{items_words(items)}"
    if low > 0:
        return True, None, words
    return False, ("FAIL" if high < 0 else "INCONCLUSIVE"), words


def items_words(items) -> str:
    return "" if items is None else f" and the {np.shape(items)[1]} test items"


def same_verdict(
    diffs, margin: float, what: str, resolution: float = 0.0, items=None, *, floor: float
) -> tuple[bool, str | None, str]:
    """A "works as well" claim: PASS when the interval of the paired differences lies inside
    ±``margin``, FAIL when it lies wholly outside, else INCONCLUSIVE (``resolution`` and ``items``:
    as for :func:`paired_interval`). ``floor`` (:func:`aa_spread` of the claim's A/A run) is required,
    as an equivalence is easier to reach than a difference: seeds that happen to agree closely would
    give a narrow interval inside any margin, so the seeds' spread is taken as at least the spread of
    one configuration against itself."""
    mean, low, high = paired_interval(diffs, resolution, items, floor)
    n = len(diffs) if items is None else len(items)
    if math.isnan(low):
        return False, "INCONCLUSIVE", f"{what}: {mean:+.3f} (one seed: no interval; the full size runs several)"
    words = (
        f"{what}: {mean:+.3f}, 95 % interval [{low:+.3f}, {high:+.3f}] over {n} seeds{items_words(items)} "
        f"(margin ±{margin})"
    )
    if -margin <= low and high <= margin:
        return True, None, words
    return False, ("FAIL" if low > margin or high < -margin else "INCONCLUSIVE"), words


def seeds_verdict(holds, fails=None) -> tuple[bool, str | None]:
    """A criterion judged in every seed's own run (``holds``: per seed, whether it holds; ``fails``:
    whether it clearly fails, when a seed can also be undecided, as an interval straddling its bar;
    by default every seed where it does not hold): it passes when it holds in every seed, FAILs when
    it fails in every one, and is INCONCLUSIVE otherwise (seed noise straddles the bar). Returns
    (passed, verdict or None)."""
    holds = [bool(h) for h in holds]
    fails = [not h for h in holds] if fails is None else [bool(f) for f in fails]
    if all(holds):
        return True, None
    return False, ("FAIL" if all(fails) else "INCONCLUSIVE")


def parts_verdict(parts) -> tuple[bool, str | None]:
    """A statement judged part by part (each part a :func:`better_verdict` or :func:`same_verdict`
    answer): it passes when every part does; else FAIL when some part fails, INCONCLUSIVE when none
    fails but some cannot be decided."""
    verdicts = {v for _, v, _ in parts}
    if all(p for p, _, _ in parts):
        return True, None
    return False, "FAIL" if "FAIL" in verdicts else "INCONCLUSIVE"


FRACTIONS = ("¼", "½", "¾", "all")


def along_the_run(curves: dict, judge) -> str:
    """A budget-sensitive claim's verdict at a quarter, half, three quarters and all of its runs.
    ``curves``: {key: [one learning curve {step: value} per seed]}, each measured at the same four
    fractions of its run (:func:`attnlab.training.callbacks.quarter_steps`); ``judge({key: values
    per seed}) -> (passed, verdict or None)`` as the claim judges its final values. The schedule is
    the whole run's: a quarter of a run is not a run a quarter as long."""
    points = {k: [sorted(c) for c in cs] for k, cs in curves.items()}
    first = next(iter(points.values()))[0]
    shared = all(p == first for ps in points.values() for p in ps)  # every run the same length
    words = []
    for i, fraction in enumerate(FRACTIONS[-len(first) :]):
        at = {k: np.array([c[p[i]] for c, p in zip(cs, points[k])]) for k, cs in curves.items()}
        passed, verdict = judge(at)
        where = f"{fraction} ({first[i]} steps)" if shared else fraction
        words.append(f"{where}: {verdict or ('PASS' if passed else 'FAIL')}")
    return ", ".join(words)


AA_SEEDS = 1000  # an A/A run's seeds: the claim's own, each + 1000 + an offset drawn from the claim's name


def bootstrap_interval(statistic, n: int, reps: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """(the statistic on all n items, the 2.5th and the 97.5th percentile of it over ``reps``
    resamplings of the items with replacement): the sampling error of a measure taken on a test
    set. ``statistic(index)`` computes it on the items at ``index`` (an int64 array of length n)."""
    rng = np.random.default_rng(seed)
    values = [statistic(rng.integers(0, n, n)) for _ in range(reps)]
    low, high = np.percentile(values, [2.5, 97.5])
    return float(statistic(np.arange(n))), float(low), float(high)


def aa_seeds(seeds, claim: str) -> tuple[int, ...]:
    """The seeds of claim ``claim``'s A/A run: others than the claim's own, each + ``AA_SEEDS`` + an
    offset (a multiple of 10 below 1,000,000) from the claim's name, so that two claims that compare the
    same configuration draw A/A runs of their own (one shared draw would make their controls one
    control). A claim pairs them like its two sides: the A/A side takes these as its initial
    weights' seed and the claim's own seed for its batches, where the training allows both."""
    offset = zlib.crc32(claim.encode()) % 100_000 * 10
    return tuple(s + AA_SEEDS + offset for s in seeds)


def aa_spread(diffs) -> float:
    """The standard deviation over seeds of an A/A run's paired differences: the floor of the
    claim's own seeds' spread (``floor`` of :func:`paired_interval`); 0 with one seed."""
    d = np.asarray(diffs, dtype=float)
    if d.ndim == 2:  # (seeds, test items): each seed's mean difference
        d = d.mean(1)
    return float(d.std(ddof=1)) if len(d) > 1 else 0.0


PAIRED = "other initial weights (a draw of this claim's own) and the same batches"


def aa_control(judged: tuple[bool, str | None, str], pairing: str = PAIRED) -> Control:
    """The null control of an "A is better than B" claim: the claim's own criterion, applied to an A/A
    run (``judged``: what its judging function returned on the better side trained again with
    :func:`aa_seeds` against the better side itself, paired seed by seed as the claim pairs its two
    sides). Nothing differs but the seeds, so the control should fail; a criterion that clears it
    reads seed noise (or nothing at all), and the claim is INCONCLUSIVE. It can clear: an A/A
    interval lies above 0 by chance about once in forty runs, and every time for a vacuous criterion.
    ``pairing``: how its second side differs from the first (other initial weights and the same
    batches, or other seeds where one seed sets both)."""
    passed, verdict, words = judged
    return Control(
        f"an A/A run: the same configuration on both sides, the second with {pairing}", words, passed, verdict, "A/A"
    )
