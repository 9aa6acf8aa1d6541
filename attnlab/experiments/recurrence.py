"""Claims of the sequence-to-sequence lectures: the RNN bottleneck, and attention as alignment
(translation with reordering, and captioning)."""

from __future__ import annotations

import random

import numpy as np
import torch

from .registry import Context, Control, Result, claim, markdown_table
from .runs import fit, quietly, run_settings
from .stats import (
    aa_control,
    aa_spread,
    aa_seeds,
    along_the_run,
    better_verdict,
    bootstrap_interval,
    seed_suffix,
    seeds_for,
    seeds_note,
    seeds_verdict,
)


# ---- 8: the RNN bottleneck ---------------------------------------------------------------------------
@claim("bottleneck")
def bottleneck(ctx: Context) -> Result:
    from .bottleneck import plot, run

    steps, seeds = ctx.steps(10, 100, 1500), seeds_for(ctx)
    lengths = (5, 10, 20, 30) if ctx.size != "full" else (5, 10, 20, 30, 40)
    names = ("RNN (no attention)", "RNN + attention", "Transformer")
    short, long = lengths[0], lengths[-1]
    # each seed trains the three models (initial weights and batches) and is judged on its own
    res = [run(lengths, steps, 64, ctx.work / "bottleneck", small=ctx.size != "full", seed=s, **run_settings())
           for s in seeds]  # fmt: skip
    plot(res[0], ctx.out / "bottleneck.png")
    acc = [{n: r["accuracy"] for n, r in seed_res.items()} for seed_res in res]
    judged = [_bottleneck_checks(a, short, long, names[0], names[1:]) for a in acc]
    passed, verdict = seeds_verdict(ok for ok, _ in judged)

    def judge(at: dict) -> tuple[bool, str | None]:  # the criterion at one budget, per seed
        return seeds_verdict(
            _bottleneck_checks({n: at[n][i] for n in names}, short, long, names[0], names[1:])[0]
            for i in range(len(seeds))
        )

    budgets = along_the_run({n: [r[n]["curve"] for r in res] for n in names}, judge)
    # the control, the mechanism removed: each seed's RNN without attention judged against another seed's
    # RNN without attention in the attending models' place (the tiny size's one seed: a second run); it
    # must not hold up where attention does
    others = [run(lengths, steps, 64, ctx.work / "bottleneck", small=ctx.size != "full", only=names[:1], seed=aa_seeds(seeds, "bottleneck")[0],
                  **run_settings())[names[0]]["accuracy"]] if len(seeds) == 1 else [a[names[0]] for a in acc]  # fmt: skip
    nulls = [
        _bottleneck_checks({**a, "another": others[(i + 1) % len(others)]}, short, long, names[0], ("another",))[0]
        for i, a in enumerate(acc)
    ]
    null, _ = seeds_verdict(nulls)
    mean = {n: {x: float(np.mean([a[n][x] for a in acc])) for x in lengths} for n in names}
    return Result(
        f"sequence accuracy at length {short} → {long}, mean of {len(seeds)} seed(s): "
        + ", ".join(f"{k} {mean[k][short]:.2f} → {mean[k][long]:.2f}" for k in names)
        + "; "
        + "; ".join(f"seed {s}: " + ", ".join(words) for s, (_, words) in zip(seeds, judged))
        + f"; the verdict along the runs: {budgets}",
        passed,
        f"in every seed's models (INCONCLUSIVE when the seeds disagree): without attention, accuracy at length "
        f"{long} under half the RNN with attention's and lower than at length {short}; the RNN with attention and "
        f"the Transformer each at least 0.5 at length {short} and keep at least 80 % of it at length {long}",
        "bottleneck.png",
        markdown_table(
            ["seed", "model", *map(str, lengths)],
            [[s, n, *[a[n][x] for x in lengths]] for s, a in zip(seeds, acc) for n in names],
        ),
        note=f"reverse task, {steps} steps each, batch 64, 100 fresh sentences per length{seeds_note(ctx)}. The "
        "verdict is for this budget; it is also judged at a quarter, half and three quarters of each run (the "
        "figure's right panel, seed 0: accuracy at the longest length against steps), so a model that does not "
        "hold up yet can be told from one that never will",
        control=Control(
            "the mechanism removed: each seed's RNN without attention against another seed's RNN without attention "
            "in the attending models' place, by the same criterion",
            f"it holds in {sum(nulls)} of {len(nulls)} seed(s); the other seeds' runs reach "
            + ", ".join(f"{o[short]:.2f} → {o[long]:.2f}" for o in others),
            null,
        ),
        verdict=verdict,
        data="generated: the reverse task",
    )


def _bottleneck_checks(acc: dict, short: int, long: int, bottlenecked: str, attending: tuple) -> tuple[bool, list]:
    """Each part of the bottleneck statement on its own: ``bottlenecked`` fails at length (under half the
    first attending model's accuracy there, and below its own at the shortest length), and each
    ``attending`` model learned the task (≥ 0.5 at the shortest length) and holds up (keeps 80 % of it)."""
    holds = {k: acc[k][short] >= 0.5 and acc[k][long] >= 0.8 * acc[k][short] for k in attending}
    fails = (
        acc[bottlenecked][long] < 0.5 * acc[attending[0]][long] and acc[bottlenecked][long] < acc[bottlenecked][short]
    )
    verdicts = [
        f"{bottlenecked}: {'fails' if fails else 'does not fail'} at length {long}",
        *(f"{k}: {'holds up' if holds[k] else 'does not hold up'}" for k in attending),
    ]
    return fails and all(holds.values()), verdicts


@claim("alignment")
def alignment(ctx: Context) -> Result:
    from ..inspect.plots import alignment_png

    seeds = seeds_for(ctx)
    translations = [_translation_alignment(ctx, s) for s in seeds]
    t0 = translations[0]
    pair = t0["pairs"][0]
    alignment_png(list(pair[0]), list(pair[1]) + ["<eos>"], {"average": t0["attention"]}, ctx.out / "alignment.png")
    holds = [t["hits"] >= 0.8 for t in translations]
    measured = (
        "reorder task (adjective-noun pairs swap in the translation), 64 fresh 12-symbol sentences: the average "
        "cross-attention's arg-max is the source symbol being translated for "
        + ", ".join(f"{t['hits']:.0%} ({t['hits_moved']:.0%} of those that moved)" for t in translations)
        + f" of the output positions (seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))})"
    )
    criterion = (
        "in every seed's models (INCONCLUSIVE when the seeds disagree): translation: arg-max on the translated "
        "source symbol for at least 80 % of the positions"
    )
    # the null: the same model's cross-attention shuffled across the sentences (each sentence scored with
    # the next one's map), by the same criterion: it clears when the alignment is the same for every
    # sentence (a pointer that ignores the input would do), where a fixed diagonal pointer never could
    null_holds = [t["shuffled"] >= 0.8 for t in translations]
    controls = [
        (
            "the same translation models' attention shuffled across the sentences (each scored with another "
            "sentence's map), by the translation criterion",
            "arg-max on the translated symbol for "
            + ", ".join(f"{t['shuffled']:.0%}" for t in translations)
            + f" of the positions (a monotone pointer: {t0['diagonal']:.0%})",
            seeds_verdict(null_holds)[0],
        )
    ]
    note = (
        f"Translation: 2+2-layer Transformers trained {t0['steps']} steps on the reorder task (`attnlab train "
        f"seq2seq --data reorder`), layers and heads averaged{seeds_note(ctx)}."
        + (" At the tiny size the captioner half is not run (PARTIAL)." if ctx.size == "tiny" else "")
    )
    if ctx.size != "tiny":
        caps = [_caption_pointing(ctx, s) for s in seeds]
        judged = [lead_interval(c["leads"]["attention"]) for c in caps]
        null_judged = [lead_interval(c["leads"]["shuffled"]) for c in caps]
        holds = [h and ok for h, (ok, _) in zip(holds, judged)]
        measured += f"; captioners ({caps[0]['steps']} steps): " + "; ".join(
            f"seed {s}: colour words' attention arg-max lands on their object {c['colour']:.0%}, a random object is "
            f"the right one {c['random_object']:.0%}: {words}"
            for s, c, (_, words) in zip(seeds, caps, judged)
        )
        criterion += (
            "; captioning: the 95 % bootstrap interval (over the colour words) of the attention arg-max's lead over "
            "the random-object pointer (hit minus 1 / the scene's objects) above 0"
        )
        note += (
            f" Captioners: rnn-attention on generated scenes of 1 to {SCENE_OBJECTS} objects ({SCENE_PIXELS} pixels), "
            "one per seed, the ones caption-bottleneck judges; pointing game at the colour words (see "
            "benchmarks). When the random-object pointer does as well, deciding needs scenes with more objects, "
            "or a measure of where in the box the attention lands."
        )
        controls.append(
            (
                "the same captioners' attention shuffled across the colour words (each word scored with another "
                "word's map, nearly always another scene's), by the captioning criterion",
                "; ".join(words for _, words in null_judged)
                + " (a random cell hits "
                + ", ".join(f"{c['chance']:.0%}" for c in caps)
                + ")",
                seeds_verdict(ok for ok, _ in null_judged)[0],
            )
        )
    passed, verdict = seeds_verdict(holds)
    return Result(
        measured,
        passed,
        criterion,
        "alignment.png",
        note=note,
        control=Control(
            " and ".join(w for w, _, _ in controls),
            "; ".join(m for _, m, _ in controls),  # (each says what it measured; the names are in `what`)
            any(c for _, _, c in controls),
        ),
        verdict=verdict,
        data="generated: the reorder task" + ("" if ctx.size == "tiny" else ", and generated scenes for the captioner"),
    )


def _translation_alignment(ctx: Context, seed: int) -> dict:
    """A 2+2-layer Transformer trained on the reorder task (``seed``: its initial weights and batches)
    and where its cross-attention points on 64 fresh 12-symbol sentences: {"hits": the fraction of
    output positions whose layer- and head-averaged arg-max is the source symbol they translate,
    "hits_moved": the same among the symbols that moved, "shuffled": the same with each sentence's map
    taken from the next sentence (the null), "diagonal": the monotone pointer's,
    "pairs", "attention": the first sentence's map (13, 12), "steps"}."""
    from ..data.parallel import load_parallel, pad_batch, reorder_alignment, synthetic_pair
    from ..inspect import capture_attention
    from ..models import Transformer, TransformerConfig
    from ..training.tasks import Seq2SeqTask

    steps = ctx.steps(10, 120, 2000)
    data = load_parallel("reorder", min_len=5, max_len=12)
    torch.manual_seed(seed)
    model = Transformer(
        TransformerConfig(
            src_vocab=data.src_vocab.size,
            tgt_vocab=data.tgt_vocab.size,
            dim=64,
            heads=4,
            enc_layers=2,
            dec_layers=2,
            mlp_dim=128,
            dropout=0.0,
            context=40,
        )
    )
    fit(
        ctx,
        model,
        Seq2SeqTask(data, 64),
        "align" + seed_suffix(seed),
        steps,
        batch_size=64,
        lr=3e-3,
        min_lr=3e-5,
        warmup_iters=min(100, steps // 5),
        weight_decay=0.0,
        **({"seed": 1337 + seed} if seed else {}),
    )
    model.eval()
    rng = random.Random(1)  # fresh sentences of 12 symbols, none seen in training more than by chance
    pairs = [synthetic_pair("reorder", rng, 12, 12) for _ in range(64)]
    src, mask = pad_batch([data.src_vocab.encode(s) for s, _ in pairs], data.src_vocab.pad_id)
    tgt_in, _ = pad_batch([[data.tgt_vocab.bos_id] + data.tgt_vocab.encode(t) for _, t in pairs], data.tgt_vocab.pad_id)
    with capture_attention(model, include="cross_attn") as rec, torch.no_grad():
        model(src, tgt_in, mask)
    avg = torch.stack([w.mean(1) for w in rec.layers()]).mean(0)  # (B, T, S), layers and heads averaged
    # decoder position t reads the t-th target symbol's predecessor and predicts the t-th: it should look at
    # the source symbol that one translates
    reference = torch.tensor([reorder_alignment(s) for s, _ in pairs])  # (B, 12)
    hit = alignment_hits(avg[:, :12, :12], reference)
    moved = reference != torch.arange(12)
    return {
        "hits": hit.float().mean().item(),
        "shuffled": alignment_hits(avg[:, :12, :12], reference, shuffled=True).float().mean().item(),
        "hits_moved": hit[moved].float().mean().item(),
        "diagonal": (torch.arange(12) == reference).float().mean().item(),  # the monotone pointer: t -> t
        "pairs": pairs,
        "attention": avg[0, :13, :12],
        "steps": steps,
    }


def alignment_hits(attention: torch.Tensor, reference: torch.Tensor, shuffled: bool = False) -> torch.Tensor:
    """(B, T) whether each output position's attention arg-max (``attention`` (B, T, S)) is the
    source position it translates (``reference`` (B, T)); ``shuffled``: each sentence scored with the
    next sentence's map instead (the null: it hits as often when the alignment does not depend on
    the sentence)."""
    maps = attention.roll(1, 0) if shuffled else attention
    return maps.argmax(-1) == reference


SCENE_OBJECTS = 6  # the claims' captioners learn scenes of 1 to 6 objects: captions of 4 to 33 words
SCENE_PIXELS = 48  # ... on images of 48 pixels: 6 columns of 8 (the least make_scenes allows for 6)


def _captioner(ctx: Context, arch: str = "rnn-attention", seed: int = 0) -> dict:
    """A captioner of ``arch`` trained on generated scenes of 1 to :data:`SCENE_OBJECTS` objects (once
    per context and seed; ``seed``: its initial weights and batches, 0 the command's default), and its
    evaluation: {"steps", "scenes", "eval": what ``attnlab eval`` reports}. Without attention (``rnn``)
    it starts from the flattened grid (Show and Tell's image vector, which keeps the layout)."""
    from .. import api

    name = f"captioner_{arch}" + seed_suffix(seed)
    steps, scenes = ctx.steps(10, 100, 1200), ctx.steps(50, 800, 8000)

    def train() -> dict:
        run = quietly(
            api.train,
            "caption",
            out=ctx.work / name,
            arch=arch,
            max_iters=steps,
            train_scenes=scenes,
            max_objects=SCENE_OBJECTS,
            image_size=SCENE_PIXELS,
            **({"image_vector": "flatten"} if arch == "rnn" else {}),
            **({"seed": 1337 + seed} if seed else {}),
            **run_settings(),
        )
        return {"steps": steps, "scenes": scenes, "eval": quietly(api.evaluate, run.out)}

    return ctx.cached(name, train)


def _caption_pointing(ctx: Context, seed: int = 0) -> dict:
    run = _captioner(ctx, seed=seed)
    res = run["eval"]
    return {
        "steps": run["steps"],
        "colour": (res.get("pointing_by_word") or {}).get("colour", float("nan")),
        "chance": (res.get("pointing_chance_by_word") or {}).get("colour", float("nan")),
        "random_object": (res.get("pointing_random_object_by_word") or {}).get("colour", float("nan")),
        "leads": (res.get("pointing_leads_by_word") or {}).get(
            "colour", {"attention": [], "random_cell": [], "shuffled": []}
        ),
    }


def lead_interval(leads: list[float]) -> tuple[bool, str]:
    """The captioning half's criterion on per-word leads over the random-object pointer (a pointer's
    hit, 1 or 0, or its hit rate, minus 1 / the scene's objects): the 95 % bootstrap interval of
    their mean above 0. Returns (met, the interval in words)."""
    if len(leads) < 2:
        return False, f"{len(leads)} colour word(s): no interval"
    values = np.asarray(leads)
    mean, low, high = bootstrap_interval(lambda i: values[i].mean(), len(values))
    return (
        low > 0,
        f"lead over the random-object pointer {mean:+.2f}, 95 % interval [{low:+.2f}, {high:+.2f}] over {len(values)} colour words",
    )


NAMED = "objects_named"  # caption-bottleneck's measure: per test scene, the share of its objects named whole
LEARNED = 0.5  # ... and the share a captioner must name at the fewest objects to have learned the scenes


def mean_named(by_objects: dict, objects: int) -> float:
    """A captioner's mean share of objects named whole on the test scenes of ``objects`` objects
    (``by_objects``: its evaluation by objects per scene)."""
    return float(np.mean(by_objects[objects][NAMED]))


def _falls(by_objects: dict, bottlenecked: str, attending: str) -> tuple[float, float, bool]:
    """The mean share of objects named, from the fewest objects per scene to the most: (``bottlenecked``'s
    fall, ``attending``'s fall, whether ``attending`` ends higher)."""
    few, most = min(by_objects[attending]), max(by_objects[attending])
    mean = lambda k, n: mean_named(by_objects[k], n)  # noqa: E731
    fall = {k: mean(k, few) - mean(k, most) for k in (bottlenecked, attending)}
    return fall[bottlenecked], fall[attending], mean(attending, most) > mean(bottlenecked, most)


def fall_items(bottlenecked: dict, attending: dict) -> np.ndarray:
    """The fall difference image by image: two captioners' evaluations by objects per scene ({objects:
    {NAMED: [per test image]}}, the same test images in the same order), as one value per test image
    of the fewest and of the most objects whose mean is (the bottlenecked one's fall − the attending
    one's) in the mean share of objects named: each image's difference (bottlenecked − attending),
    weighted by N / n_few on the fewest objects' images and by −N / n_most on the most's (N = n_few +
    n_most), so that an interval over them and over seeds holds the test images' sampling error."""
    few, most = min(attending), max(attending)
    parts = []
    for n, sign in ((few, 1.0), (most, -1.0)):
        d = np.asarray(bottlenecked[n][NAMED]) - np.asarray(attending[n][NAMED])
        parts.append(sign * d / len(d))
    values = np.concatenate(parts)
    return values * len(values)


@claim("caption-bottleneck")
def caption_bottleneck(ctx: Context) -> Result:
    seeds = seeds_for(ctx)
    by_objects = {
        arch: [{int(k): v for k, v in _captioner(ctx, arch, s)["eval"]["by_objects"].items()} for s in seeds]
        for arch in ("rnn", "rnn-attention")
    }
    # the control, an A/A run: the captioner without attention trained again with other seeds (its
    # initial weights and batches: `attnlab train caption --seed` sets both) in the attending one's place,
    # judged by the same function
    by_objects["rnn again"] = [
        {int(k): v for k, v in _captioner(ctx, "rnn", s)["eval"]["by_objects"].items()}
        for s in aa_seeds(seeds, "caption-bottleneck")
    ]

    def items(attending: str) -> np.ndarray:
        """(seeds, images): :func:`fall_items` of each seed's two captioners."""
        return np.stack([fall_items(b, a) for b, a in zip(by_objects["rnn"], by_objects[attending])])

    floor = aa_spread(items("rnn again"))

    counts = sorted(by_objects["rnn"][0])
    few, most = counts[0], counts[-1]
    # the premise: without attention the short scenes are learned; a captioner that names (almost)
    # nothing has no fall to measure, and the claim cannot be told either way
    learned = [mean_named(b, few) >= LEARNED for b in by_objects["rnn"]]

    def judged(attending: str) -> tuple[bool, str | None, str, list]:
        """The statement with ``attending`` in the attending captioner's place: the 95 % interval over
        seeds and test images of (the fall without attention − ``attending``'s fall, in the share of
        objects named) above 0, and ``attending`` ending higher in every seed; INCONCLUSIVE where the
        captioner without attention did not learn the short scenes in every seed."""
        falls = [
            _falls({"rnn": b, attending: a}, "rnn", attending) for b, a in zip(by_objects["rnn"], by_objects[attending])
        ]
        paired = items(attending)
        passed, verdict, words = better_verdict(
            paired.mean(1), "fall without attention − with it (share of objects named)", items=paired, floor=floor
        )
        higher = [h for _, _, h in falls]
        if not all(higher):
            verdict = "FAIL" if not any(higher) or verdict == "FAIL" else "INCONCLUSIVE"
        words += f"; ends higher in {sum(higher)} of {len(higher)} seeds"
        if not all(learned):
            passed, verdict = False, "INCONCLUSIVE"
            words += (
                f"; without attention, at least {LEARNED:.0%} of the objects named at {few} objects in only "
                f"{sum(learned)} of {len(learned)} seeds: it did not learn the short scenes"
            )
        return passed and all(higher), verdict, words, falls

    passed, verdict, words, falls = judged("rnn-attention")
    rows = [
        [
            s,
            arch,
            *(f"{mean_named(by_objects[arch][i], k):.2f} / {by_objects[arch][i][k]['bleu4']:.1f}" for k in counts),
        ]
        for i, s in enumerate(seeds)
        for arch in by_objects
    ]
    run0 = _captioner(ctx, "rnn", seeds[0])
    return Result(
        f"share of each scene's objects named whole, from {few} to {most} objects per scene: "
        + "; ".join(
            f"seed {s}: without attention {mean_named(r, few):.2f} → {mean_named(r, most):.2f} (falls "
            f"{fr:.2f}), with attention {mean_named(a, few):.2f} → {mean_named(a, most):.2f} (falls {fa:.2f})"
            for s, r, a, (fr, fa, _) in zip(seeds, by_objects["rnn"], by_objects["rnn-attention"], falls)
        )
        + f"; {words}",
        passed,
        f"the captioner without attention names at least {LEARNED:.0%} of the objects at {few} objects in every seed "
        f"(else INCONCLUSIVE: no fall to measure); the 95 % interval over seeds and test scenes of the fall in the "
        f"share of objects named from {few} to {most} objects without attention minus the fall with it above 0 (the "
        "seeds' spread at least the A/A run's); and the captioner with attention ending higher in every seed",
        table=markdown_table(["seed", "decoder", *(f"{k} object(s): named / BLEU-4" for k in counts)], rows),
        note=f"LSTM captioners (`attnlab train caption --arch rnn` and `--arch rnn-attention`), {run0['steps']} "
        f"steps on {run0['scenes']:,} generated scenes of 1-{SCENE_OBJECTS} objects (a caption names each object: more "
        f"objects, longer descriptions); each seed trains both captioners{seeds_note(ctx)}. The deck's case, "
        f"descriptions of 100s of words, is not reached: the generated scenes hold at most {SCENE_OBJECTS} objects "
        "(captions of up to 33 words)"
        + (
            f"; the test scenes never repeat a training caption, so they hold {few} to {most} objects (a scene of one "
            "object has one of 30 captions, all of them in training)"
            if few > 1
            else ""
        )
        + ". The captioner without attention starts its LSTM from a learned map of the whole flattened image "
        "grid (`--image-vector flatten`, a CNN's last layer, as Show and Tell's image vector); the grid's mean "
        "keeps what is in the image but not where, and with it a pilot named none of the objects of 2-object "
        "scenes. The measure is the share of each scene's objects that its caption names whole (size, colour "
        "and shape), paired image by image between the two captioners (the same test scenes), so the interval "
        "holds the test scenes' sampling error beside the seeds'. Sentence BLEU also rewards the grammar's "
        "words: in a pilot it rose from 42 to 52 between 2 and 6 objects for a captioner that named 0 % and 23 % "
        "of the objects; the table gives corpus BLEU-4 beside the share named",
        control=aa_control(
            judged("rnn again")[:3],
            "other seeds (each sets both the initial weights and the batches, as the "
            "claim's seeds do), a draw of this claim's own",
        ),
        verdict=verdict,
        data="generated scenes of coloured shapes",
    )
