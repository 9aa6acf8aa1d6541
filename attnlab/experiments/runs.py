"""The trained models several claims share, trained once per report (``ctx.cache``): the text
corpus and small GPTs on it, the embedded digits and the ViT and CNN trained on them."""

from __future__ import annotations

import contextlib
import io
import math
import textwrap
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..hooks import in_mode
from ..inspect.plots import plt, save_figure
from ..training.callbacks import Callback, quarter_steps
from .registry import Context
from .stats import seed_suffix


def corpus(ctx: Context):
    """Tiny Shakespeare from the data directory, or the embedded corpus when it is not there."""
    from ..data import sources
    from ..data.text import prepare

    if "corpus" not in ctx.cache:
        try:  # only from the data directory or the cache: a report never waits on a download
            found = ctx.size != "tiny" and sources.resolve("shakespeare", ctx.data_dir, allow_download=False)
        except Exception:
            found = False
        data = (
            prepare("shakespeare", ctx.work / "corpus_shakespeare", data_dir=ctx.data_dir)
            if found
            else prepare(None, ctx.work / "corpus_embedded")
        )
        ctx.cache["corpus"] = data
        # the report names the text its claims ran on: some (length, add-concat) turn on it
        ctx.cache["corpus_note"] = (
            "Tiny Shakespeare (from the data directory)"
            if found
            else "the embedded corpus (Python's own help text): Tiny Shakespeare was "
            + ("not used at the tiny size" if ctx.size == "tiny" else f"not in {sources.where_looked(ctx.data_dir)}")
            + "; the text claims can turn on the corpus (attnlab data get shakespeare, then run again)"
        )
    ctx.cache.setdefault("data_used", []).append(ctx.cache["corpus_note"])
    return ctx.cache["corpus"]


def quietly(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` (a training or evaluation through the Python API) with its progress
    lines kept out of the report's log."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


def run_settings() -> dict:
    """The TrainConfig fields every claim's training shares: the CPU in fp32 (``--dtype auto``
    would pick bf16 on some CPUs only), no progress bar, and a fixed thread count, the cores this
    process may use (``--threads auto`` follows the machine's load while it runs, and a count that
    changes mid-run changes the order of float sums: two reports on one machine would differ)."""
    from ..training.threads import our_cores

    return dict(progress=False, device="cpu", dtype="fp32", threads=len(our_cores()))


def fit(ctx: Context, model, task, name: str, steps: int, callbacks=(), **options) -> None:
    """Train ``model`` on ``task`` for ``steps`` steps into ``ctx.work / name`` with
    :func:`run_settings`, one evaluation at the end, through the training every family's run ends
    in (:func:`attnlab.training.runs.fit_model`); for a model no family trains on data no family
    reads (a graph transformer on cycles, a GPT on an induction task). ``callbacks``: the
    trainer's (a learning curve); ``options``: the TrainConfig fields that differ."""
    from ..training.runs import fit_model
    from ..training import TrainConfig

    settings = {**run_settings(), "eval_iters": 2, **options}
    config = TrainConfig(max_iters=steps, eval_interval=steps, **settings)
    fit_model(model, task, config, ctx.work / name, callbacks=list(callbacks))


def warmup_for(steps: int) -> int:
    """A claim's warmup: the families' 100 steps, or a fifth of a shorter run."""
    return min(100, steps // 5)


def train_gpt(
    ctx: Context,
    pos: str,
    steps: int,
    context: int = 512,
    window: int = 64,
    heads: int = 4,
    seed: int = 0,
    lr: float = 3e-3,
    qk_std: float | None = None,
    callbacks=(),
    init_seed: int | None = None,
    tied_heads: bool = False,
    **model,
):
    """A 2-layer GPT (64 wide unless ``model`` says otherwise) trained on the corpus for ``steps``
    steps of 16 windows of ``window`` tokens at peak learning rate ``lr``; ``model``: more GPTConfig
    options; ``qk_std``: the query and key projections drawn from N(0, qk_std²) instead of the GPT's
    N(0, 0.02²); ``callbacks``: the trainer's; ``seed``: its initial weights and batches, or its
    batches alone when ``init_seed`` sets the weights (an A/A run paired like its claim);
    ``tied_heads``: every layer's heads one head copied (:func:`tie_heads`). Its run
    folder is ``ctx.work / gpt_run_name(...)`` (its metrics.jsonl: every step's loss)."""
    from ..models import GPT
    from ..training import LanguageModelTask

    data = corpus(ctx)
    torch.manual_seed(seed if init_seed is None else init_seed)
    gpt = GPT(gpt_config(ctx, pos, context, heads, **model))
    if qk_std is not None:
        with torch.no_grad():
            for block in gpt.blocks:  # the fused projection's rows: [W_Q (H·d_k); W_K (H_kv·d_k); W_V]
                attn = block.attn
                attn.qkv.weight[: (attn.n_heads + attn.n_kv_heads) * attn.d_k].normal_(0.0, qk_std)
    if tied_heads:
        tie_heads(gpt)
    named = {
        **model,
        **({"qk_std": qk_std} if qk_std else {}),
        **({"init": init_seed} if init_seed is not None else {}),
        **({"tied": "heads"} if tied_heads else {}),
    }
    name = gpt_run_name(pos, steps, context, window, heads, seed, lr, **named)
    fit(
        ctx,
        gpt,
        LanguageModelTask(data, window, 16),
        name,
        steps,
        callbacks=callbacks,
        batch_size=16,
        lr=lr,
        min_lr=lr / 10,
        warmup_iters=min(50, steps // 5),
        seed=1337 + seed,  # the batches (1337: the trainer's default)
        log_interval=1,  # every step's training loss in metrics.jsonl (the stability claim reads them)
    )
    return gpt.eval(), data


def gpt_config(ctx: Context, pos: str, context: int, heads: int = 4, **model):
    """The GPTConfig of :func:`train_gpt`'s models: 2 layers, 64 wide, no dropout, the corpus's
    vocabulary (``model``: other GPTConfig options)."""
    from ..models import GPTConfig

    shape = {"layers": 2, "dim": 64, **model}
    vocab = corpus(ctx).tokenizer.vocab_size
    return GPTConfig(vocab_size=vocab, context=context, heads=heads, pos=pos, dropout=0.0, **shape)


def parameter_matched(ctx: Context, options: dict, reference: dict, pos: str = "rope", context: int = 64) -> dict:
    """``options`` (:func:`train_gpt`'s GPTConfig options) with the MLP's hidden width whose
    parameter count comes nearest to ``reference``'s: a variant that removes weights (a tied
    projection) given as many back where they do not touch what it varies. The count is linear in
    the hidden width, so two counts give it."""
    from ..models import GPT

    def count(opts: dict) -> int:
        with torch.device("meta"):  # (shapes only: no memory, no draw from the random generator)
            return GPT(gpt_config(ctx, pos, context, **opts)).num_params(non_embedding=False)

    hidden = options.get("mlp_hidden") or 4 * options.get("dim", 64)
    now = count({**options, "mlp_hidden": hidden})
    per_unit = count({**options, "mlp_hidden": hidden + 1}) - now
    return {**options, "mlp_hidden": hidden + round((count(reference) - now) / per_unit)}


def tie_heads(model) -> None:
    """Make every attention layer's heads copies of one: each head's rows of W_Q, W_K and W_V (and
    their biases) set to head 0's, and a gradient hook that gives every copy the heads' mean
    gradient, so that they stay equal through training (AdamW and clipping act elementwise or
    uniformly: equal weights with equal gradients get equal updates). The heads then compute one
    pattern of scores; what still tells them apart is what the architecture adds per head (ALiBi's
    slopes) and W_O. For a model whose heads must not learn to differ (the heads claim's null)."""
    for block in model.blocks:
        attn = block.attn
        if attn.tie != "none":
            raise ValueError("tie_heads: the model ties projections (attn_tie); untie them first")
        groups = [(attn.n_heads, attn.d_k), (attn.n_kv_heads, attn.d_k), (attn.n_kv_heads, attn.d_v)]

        def per_head(t: torch.Tensor, groups=groups) -> list[torch.Tensor]:
            """Views of ``t`` (rows, ...), W_Q's, W_K's and W_V's rows each as (heads, width, ...)."""
            parts = t.split([heads * width for heads, width in groups])
            return [p.view(heads, width, *t.shape[1:]) for p, (heads, width) in zip(parts, groups)]

        def tied(grad: torch.Tensor) -> torch.Tensor:  # every head's copy gets the heads' mean gradient
            return torch.cat([g.mean(0, keepdim=True).expand_as(g).flatten(0, 1) for g in per_head(grad)])

        for param in (attn.qkv.weight, attn.qkv.bias):
            if param is None:
                continue
            with torch.no_grad():  # every head a copy of head 0
                for rows in per_head(param):
                    rows.copy_(rows[:1].clone().expand_as(rows))
            param.register_hook(tied)


LENGTH_STEPS = (20, 150, 1500)  # the steps of the length claim's GPTs: tiny, --quick, full size


def length_gpt(ctx: Context, pos: str, seed: int, tied_heads: bool = False):
    """(model, corpus): the ``length`` claim's GPT with positions ``pos`` for ``seed``, built for 512
    positions and trained on 64-token windows, trained once per report (the heads claim reads the
    ALiBi ones, and its null the same with ``tied_heads``: :func:`tie_heads`)."""
    key = f"gpt_{pos}" + ("_tied" if tied_heads else "") + seed_suffix(seed)
    steps = ctx.steps(*LENGTH_STEPS)
    return ctx.cached(key, lambda: train_gpt(ctx, pos, steps, context=512, seed=seed, tied_heads=tied_heads))


def gpt_run_name(pos: str, steps: int, context: int, window: int, heads: int, seed: int, lr: float, **model) -> str:
    """The folder under ``ctx.work`` of :func:`train_gpt`'s run with these arguments (every one in
    the name: a run of another length or shape never resumes another's folder)."""
    options = [f"{k}-{v}" for k, v in sorted(model.items())]
    return "_".join([f"gpt_{pos}_{heads}h_c{context}_w{window}", *options, f"{steps}st", f"lr{lr:g}", f"s{seed}"])


def spread_ends(n_tokens: int, first: int, count: int) -> list[int]:
    """``count`` target positions spread evenly over a split of ``n_tokens`` tokens, the first at
    ``first`` (so that a window of up to ``first`` tokens fits before every one)."""
    return [first + i * (n_tokens - 1 - first) // (count - 1) for i in range(count)]


@torch.no_grad()
def window_losses(model, data, length: int, ends: list[int]) -> np.ndarray:
    """The loss on the same targets at every length, one per end: for each end e of ``ends``, the
    mean loss on the 64 tokens before e, predicted from a window of ``length`` tokens ending there
    (so a longer window only adds earlier context to the same predictions). (len(ends),)"""
    ids = np.asarray(data.val, dtype=np.int64)
    x = torch.from_numpy(np.stack([ids[e - length : e] for e in ends]))
    y = torch.from_numpy(np.stack([ids[e - length + 1 : e + 1] for e in ends]))
    logits = model(x)
    per_token = F.cross_entropy(logits[:, -64:].flatten(0, 1), y[:, -64:].flatten(), reduction="none")
    return per_token.view(len(ends), 64).mean(1).double().numpy()


def loss_at(model, data, length: int, ends: list[int]) -> float:
    """:func:`window_losses`' mean: the loss on all the targets at once."""
    return float(window_losses(model, data, length, ends).mean())


LOSS_WINDOWS = 64  # the validation windows of 64 tokens a comparison of losses is scored on (its test items)


def gpt_losses(
    ctx: Context, variants: dict[str, dict], steps: int, seeds=(0,), init_seeds=None, **shape
) -> tuple[dict, dict, dict]:
    """({variant: [validation loss per seed]}, {variant: parameter count}, {variant: (seeds,
    windows) loss per window}): one 2-layer GPT with rotary positions per variant and seed
    (``variants``: name -> GPTConfig options), each scored on the same :data:`LOSS_WINDOWS` windows
    of 64 tokens spread over the validation split (the test items of an interval over seeds and
    windows). ``init_seeds``: the initial weights' seed of each seed's run (an A/A run, paired with
    the claim's own by its batches), or the seed itself."""
    data = corpus(ctx)
    ends = spread_ends(len(data.val), 64, LOSS_WINDOWS)
    losses, params, windows = {}, {}, {}
    for name, options in variants.items():
        pos, rest = options.get("pos", "rope"), {k: v for k, v in options.items() if k != "pos"}
        per_seed = []
        for i, seed in enumerate(seeds):  # (every seed trains the variant's own positions)
            init = None if init_seeds is None else init_seeds[i]
            model, _ = train_gpt(ctx, pos, steps, context=64, seed=seed, init_seed=init, **shape, **rest)
            with torch.no_grad():
                per_seed.append(window_losses(model, data, 64, ends))
            params[name] = model.num_params(non_embedding=False)
        windows[name] = np.stack(per_seed)
        losses[name] = [float(w.mean()) for w in per_seed]
    return losses, params, windows


def loss_bars(
    losses: dict, path: Path, title: str, ylabel: str = "validation loss", curves: dict | None = None
) -> None:
    """Each variant's mean over seeds with its 95 % t-interval, every seed a dot ({variant: [value
    per seed]}): points with intervals, not bars, so that an axis zoomed to the differences does not
    make them look larger than the seeds' spread. With ``curves`` ({variant: [learning curve {step:
    value} per seed]}) a second panel plots each variant's mean along its runs."""
    names = list(losses)
    width = 1.3 * len(names) + 1.5
    fig, axes = plt.subplots(
        1, 2 if curves else 1, figsize=(width + (4 if curves else 0), 3.2), dpi=100, layout="constrained", squeeze=False
    )
    ax = axes[0, 0]
    spots = range(len(names))
    means = [float(np.mean(losses[n])) for n in names]
    ax.errorbar(spots, means, yerr=[error_bar(losses[n]) for n in names], fmt="o", ms=7, capsize=6, lw=1.5)
    for i, n in enumerate(names):  # every seed
        ax.plot([i + 0.12] * len(losses[n]), losses[n], "k.", ms=4)
    ax.set_xticks(spots, names)
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_ylabel(ylabel)
    seeds = min(len(v) for v in losses.values())
    how = f"mean, 95 % interval over {seeds} seeds; dots: seeds" if seeds > 1 else "one seed"
    if curves:  # (the description over both panels, each panel its own short title)
        fig.suptitle(textwrap.fill(title, int(11 * (width + 4))), fontsize=9)
        ax.set_title(f"at the end ({how})", fontsize=8)
        curve_panel(axes[0, 1], curves, ylabel)
    else:
        ax.set_title(textwrap.fill(title, int(11 * width)) + f"\n{how}", fontsize=9)
    save_figure(fig, path)


def error_bar(values) -> float:
    """Half the width of the 95 % t-interval over seeds of the mean of ``values`` (one per seed:
    :func:`stats.paired_interval`'s), the length of an error bar; 0 for one value (no interval to
    draw)."""
    from .stats import paired_interval

    _, low, high = paired_interval(values)
    return 0.0 if math.isnan(low) else (high - low) / 2


def curve_panel(ax, curves: dict, ylabel: str = "") -> None:
    """Each variant's mean over seeds along its runs: ``curves`` {variant: [{step: value} per seed]}."""
    for name, cs in curves.items():
        steps = sorted(cs[0])
        ax.plot(steps, [np.mean([c[s] for c in cs]) for s in steps], "o-", label=str(name), ms=3)
    ax.set_xlabel("step (one run each, measured along it)", fontsize=8)
    ax.set_ylabel(ylabel or "measured", fontsize=8)
    ax.set_title("along the runs (mean over seeds)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


class TestAccuracyCurve(Callback):
    """The test accuracy of the model being trained at the logged ``steps`` (the model in eval
    mode, no gradients, no random numbers drawn: the run goes on as it would without it), then at
    its end: ``curve`` {step: accuracy}, ``final`` and ``correct`` (N,) whether each test item was
    right at the end (for intervals that include the test set's own sampling error)."""

    def __init__(self, steps) -> None:
        self.steps, self.curve, self.final = set(steps), {}, float("nan")
        self.correct = np.zeros(0, dtype=bool)

    def accuracy(self, trainer) -> float:
        with in_mode(trainer.model):
            test = trainer.task.evaluate(trainer.model, "test", device=trainer.device)
        self.correct = test["correct"].cpu().numpy()
        return test["accuracy"]

    def on_step(self, trainer, record: dict) -> None:
        if record["step"] in self.steps:
            self.curve[record["step"]] = self.accuracy(trainer)

    def on_train_end(self, trainer, reason: str) -> None:
        if reason == "finished":
            self.final = self.accuracy(trainer)


@torch.no_grad()
def attention_entropy(model, windows: torch.Tensor) -> float:
    """How spread a causal model's attention is on ``windows`` (N, T) of token ids: each query's
    entropy over the keys it may see, in nats, averaged over the layers, heads, windows and the
    queries that see more than one key, as a fraction of log T (the uniform's over all T keys).
    Near 0: each query puts its weight on one key (the softmax saturated)."""
    with in_mode(model):
        _, cache = model.run_with_cache(windows, names=lambda n: n.endswith("hook_pattern"))
    means = []
    for pattern in cache.values():  # (N, H, T, T)
        p = pattern.double()[:, :, 1:]  # (query 0 sees one key: its entropy is 0 whatever the scores)
        means.append(-(p * torch.log(p.clamp_min(1e-300))).sum(-1).mean())
    return float(torch.stack(means).mean()) / math.log(windows.shape[1])


class EntropyCurve(Callback):
    """:func:`attention_entropy` of the model being trained on fixed ``windows``, before its first
    step and at the logged ``steps`` (no gradients, no random numbers drawn): ``curve`` {step: value}."""

    def __init__(self, windows: torch.Tensor, steps) -> None:
        self.windows, self.steps, self.curve = windows, set(steps), {}

    def on_train_start(self, trainer) -> None:
        self.curve[0] = attention_entropy(trainer.model, self.windows)

    def on_step(self, trainer, record: dict) -> None:
        if record["step"] in self.steps:
            self.curve[record["step"]] = attention_entropy(trainer.model, self.windows)


def train_image_classifier(
    ctx: Context, model, splits, steps: int, name: str, *, seed: int = 0, like: str | None = None, **options
) -> float:
    """Train ``model`` (a ViT or a CNN, its initial weights set by the caller) on the in-memory
    ``splits`` as `attnlab train vit|cnn` trains on the dataset named ``like`` (default: the
    splits' own name): the family's training defaults for that data, its augmentation and its
    loss (:meth:`ImageClassifierRecipe.image_task`); ``options``: the options that differ, by
    their flag's name (``pad``, ``rotate``, ``lr``, ``batch_size``, ...); ``seed``: the batches
    and the augmentation (``--seed 1337 + seed``). Returns the test accuracy; the learning curve
    (a quarter, half, three quarters and all of the run) is kept as ``ctx.cache["curves"][name]``."""
    from types import SimpleNamespace

    from ..recipes import recipe_for

    recipe = recipe_for(model.model_type)
    augment = {k: options.pop(k) for k in ("pad", "flip", "rotate", "label_smoothing") if k in options}
    defaults = recipe.train_defaults_for(SimpleNamespace(data=like or splits.name))
    train = {**claim_training(defaults), "warmup_iters": warmup_for(steps), **options, "seed": 1337 + seed}
    task = recipe.image_task(splits, train["batch_size"], like=like, **augment)
    curve = TestAccuracyCurve(quarter_steps(steps)[:-1])
    fit(ctx, model, task, name, steps, callbacks=[curve], **train)
    keep_curve(ctx, name, curve, steps)
    return curve.final


def keep_curve(ctx: Context, name: str, curve: TestAccuracyCurve, steps: int) -> None:
    """A run's learning curve in ``ctx.cache["curves"][name]`` and which test items it got right at
    its end in ``ctx.cache["correct"][name]`` (:func:`correct_items`)."""
    ctx.cache.setdefault("curves", {})[name] = {**curve.curve, steps: curve.final}
    ctx.cache.setdefault("correct", {})[name] = curve.correct


def correct_items(ctx: Context, names: list[str]) -> np.ndarray:
    """(runs, N) 1.0 where run ``names[i]`` classified test item j right at its end."""
    return np.stack([ctx.cache["correct"][name] for name in names]).astype(float)


def as_the_digits_vit() -> dict:
    """The options that train another family's model as `attnlab train vit` trains on the digits
    (its batch, learning rate, schedule and label smoothing), read from the ViT family: a CNN
    compared with the ViT, or a ViT pretrained on other images, is trained alike."""
    from types import SimpleNamespace

    from ..recipes import recipe_for

    vit = recipe_for("vit")
    train = claim_training(vit.train_defaults_for(SimpleNamespace(data="digits")))
    return {**train, "label_smoothing": vit.LABEL_SMOOTHING["digits"]}


def claim_training(defaults) -> dict:
    """The TrainConfig ``defaults`` where they differ from TrainConfig's, less a claim's own (steps, warmup, evals)."""
    plain, own = vars(type(defaults)()), ("max_iters", "eval_interval", "eval_iters", "warmup_iters")
    return {k: v for k, v in vars(defaults).items() if v != plain[k] and k not in own}


DIGITS_STEPS = (10, 120, 2000)  # the steps every digits model trains for: tiny, --quick, full size


def digits_data(ctx: Context):
    """The embedded digits (once per context): the same at every size."""
    if "digits" not in ctx.cache:
        from ..data import images

        ctx.cache["digits"] = images.digits()
    ctx.cache.setdefault("data_used", []).append("the embedded 8×8 digits")
    return ctx.cache["digits"]


def digits(ctx: Context):
    """The embedded digits (once per context) and the steps every digits model trains for."""
    return digits_data(ctx), ctx.steps(*DIGITS_STEPS)


def digits_vit_config(splits, pos: str = "learned", **options):
    """The digits preset's ViT without its convolutional PEG (a ViT with no convolution at all);
    ``options``: more ViTConfig fields."""
    from ..models import VIT_PRESETS, ViTConfig

    labels = dict(num_classes=10, in_chans=1, labels=splits.labels)
    return ViTConfig(**{**VIT_PRESETS["digits"], "peg": False, "pos": pos, **labels, **options})


def digits_vit_options(ctx: Context, pos: str = "learned", seed: int = 0, steps: int | None = None, **options) -> dict:
    """The options of ``attnlab.train("vit", ...)`` (``attnlab train vit --data digits ...``) that
    train :func:`digits_vit`'s model: the family's own run on the digits, without a PEG, for the
    claim's steps, with the settings every claim shares (:func:`run_settings`)."""
    steps = steps or ctx.steps(*DIGITS_STEPS)
    return {
        "data": "digits",
        "peg": False,
        "pos": pos,
        **options,  # (another dataset too: `data` and its `data_dir`, with their own shape)
        "max_iters": steps,
        "warmup_iters": warmup_for(steps),
        "eval_interval": steps,
        "eval_iters": 2,
        "seed": 1337 + seed,
        **run_settings(),
    }


def digits_vit(ctx: Context, pos: str = "learned", seed: int = 0, steps: int | None = None, **options):
    """A ViT trained on the embedded digits with ``pos`` positions (``options``: more ViT options;
    ``seed``: its initial weights and batches; ``steps``: other than the digits' own), once per
    context, by `attnlab train vit` itself (:func:`attnlab.train` with :func:`digits_vit_options`):
    (model, test accuracy)."""
    from .. import api

    _, default_steps = digits(ctx)
    steps = steps or default_steps
    key = digits_vit_run(ctx, pos, seed, steps, **options)

    def train():
        curve = TestAccuracyCurve(quarter_steps(steps)[:-1])
        run = quietly(
            api.train,
            "vit",
            out=ctx.work / key,
            callbacks=[curve],
            **digits_vit_options(ctx, pos, seed, steps, **options),
        )
        keep_curve(ctx, key, curve, steps)
        return run.model.eval(), curve.final

    return ctx.cached(key, train)


def digits_vit_run(ctx: Context, pos: str = "learned", seed: int = 0, steps: int | None = None, **options) -> str:
    """The run name of :func:`digits_vit` with these arguments: its folder under ``ctx.work``, its
    cache key, and its learning curve's key in ``ctx.cache["curves"]``."""
    default_steps = ctx.steps(*DIGITS_STEPS)
    steps = steps or default_steps
    key = "_".join([f"vit_{pos}", *(f"{k}-{v}" for k, v in sorted(options.items()))])
    return key + ("" if (seed, steps) == (0, default_steps) else f"_{steps}st_s{seed}")


def image_models(ctx: Context, seed: int = 0):
    """A ViT and a CNN trained alike on the embedded digits (once per ``seed``: their initial weights
    and batches), and the test images. Seed 0's test accuracies: ``ctx.cache["vit_acc"]`` and
    ``["cnn_acc"]`` (other seeds': ``["cnn_acc_s1"]`` …)."""
    from ..data.images import normalize

    tag = seed_suffix(seed)

    def train():
        from ..models import CNN, CNNConfig

        splits, steps = digits(ctx)
        torch.manual_seed(seed)
        cnn = CNN(CNNConfig(num_classes=10, in_chans=1, labels=splits.labels, image_size=8, widths=(32, 64)))
        ctx.cache[f"cnn_acc{tag}"] = train_image_classifier(
            ctx, cnn, splits, steps, f"cnn{tag}", seed=seed, **as_the_digits_vit()
        )
        return cnn.eval()

    cnn = ctx.cached(f"cnn{tag}", train)
    if "digits_x" not in ctx.cache:
        splits = digits_data(ctx)
        ctx.cache["digits_x"] = normalize(splits.test[0], splits.mean, splits.std)
    vit, accuracy = digits_vit(ctx, seed=seed)
    ctx.cache[f"vit_acc{tag}"] = accuracy
    return vit, cnn, ctx.cache["digits_x"]
