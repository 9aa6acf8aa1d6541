"""Claims of the BERT lecture: masked-language-model pretraining, then fine-tuning, against
training on the labelled task alone."""

from __future__ import annotations

import random

import numpy as np

from .registry import Context, Control, Result, claim, markdown_table
from .runs import loss_bars, quietly, run_settings
from .stats import better_verdict, seed_suffix, seeds_for, seeds_note


def _random_words(ctx: Context) -> str:
    """The control's pretraining text: the embedded corpus with every word replaced by one drawn
    uniformly from its vocabulary, paragraph by paragraph (the same shape, the same words, no
    structure to learn). Returns the file's path."""
    from ..data.text import embedded_corpus

    paragraphs = [p.split() for p in embedded_corpus().split("\n\n") if p.strip()]
    vocabulary = sorted({w for p in paragraphs for w in p})
    rng = random.Random(0)
    path = ctx.work / "random_words.txt"
    path.write_text(
        "\n\n".join(" ".join(rng.choice(vocabulary) for _ in p) for p in paragraphs) + "\n", encoding="utf-8"
    )
    return str(path)


@claim("mlm-pretraining")
def mlm_pretraining(ctx: Context) -> Result:
    from .. import api

    from ..data.labelled import load_labelled

    pre_steps, tune_steps = ctx.steps(5, 50, 2000), ctx.steps(5, 25, 300)
    seeds = seeds_for(ctx)
    common = dict(run_settings(), compile=False)
    test = load_labelled(None)  # the fine-tuning task's own test split (the encoder family's default data)
    texts, truth = test.texts["test"], test.labels["test"]
    right: dict[str, list[np.ndarray]] = {"from scratch": [], "pretrained": [], "pretrained on random words": []}
    for seed in seeds:  # every seed its own pipeline: the pretraining's weights and batches too
        tag = seed_suffix(seed)
        pretrained = quietly(
            api.train, "encoder", task="mlm", out=ctx.work / f"mlm{tag}", max_iters=pre_steps, seed=1337 + seed,
            **common,
        )  # fmt: skip
        # the control: the same pretraining on words drawn uniformly from the vocabulary (nothing to learn but the word list)
        noise = quietly(
            api.train,
            "encoder",
            task="mlm",
            data=_random_words(ctx),
            out=ctx.work / f"mlm_random{tag}",
            max_iters=pre_steps,
            seed=1337 + seed,
            **common,
        )
        for name, init in (
            ("from scratch", None),
            ("pretrained", pretrained.out),
            ("pretrained on random words", noise.out),
        ):
            run = quietly(
                api.train,
                "encoder",
                task="classify",
                out=ctx.work / f"classify_{name.replace(' ', '_')}_s{seed}",
                init=str(init) if init else None,
                max_iters=tune_steps,
                seed=1337 + seed,
                **common,
            )
            predicted = quietly(api.load, run.out).predict(texts, top_k=1)  # the run's weights, as `eval` reads them
            right[name].append(np.array([p[0][0] == y for p, y in zip(predicted, truth)], dtype=float))
    acc = {name: [float(r.mean()) for r in rs] for name, rs in right.items()}
    items = {name: np.stack(rs) for name, rs in right.items()}  # (seeds, test texts)
    scratch, tuned, control = (np.array(acc[n]) for n in acc)
    step = 1 / len(texts)  # an accuracy moves in steps of one test text
    # (paired seed by seed and text by text: the interval holds the test set's sampling error too)
    passed, verdict, words = better_verdict(
        None, "pretrained − from scratch accuracy", resolution=step, items=items["pretrained"] - items["from scratch"]
    )
    control_passed, control_verdict, control_words = better_verdict(
        None, "random-words pretraining − from scratch", resolution=step,
        items=items["pretrained on random words"] - items["from scratch"],
    )  # fmt: skip
    loss_bars(acc, ctx.out / "mlm_pretraining.png", f"{tune_steps} fine-tuning steps", ylabel="test accuracy")
    return Result(
        f"test accuracy after {tune_steps} steps on the labelled task: from scratch {scratch.mean():.3f}, after "
        f"{pre_steps} steps of masked-LM pretraining {tuned.mean():.3f}; {words}",
        passed,
        "the 95 % interval of the paired accuracy difference (pretrained − from scratch) above 0, paired seed by "
        "seed and test text by test text (the test set's sampling error beside the seeds')",
        "mlm_pretraining.png",
        markdown_table(["encoder", *(f"seed {s}" for s in seeds)], [[n, *v] for n, v in acc.items()]),
        note="the default `attnlab train encoder` model; pretraining `--task mlm` on the Python help pages, "
        "fine-tuning `--task classify --init` on which section of the documentation a paragraph comes from (the "
        "from-scratch model trains its own tokenizer on the labelled text). Each seed is its own pipeline: it sets "
        "the pretraining's initial weights and batches (the claim's and the control's) and the fine-tuning's"
        + seeds_note(ctx),
        control=Control(
            f"the same pretraining on text of the corpus's shape with every word drawn uniformly from its vocabulary ({pre_steps} steps, one per seed)",
            control_words,
            control_passed,
            control_verdict,
        ),
        verdict=verdict,
        data="the embedded Python help pages (pretraining) and their sections (labels)",
    )
