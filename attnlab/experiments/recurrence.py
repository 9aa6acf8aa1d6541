"""Claims of the sequence-to-sequence lectures: the RNN bottleneck, and attention as alignment
(translation with reordering, and captioning)."""

from __future__ import annotations

import random

import numpy as np
import torch

from .registry import Context, Control, Result, claim, deck, markdown_table
from .runs import fit, quietly, run_settings
from .stats import bootstrap_interval


# ---- 8: the RNN bottleneck ---------------------------------------------------------------------------
@claim(
    "bottleneck",
    "The RNN bottleneck",
    "An encoder-decoder RNN without attention must squeeze the whole input into one vector and fails on long "
    "inputs; with attention (and in the Transformer) accuracy holds up.",
    source=deck("002:303 Input sequence not bottlenecked through single vector"),
    why="Half and 80 %: a collapse against a hold, far from each other; 0.5 at length 5: the model learned the task (chance is far lower). Conventions.",
)
def bottleneck(ctx: Context) -> Result:
    from .bottleneck import plot, run

    steps = ctx.steps(10, 600, 1500)
    lengths = (5, 10, 20, 30) if ctx.size != "full" else (5, 10, 20, 30, 40, 60)
    res = run(lengths, steps, 64, ctx.work / "bottleneck", small=ctx.size != "full", **run_settings())
    plot(res, ctx.out / "bottleneck.png")
    acc = {n: r["accuracy"] for n, r in res.items()}
    short, long = lengths[0], lengths[-1]
    names = ("RNN (no attention)", "RNN + attention", "Transformer")
    ok, verdicts = _bottleneck_checks(acc, short, long, names[0], names[1:])
    # the verdict at each budget along the runs (learning curves: each run's own schedule)
    budgets = sorted(res[names[0]]["curve"])
    by_budget = {b: _bottleneck_checks({n: res[n]["curve"][b] for n in names}, short, long, names[0], names[1:])[0]
                 for b in budgets}  # fmt: skip
    reached = next((b for b in budgets if all(by_budget[c] for c in budgets if c >= b)), None)
    budget_words = ", ".join(f"{b} steps {'holds' if by_budget[b] else 'does not hold'}" for b in budgets)
    # the control, the mechanism removed: the RNN without attention trained again (another seed) in the
    # attending models' place, judged by the same criterion: it must not hold up where attention does
    again = run(lengths, steps, 64, ctx.work / "bottleneck", small=ctx.size != "full", only=(names[0],), seed=1,
                **run_settings())[names[0]]["accuracy"]  # fmt: skip
    null_acc = {**acc, "RNN (no attention), seed 1": again}
    null, _ = _bottleneck_checks(null_acc, short, long, names[0], ("RNN (no attention), seed 1",))
    return Result(
        f"sequence accuracy at length {short} → {long}: "
        + ", ".join(f"{k} {acc[k][short]:.2f} → {acc[k][long]:.2f}" for k in names)
        + "; "
        + "; ".join(verdicts)
        + f"; the criterion along the runs: {budget_words}"
        + (f" (reached at {reached} steps and held after)" if reached else ""),
        ok,
        f"without attention, accuracy at length {long} under half the RNN with attention's and lower than at "
        f"length {short}; the RNN with attention and the Transformer each at least 0.5 at length {short} and keep "
        f"at least 80 % of it at length {long}",
        "bottleneck.png",
        markdown_table(["model", *map(str, lengths)], [[n, *[a[x] for x in lengths]] for n, a in acc.items()]),
        note=f"reverse task, {steps} steps each, batch 64. The verdict is for this budget; the criterion is also "
        "judged at a quarter, half and three quarters of each run (the figure's right panel: accuracy at the longest "
        "length against steps), so a model that does not hold up yet can be told from one that never will",
        control=Control(
            "the mechanism removed: a second RNN without attention (another seed) in the attending models' place, "
            "by the same criterion",
            f"it reaches {again[short]:.2f} → {again[long]:.2f}",
            null,
        ),
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


@claim(
    "alignment",
    "Attention as alignment",
    "A translation model's cross-attention aligns each output word with the input word it translates "
    "(Bahdanau et al. 2015); a captioner's attention falls on the object each word describes (Xu et al. 2015).",
    source=deck("002:360 Attention figures out different word orders", "002:807 Show, Attend, and Tell"),
    why="80 %: most positions, where the monotone pointer reaches far fewer; captioning: an interval over the words above 0, a lead over a random object larger than the words' sampling error.",
)
def alignment(ctx: Context) -> Result:
    from ..data.parallel import load_parallel, pad_batch, reorder_alignment, synthetic_pair
    from ..inspect import capture_attention
    from ..inspect.plots import alignment_png
    from ..models import Transformer, TransformerConfig
    from ..training.tasks import Seq2SeqTask

    steps = ctx.steps(10, 800, 2000)
    data = load_parallel("reorder", min_len=5, max_len=12)
    torch.manual_seed(0)
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
        "align",
        steps,
        batch_size=64,
        lr=3e-3,
        min_lr=3e-5,
        warmup_iters=min(100, steps // 5),
        weight_decay=0.0,
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
    pointed = avg[:, :12, :12].argmax(-1)
    hits = (pointed == reference).float().mean().item()
    diagonal = (torch.arange(12) == reference).float().mean().item()  # the monotone pointer: position t -> t
    moved = reference != torch.arange(12)
    hits_moved = (pointed == reference)[moved].float().mean().item()
    alignment_png(
        list(pairs[0][0]), list(pairs[0][1]) + ["<eos>"], {"average": avg[0, :13, :12]}, ctx.out / "alignment.png"
    )
    measured = (
        f"reorder task (adjective-noun pairs swap in the translation), 64 fresh 12-symbol sentences: the average "
        f"cross-attention's arg-max is the source symbol being translated for {hits:.0%} of the output positions "
        f"({hits_moved:.0%} of those that moved)"
    )
    passed = hits >= 0.8
    criterion = "translation: arg-max on the translated source symbol for at least 80 % of the positions"
    controls = [
        (
            "a monotone (diagonal) pointer",
            f"position t → source t agrees with the alignment {diagonal:.0%}",
            diagonal >= 0.8,
        )
    ]
    note = (
        f"Translation: a 2+2-layer Transformer trained {steps} steps on the reorder task (`attnlab train seq2seq "
        "--data reorder`), layers and heads averaged. At the tiny size the captioner half is not run (PARTIAL)."
    )
    if ctx.size != "tiny":
        cap = _caption_pointing(ctx)
        cap_ok, cap_words = lead_interval(cap["leads"]["attention"])
        null_ok, null_words = lead_interval(cap["leads"]["random_cell"])
        measured += (
            f"; captioner ({cap['steps']} steps): colour words' attention arg-max lands on their object "
            f"{cap['colour']:.0%}, a random object is the right one {cap['random_object']:.0%}: {cap_words}"
        )
        passed = passed and cap_ok
        criterion += (
            "; captioning: the 95 % bootstrap interval (over the colour words) of the attention arg-max's lead over "
            "the random-object pointer (hit minus 1 / the scene's objects) above 0"
        )
        note = note.replace(" At the tiny size the captioner half is not run (PARTIAL).", "") + (
            " Captioner: rnn-attention on generated scenes; pointing game at the colour words (see benchmarks). "
            "When the random-object pointer does as well, deciding needs scenes with more objects, or a measure "
            "of where in the box the attention lands."
        )
        controls.append(
            (
                "a random cell's pointer, by the captioning criterion",
                f"a random cell ({cap['chance']:.0%} of hits): {null_words}",
                null_ok,
            )
        )
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
        data="generated: the reorder task" + ("" if ctx.size == "tiny" else ", and generated scenes for the captioner"),
    )


def _captioner(ctx: Context, arch: str = "rnn-attention", seed: int = 0) -> dict:
    """A captioner of ``arch`` trained on generated scenes (once per context and seed; ``seed``: its
    initial weights and batches, 0 the command's default), and its evaluation: {"steps", "scenes",
    "eval": what ``attnlab eval`` reports}."""
    from .. import api

    name = f"captioner_{arch}" + (f"_seed{seed}" if seed else "")
    if name not in ctx.cache:
        steps, scenes = ctx.steps(10, 500, 1200), ctx.steps(50, 3000, 8000)
        run = quietly(
            api.train,
            "caption",
            out=ctx.work / name,
            arch=arch,
            max_iters=steps,
            train_scenes=scenes,
            **({"seed": 1337 + seed} if seed else {}),
            **run_settings(),
        )
        ctx.cache[name] = {"steps": steps, "scenes": scenes, "eval": quietly(api.evaluate, run.out)}
    return ctx.cache[name]


def _caption_pointing(ctx: Context) -> dict:
    run = _captioner(ctx)
    res = run["eval"]
    return {
        "steps": run["steps"],
        "colour": (res.get("pointing_by_word") or {}).get("colour", float("nan")),
        "chance": (res.get("pointing_chance_by_word") or {}).get("colour", float("nan")),
        "random_object": (res.get("pointing_random_object_by_word") or {}).get("colour", float("nan")),
        "leads": (res.get("pointing_leads_by_word") or {}).get("colour", {"attention": [], "random_cell": []}),
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


def _holds_up(by_objects: dict, bottlenecked: str, attending: str) -> tuple[bool, float, float]:
    """The caption-bottleneck criterion on BLEU-4 by objects per scene: from the fewest objects to the
    most, ``bottlenecked``'s BLEU-4 falls by at least 5 points more than ``attending``'s, which ends
    higher. Returns (met, bottlenecked's fall, attending's fall)."""
    few, most = min(by_objects[attending]), max(by_objects[attending])
    fall = {k: by_objects[k][few]["bleu4"] - by_objects[k][most]["bleu4"] for k in (bottlenecked, attending)}
    ends_higher = by_objects[attending][most]["bleu4"] > by_objects[bottlenecked][most]["bleu4"]
    return fall[bottlenecked] >= fall[attending] + 5 and ends_higher, fall[bottlenecked], fall[attending]


@claim(
    "caption-bottleneck",
    "Captioning: the bottleneck on long descriptions (Xu et al. 2015)",
    "A captioner that sees the image once, as one vector, must squeeze every object into it, so its captions "
    "suffer as descriptions grow longer; with attention (Show, Attend and Tell) the decoder looks again at the "
    "image for every word, and long descriptions suffer less.",
    source=deck('002:536 Input is "bottlenecked" through c', "002:540 really long descriptions"),
    why="5 BLEU-4 points: about the spread between seeds of these captioners' BLEU on 25 images; a convention.",
)
def caption_bottleneck(ctx: Context) -> Result:
    runs = {arch: _captioner(ctx, arch) for arch in ("rnn", "rnn-attention")}
    by_objects = {arch: {int(k): v for k, v in r["eval"]["by_objects"].items()} for arch, r in runs.items()}
    ok, fall_rnn, fall_att = _holds_up(by_objects, "rnn", "rnn-attention")
    # the control, the mechanism removed: a second captioner without attention (another seed) in the
    # attending one's place, by the same criterion
    again = _captioner(ctx, "rnn", seed=1)
    null_objects = {**by_objects, "rnn, seed 1": {int(k): v for k, v in again["eval"]["by_objects"].items()}}
    null, _, fall_again = _holds_up(null_objects, "rnn", "rnn, seed 1")
    counts = sorted(by_objects["rnn"])
    rows = [
        [arch, *(f"{by_objects[arch][k]['exact']:.2f} / {by_objects[arch][k]['bleu4']:.1f}" for k in counts)]
        for arch in by_objects
    ]
    bleu = {arch: {k: v["bleu4"] for k, v in b.items()} for arch, b in by_objects.items()}
    return Result(
        f"BLEU-4 from {counts[0]} to {counts[-1]} objects per scene: without attention {bleu['rnn'][counts[0]]:.1f} → "
        f"{bleu['rnn'][counts[-1]]:.1f} (falls {fall_rnn:.1f}), with attention {bleu['rnn-attention'][counts[0]]:.1f} → "
        f"{bleu['rnn-attention'][counts[-1]]:.1f} (falls {fall_att:.1f})",
        ok,
        f"BLEU-4 without attention falls at least 5 points more than with it from {counts[0]} to {counts[-1]} "
        "objects, and the captioner with attention ends higher",
        table=markdown_table(["decoder", *(f"{k} object(s): exact / BLEU-4" for k in counts)], rows),
        note=f"LSTM captioners (`attnlab train caption --arch rnn` and `--arch rnn-attention`), {runs['rnn']['steps']} "
        f"steps on {runs['rnn']['scenes']:,} generated scenes of 1-3 objects (a caption names each object: more "
        "objects, longer descriptions); one seed each: a difference of a few points is within seed noise",
        control=Control(
            "the mechanism removed: a second captioner without attention (another seed) in the attending one's "
            "place, by the same criterion",
            f"it falls {fall_again:.1f} (the first {fall_rnn:.1f})",
            null,
        ),
        data="generated scenes of coloured shapes",
    )
