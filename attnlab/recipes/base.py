"""What a recipe is, and the one path every family trains, resumes and evaluates by.

A recipe says everything attnlab needs to know about one model family: its models and
presets, its training defaults, its data options, how it turns data into a training task,
how it evaluates, which inspections and extra commands it offers. The command line, the
checkpoint loader and the dispatch of ``eval`` / ``inspect`` are all generated from the
registry of recipes (:mod:`attnlab.recipes`), so a new family is one recipe file plus its model.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

from ..config import option_fields
from ..errors import AttnlabError, CheckpointError, Note, OptionError, a, one_line
from ..options import (
    shown_default,
    ATTRIBUTION_METHOD,
    ATTRIBUTION_STEPS,
    Arg,
    AttributionMethod,
    AttributionSteps,
    Command,
    DataDir,
    Device,
    Which,
    OptionSpecs,
    checked,
    declared,
    named,
    nonneg_int,
    positive_int,
)
from ..training.runs import TrainConfig, TrainingRun


# what every family's tiny run shares (:attr:`Recipe.tiny`): two steps of four examples on the CPU, quietly
TINY_RUN = dict(max_iters=2, eval_interval=2, eval_iters=1, batch_size=4, progress=False, device="cpu")


@dataclass(frozen=True)
class ModelKind:
    """One model type of a family (config.json's ``model_type``): its config class (whose fields are
    options of ``attnlab train``), its model class or where it is (``"attnlab.models.gpt:GPT"``,
    imported when a model is built, so that declaring the family imports no torch) and the family's
    verbs that a model loaded by :func:`attnlab.load` has (``GPTVerbs``): the loaded class is the
    model class with those verbs mixed in (a loaded GPT is still a GPT)."""

    config_class: type
    model: type | str
    verbs: type

    @property
    def model_class(self) -> type:
        import importlib

        if not isinstance(self.model, str):
            return self.model
        module, _, name = self.model.partition(":")
        return getattr(importlib.import_module(module), name)

    @property
    def loaded_class(self) -> type:
        return loaded_model_class(self.verbs, self.model_class)


@functools.lru_cache(maxsize=None)
def loaded_model_class(verbs: type, model_class: type) -> type:
    """``model_class`` with the family's ``verbs`` (one class per pair, made once)."""
    doc = f"A {model_class.__name__} as :func:`attnlab.load` returns it: the model with {verbs.__name__}."
    return type(f"{model_class.__name__}Model", (verbs, model_class), {"__doc__": doc, "__module__": verbs.__module__})


@dataclass(frozen=True)
class ExploreInput:
    """One input of a family's explorer, declared once: the ``explore()`` keyword and the flag of
    ``attnlab explore`` (:func:`explore_input_specs` gathers every family's), the JSON field ``attnlab
    serve`` reads, and the box its page shows for it."""

    name: str
    box: str = "text"  # text (several lines) | line (one line) | image (an image file, uploaded as base64)
    placeholder: str = ""
    help: str = "the text to look at"  # the flag's help (explore_input_specs names the families that read it)

    def __post_init__(self) -> None:
        if self.box not in ("text", "line", "image"):
            raise ValueError(f"ExploreInput {self.name!r}: box {self.box!r} is not text, line or image")


@dataclass(frozen=True)
class ExplorerForm:
    """What the page of ``attnlab serve`` asks for: one line saying it, then the inputs' boxes."""

    hint: str
    inputs: tuple[ExploreInput, ...]


# the forms of the three standard explorers (a family's ``explore_kind``); a family may declare its own
EXPLORER_FORMS = {
    "text": ExplorerForm("Type a text: the page shows its attention.", (ExploreInput("text", "text", "some text"),)),
    "image": ExplorerForm(
        "Choose an image: the page shows where each patch attends.",
        (ExploreInput("image", "image", help="the image to look at"),),
    ),
    "cross": ExplorerForm(
        "Type a source sentence (and, if you like, its translation).",
        (
            ExploreInput("src", "line", "source", "the source sentence"),
            ExploreInput("tgt", "line", "target (default: the model's translation)", "a target sentence (default: "
                         "the model's translation)"),
        ),
    ),
}  # fmt: skip


TEXT_HELP = (
    "the text to look at (gpt: lens, attribution, logit-attribution, heads; encoder: lens; seq2seq alignment: "
    "the sentence to translate)"
)


IMAGE_HELP = "the image file to look at (attention, rollout, caption, attribution, lens)"


@dataclass(frozen=True)
class Inspection:
    """The options of ``attnlab inspect`` (and ``model.inspect()``) that a family's inspections
    read, declared by the fields of a dataclass like this one (``Recipe.inspect_options``)."""

    data_dir: DataDir = None


@dataclass(frozen=True)
class TextInspection(Inspection):
    text: Annotated[str | None, Arg(TEXT_HELP)] = None


@dataclass(frozen=True)
class ImageInspection(Inspection):
    image: Annotated[str | None, Arg(IMAGE_HELP)] = None


@dataclass(frozen=True)
class Attribution(Inspection):
    """``--method``, ``--steps`` and ``--baseline`` of the attribution inspections (one set for
    every family: ``inspect`` shares its options)."""

    method: AttributionMethod = ATTRIBUTION_METHOD
    steps: AttributionSteps = ATTRIBUTION_STEPS
    baseline: Annotated[
        str | None,
        Arg("attribution: the integrated-gradients baseline: zeros (default: zero embeddings, the mean image); images "
            "also blur (the image blurred: colours kept, detail removed); text also one token's text, e.g. ' ' (that "
            "token at every position)"),
    ] = None  # fmt: skip


@dataclass(frozen=True)
class Evaluation:
    """What every family's evaluation reads (the options of ``attnlab eval`` that every family
    takes, declared by these fields): the data (None: the run's own), the split (None: the
    family's usual one), examples per batch and how many batches; ``intervene(model)``: a context
    in which the model runs (``attnlab ablate``: parts silenced)."""

    data: Annotated[str | None, Arg("evaluate on this data instead of the run's own")] = None
    data_dir: DataDir = None
    split: Annotated[
        Literal["val", "train", "test"] | None,
        Arg("which split (default: val for language models, test for the others)"),
    ] = None
    batch_size: Annotated[int, Arg("examples per forward pass", positive_int)] = 16
    max_batches: Annotated[
        int | None,
        Arg("evaluate the first N batches of the split only: a quick look (default: the whole split)", positive_int),
    ] = None
    intervene: Callable[[Any], Any] | None = None

    def count(self, n: int) -> int:
        """How many of ``n`` examples are read: all, or ``max_batches`` batches' worth."""
        return n if not self.max_batches else min(n, self.max_batches * self.batch_size)

    def within(self, model):
        """The context ``model`` is evaluated in (parts ablated, or none)."""
        return self.intervene(model) if self.intervene is not None else contextlib.nullcontext()


def read_image(path, channels: int, size: int | None):
    """One image file as the model takes it, (C, H, W) in [0, 1]; a conversion made (resized,
    grey to colour) is said as a :class:`attnlab.errors.Note`."""
    from ..data.images import load_image

    img, note = load_image(path, channels, size)
    if note:
        warnings.warn(note, Note, stacklevel=2)
    return img


ConfusionPNG = Annotated[str | None, Arg("classifiers: also draw the confusion matrix into this PNG")]


def confusion_figure(scores: dict, labels, title: str, out_file: Path | None, res: dict) -> str:
    """Draw the confusion matrix of a task's ``scores`` into ``out_file`` when one was asked for
    (its path then in ``res``); returns what the eval line says of it ("" when none)."""
    if out_file is None:
        return ""
    from ..inspect.plots import confusion_matrix_png

    title = f"{title}: accuracy {scores['accuracy']:.4f}"
    confusion_matrix_png(scores["confusion"].numpy(), list(labels), out_file, title=title)
    res["confusion_png"] = str(out_file)
    return f"; confusion matrix {out_file}"


@dataclass(frozen=True)
class TrainOptions:
    """A family's own options of ``attnlab train NAME`` and ``attnlab.train(NAME)`` (its data and
    task; the model's and the trainer's come from their config dataclasses), declared by the fields
    of a subclass (``Recipe.train_options``): what the family's ``prepare`` reads."""

    data: Annotated[str | None, Arg("the data to train on (default: the family's embedded data)")] = None
    data_dir: DataDir = None


RUN_PLACE = ("out", "resume", "config")  # where a run is and what it repeats: train()'s own keywords


EVALUATION_FIELDS = ("data", "data_dir", "split", "batch_size", "max_batches")


class Recipe:
    """One model family. Subclasses fill in the class attributes and override the hooks."""

    name: str = ""  # `attnlab train NAME`
    help: str = ""
    description: str = ""
    models: dict[str, ModelKind] = {}  # model_type (as saved in config.json) -> its config, class and verbs
    presets: dict[str, dict] = {}
    set_by_data: tuple[str, ...] = ()  # config fields that follow from the data, not options
    follows_data: tuple[str, ...] = ()  # options whose value, when not given, the data decides
    train_defaults = TrainConfig()  # the trainer's defaults for this family: TrainConfig(lr=..., ...)
    inspections: dict[str, str] = {}  # `attnlab inspect WHAT` -> help
    explore_kind: str | None = None  # what `attnlab explore` / `serve` show: text | image | cross
    explore_form: ExplorerForm | None = None  # what `serve`'s page asks for (None: its explore_kind's)
    # wall time of the embedded default run on 2 CPU cores: (alone, with another job using both cores),
    # as benchmarks/first_hour.py measures them (one number: measured alone)
    default_seconds: int | tuple[int, int] | None = None
    target_is_loss = False  # --target is a validation loss (reached from above), not a fraction
    ablatable = False  # its evaluate() applies ``options.intervene`` (``attnlab ablate``, ``evaluate(ablate=)``)
    # the options of a run of a few seconds on the embedded data: for tests (one test trains, loads,
    # evaluates and explores every registered family with them) and quick looks
    tiny: dict = {}

    @property
    def default_out(self) -> str:
        return f"runs/{self.name}"

    def config_classes(self) -> list[type]:
        return list(dict.fromkeys(m.config_class for m in self.models.values()))

    # ---- command line ------------------------------------------------------------------------
    train_options: type = TrainOptions  # the dataclass whose fields are its own train options

    def train_specs(self) -> OptionSpecs:
        """Every option of ``attnlab train NAME`` / :func:`attnlab.train`: the family's own, then
        its model's fields (those the data does not set) and the trainer's, each --help saying the
        value a run given no options uses (:meth:`default_values`)."""
        specs = declared(self.train_options)
        specs.add(
            "--out",
            default=self.default_out,
            help=f"run folder for checkpoints, metrics and plots (default: {self.default_out})",
        )
        specs.add("--resume", kind="flag", help="continue the run in --out from its last checkpoint")
        specs.add(
            "--config",
            default=None,
            help="a YAML or JSON file of options (preset: nano, lr: 0.01, ...), or a run folder to re-run "
            "(its options.json); the flags given beside it override it",
        )
        shown = self.shown_defaults()
        title = "model" + (" (overrides the preset)" if self.presets else "")
        specs.merge(declared(*self.config_classes(), skip=self.set_by_data, shown=shown, group=title))
        specs.merge(declared(TrainConfig, shown=shown, group="training"))
        return specs

    def preset_fields(self, o) -> dict:
        """The model fields a new run starts from, before the options given and the data: the
        preset's (``o.preset``, where the family has presets), for the first of :meth:`config_classes`."""
        return dict(self.presets.get(getattr(o, "preset", None) or "", {}))

    def default_values(self) -> dict[str, Any]:
        """Every option of ``train`` -> the value a run given no options uses: the family's option
        defaults, the model config's under the default preset, the trainer's under the family's
        training defaults. None where the data decides (``follows_data``) or 'unset' means
        automatic (``--threads``, ``--compile``)."""
        import dataclasses

        own = self.train_options()  # (its own options at their defaults)
        values: dict[str, Any] = dataclasses.asdict(own)
        for i, cls in enumerate(self.config_classes()):
            start = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
            start.update(self.preset_fields(own) if i == 0 else {})
            for name in option_fields(cls):
                if name not in self.set_by_data and name not in values:
                    values[name] = None if name in self.follows_data else start.get(name)
        values.update(dataclasses.asdict(self.train_defaults_for(own)))
        return values

    def shown_defaults(self) -> dict[str, str]:
        """:meth:`default_values` as --help shows them (on/off, 'from the data'), a field that
        another of this family's models starts elsewhere followed by that model's value."""
        import dataclasses

        values = self.default_values()
        shown = {n: shown_default(v) for n, v in values.items() if v is not None}
        shown.update({n: "from the data" for n in self.follows_data})
        classes = self.config_classes()
        first = {f.name for f in dataclasses.fields(classes[0])} if classes else set()
        for mtype, model in self.models.items():
            if model.config_class is classes[0]:
                continue
            for f in dataclasses.fields(model.config_class):
                if f.name in first and f.name in shown and f.default is not dataclasses.MISSING:
                    if f.default != values.get(f.name) and f.name not in self.follows_data:
                        shown[f.name] += f"; {mtype}: {shown_default(f.default)}"
        return shown

    @functools.cached_property
    def train_arguments(self) -> type:
        """The typed options of ``attnlab train NAME`` / :func:`attnlab.train`: a dataclass with one
        keyword field per option (its type, its help in the field's metadata), whose default
        instance is what a run given no options uses (:meth:`default_values`); a value given is
        checked as its flag is. Made from the declarations, once per family."""
        import dataclasses

        specs, defaults = self.train_specs(), self.default_values()
        fields = []
        for name, spec in specs.specs.items():
            if name in RUN_PLACE:
                continue
            default, annotation = defaults.get(name), spec.annotation
            if default is None and annotation is not None:
                annotation = annotation | None
            fields.append((name, annotation, dataclasses.field(default=default, metadata={"help": spec.help})))

        def __post_init__(options) -> None:  # each value given checked as its flag is (its type, bound, choices)
            for name, value in vars(options).items():
                if value is not None and value != defaults.get(name):
                    setattr(options, name, specs.check(name, value))

        classes = self.config_classes()  # (named after its model: GPTTrain, ViTTrain)
        title = classes[0].__name__.removesuffix("Config") if classes else self.name.capitalize()
        doc = (
            f"The options of ``attnlab train {self.name}`` (and :func:`attnlab.train`), typed; "
            f"``{title}Train()`` holds the values a run given none uses (None: the data or the "
            "machine decides). ``attnlab.train(options)`` trains with them."
        )
        namespace = {"__post_init__": __post_init__, "family": self.name, "__doc__": doc, "__module__": "attnlab.api"}
        return dataclasses.make_dataclass(f"{title}Train", fields, namespace=namespace, kw_only=True)

    def model_fields(self) -> list[str]:
        return [n for cls in self.config_classes() for n in option_fields(cls) if n not in self.set_by_data]

    def eval_specs(self) -> OptionSpecs:
        """The options of ``attnlab eval`` / ``model.evaluate()`` for this family: those of every
        family (:class:`Evaluation`), then those its :meth:`evaluate` declares in its signature."""
        return declared(Evaluation, self.evaluate)

    def commands(self) -> list[Command]:
        """Extra top-level commands (``sample``, ``translate``, ``caption``, ``embed``)."""
        return []

    # ---- training (what :func:`attnlab.training.runs.train` asks of a family) ---------------------
    def train_defaults_for(self, o) -> TrainConfig:
        """The training defaults of a new run given its own options ``o`` (a family may size them
        to its data: ``dataclasses.replace(self.train_defaults, ...)``)."""
        return self.train_defaults

    def check_new(self, o, model_over: dict) -> None:
        """Refuse bad options of a new run before anything is read or written."""

    def run_options(self, o, saved: dict) -> dict[str, tuple]:
        """Options besides the model fields that a resumed run cannot change: {option: (given
        now or None, the run's value)}."""
        return {}

    def prepare(self, o, saved: dict | None, model_over: dict, tcfg, out: Path) -> TrainingRun:
        """Read the data and return the run (for a resumed run, from its ``saved`` config) into
        the run folder ``out``, given its own options ``o`` (a :attr:`train_options`)."""
        raise NotImplementedError

    def finish(self, o, run: TrainingRun, trainer, result: dict) -> list[str]:
        """What the run says at its end (after its last checkpoint), given its own options ``o``."""
        return [f"done: step {result['step']}, {trainer.checkpoints_line()}, run folder {trainer.out}"]

    # ---- using a trained model ---------------------------------------------------------------
    def evaluate(self, model, on: Evaluation) -> tuple[dict, str]:
        """``attnlab eval`` and ``model.evaluate()``: the metrics of ``model`` (in memory) on
        ``on`` (the data, split and batches), and one line saying them; a family declares its own
        options as keyword parameters (``Annotated[int, Arg(...)]``)."""
        raise CheckpointError(f"attnlab eval does not know how to evaluate {self.name} models yet")

    inspect_options: type = Inspection  # the dataclass whose fields are its inspections' options

    def inspect(self, model, what: str, out: Path, options) -> dict:
        """Draw the inspection ``what`` of ``model`` (in memory) to the PNG ``out``, given
        ``options`` (an :attr:`inspect_options`); return the numbers behind it (saved beside it)."""
        raise CheckpointError(f"{self.name} models offer no inspections")

    def explorer_form(self) -> ExplorerForm | None:
        """What ``attnlab serve``'s page asks for (None: this family is not explored)."""
        return self.explore_form or EXPLORER_FORMS.get(self.explore_kind or "")

    def required_explorer_form(self, ckpt) -> ExplorerForm:
        """:meth:`explorer_form` for the model in ``ckpt``, or the one-line refusal of a family the
        explorer does not show (what `explore`, ``explore()`` and `serve` say alike)."""
        form = self.explorer_form()
        if form is None:
            raise CheckpointError(
                f"{ckpt} holds {a(self.name)} model; the explorer does not show {self.name} models yet"
            )
        return form

    def explore(self, model, **inputs) -> dict:
        """The data of ``attnlab explore`` for ``model`` (in memory) and the ``inputs`` its
        explorer form declares, by name (see :mod:`attnlab.inspect.explorer`)."""
        raise CheckpointError(f"attnlab explore does not show {self.name} models yet")

    # ---- the Python API's loaded model --------------------------------------------------------
    def loaded_class(self, model_cls: type) -> type:
        """The family's loaded class of ``model_cls`` (the model with its family's verbs; a
        HuggingFace checkpoint's converter names the model class it builds)."""
        found = [kind for kind in self.models.values() if issubclass(model_cls, kind.model_class)]
        if not found:
            raise CheckpointError(
                f"the {self.name} family declares no model type for {model_cls.__name__}: give its recipe "
                f"models = {{model type: ModelKind(config, 'module:{model_cls.__name__}', verbs)}}"
            )
        return loaded_model_class(found[0].verbs, model_cls)

    needs: str = ""  # a command's words for this family's models when given another's ("a captioner (...)")

    @classmethod
    def model_types(cls) -> tuple[str, ...]:
        """The model types (config.json's ``model_type``) this family's commands read."""
        return tuple(cls.models)

    @classmethod
    def model_of(cls, ckpt, device: str | None = "auto", dtype=None):
        """The model in ``ckpt`` (one of :meth:`model_types`; another is refused in one line saying
        what is needed) through the one loader (:func:`attnlab.recipes.load_model`), with its verbs
        and what they read (``tokenizer``, ``vocab``, ``mean`` / ``std``, ``run_meta``, ``device``):
        what :func:`attnlab.load` and the family's commands read (``device`` None: the CPU).
        ``dtype``: a torch dtype for the weights (default: as saved, HuggingFace's in float32). A
        family's verbs receive the model in memory and never read it again."""
        from ..training.devices import pick_device
        from . import load_model

        where = str(pick_device(device)) if device else None
        needs = cls.needs or None
        return load_model(ckpt, expect=cls.model_types(), device=where, needs=needs, dtype=dtype)

    def predict(self, ckpt, inputs: list[str], *, top_k: int, device: str) -> int:
        """``attnlab predict`` for this family's checkpoints (classifiers): printed."""
        raise CheckpointError(
            f"{ckpt} holds {a(self.name)} model; predict needs a classifier (train vit, cnn, "
            "or encoder --task classify)"
        )


# ---- the options of the verbs every family shares, declared once for the command and the verb ----------
TopK = Annotated[int, Arg("classes to show per input", positive_int)]


def predict(
    ckpt: Annotated[str, Arg("run folder of a classifier")],
    inputs: Annotated[
        list[str],
        Arg(
            "image files (image classifiers) or texts (text classifiers)", flags=("inputs",), nargs="+", metavar="INPUT"
        ),
    ],
    *,
    top_k: TopK = 3,
    device: Device = "auto",
) -> int:
    """``attnlab predict``: the classes of each input, as the family of ``ckpt`` prints them."""
    from . import checkpoint_recipe

    return checkpoint_recipe(ckpt).predict(ckpt, inputs, top_k=top_k, device=device)


def explore_inputs() -> dict[str, tuple[ExploreInput, list[str]]]:
    """Every explorer input a registered family declares -> (its first declaration, the families
    that read it), in the registry's order."""
    from . import recipes

    inputs: dict[str, tuple[ExploreInput, list[str]]] = {}
    for recipe in recipes():
        form = recipe.explorer_form()
        for i in form.inputs if form else ():
            inputs.setdefault(i.name, (i, []))[1].append(recipe.name)
    return inputs


def explore_input_specs() -> OptionSpecs:
    """`attnlab explore`'s input flags: every family's explorer inputs (:meth:`Recipe.explorer_form`),
    each one flag whose help names the families that read it."""
    e = OptionSpecs()
    for name, (declared_input, families) in explore_inputs().items():
        e.add(f"--{name.replace('_', '-')}", default=None, help=f"{', '.join(families)}: {declared_input.help}")
    return e


def top_labels(probs, labels, top_k: int) -> list[list[tuple[str, float]]]:
    """The ``top_k`` (label, probability) pairs of each row of ``probs`` (N, classes), most likely first."""
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise OptionError(f"top_k={top_k!r}: must be an integer of at least 1")
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    return [[(str(labels[i]), p) for p, i in zip(v.tolist(), ix.tolist())] for v, ix in zip(top.values, top.indices)]


class Verbs:
    """What every model loaded by :func:`attnlab.load` can do besides its forward pass. A family
    adds its own verbs in a subclass, mixed into its loaded classes (``Recipe.loaded``); ``attach`` reads what they need (the
    tokenizer, the image statistics) from the run's config.json."""

    checkpoint: str
    run_meta: dict

    def attach(self, meta: dict) -> None:
        """Read the tokenizer / vocabulary / image statistics from the run's config (``meta``)."""

    @property
    def device(self):
        return next(self.parameters()).device

    recipe: "Recipe"  # its family, known since it was loaded (its folder is not read again)

    def family_recipe(self) -> "Recipe":
        return self.recipe

    @checked
    def evaluate(
        self,
        data: str | None = None,
        *,
        split: str | None = None,
        which: Which = None,
        ablate: str | list[tuple[int, int]] | dict | None = None,
        ablation: str = "zero",
        **options,
    ) -> dict:
        """The metrics of ``attnlab eval``: loss / perplexity (language models), accuracy
        (classifiers), BLEU (seq2seq), ... on the run's own data or on ``data``. ``options``: the
        options of ``attnlab eval`` by name (``batch_size``, ``max_tokens``, ``beam``, ...).
        ``which``: evaluate the run's best or last checkpoint on disk instead of this model.
        ``ablate``: parts to silence while evaluating: heads, MLP neurons and whole sublayers as
        text (``"0.1,1.mlp.17,1.attn"``, see :func:`attnlab.inspect.patching.parse_parts`), a list
        of (layer, head) pairs, or the keyword arguments of ``ablated`` ({"heads": ..., "neurons":
        ..., "outputs": ...}); ``ablation`` "zero" or "mean" (each part's mean over the batch).
        What ``attnlab ablate`` reports."""
        from ..inspect.patching import ablated, check_parts, parse_parts

        recipe = self.family_recipe()
        values = recipe.eval_specs().checked({"data": data, "split": split, **options}, "evaluate")
        model = self
        if which is not None:  # (the run's other checkpoint, read from disk, where this model is)
            from ..checkpoint import pick_checkpoint

            model = recipe.model_of(pick_checkpoint(self.checkpoint, which), str(self.device))
        intervene = None
        if ablate is not None:
            if not recipe.ablatable:
                raise OptionError(
                    f"ablate: evaluating {recipe.name} models with parts ablated is not supported yet "
                    "(GPTs and image classifiers are); use attnlab.inspect.patching.ablated with your own loop"
                )
            if not isinstance(ablate, (str, dict, list, tuple)):
                raise OptionError(
                    f"ablate={ablate!r:.40}: give parts as text ('0.1,1.mlp.17'), a list of (layer, head) pairs, "
                    "or a dict of heads / neurons / outputs"
                )
            if isinstance(ablate, str):
                parts = parse_parts(ablate)
            elif isinstance(ablate, dict):
                parts = {k: [tuple(p) for p in ablate.get(k, ())] for k in ("heads", "neurons", "outputs")}
            else:
                parts = {"heads": [tuple(h) for h in ablate], "neurons": [], "outputs": []}
            check_parts(self, how=ablation, **parts)  # before any work
            intervene = lambda m: ablated(m, how=ablation, **parts)  # noqa: E731
        from ..hooks import in_mode

        with in_mode(model), as_option_errors():
            return evaluation(model, values, intervene)[0]

    def inspect(self, what: str, out: str | Path, **options) -> Path:
        """What ``attnlab inspect WHAT --out FILE.png`` draws, written to ``out`` (with its numbers
        in a .npz beside it); returns the PNG's path. ``what``: one of the family's inspections
        (``Recipe.inspections``); ``options``: the fields of its ``Recipe.inspect_options``
        (``image=``, ``text=``, ...)."""
        import numpy as np

        from ..outputs import output_file

        recipe = self.family_recipe()
        if not isinstance(what, str) or what not in recipe.inspections:
            raise OptionError(f"inspect {what!r}: {recipe.name} models offer {', '.join(recipe.inspections) or 'none'}")
        values = declared(recipe.inspect_options).checked(options, f"inspect {what}")
        out = output_file(out, ".png", "out=")
        out.parent.mkdir(parents=True, exist_ok=True)
        from ..hooks import in_mode

        with in_mode(self), as_option_errors():
            raw = recipe.inspect(self, what, out, recipe.inspect_options(**values))
        np.savez(out.with_suffix(".npz"), **raw)
        return out

    @checked
    def explore(
        self,
        *,
        generate: Annotated[
            int,
            Arg(
                "GPT: continue --text by N greedy tokens and show the attention of each as it was produced", nonneg_int
            ),
        ] = 0,
        sae: Annotated[
            str | Path | None, Arg("GPT: a folder written by attnlab sae train; each position lists its active latents")
        ] = None,
        **inputs: str | None,
    ):
        """What ``attnlab explore`` shows, as an :class:`attnlab.inspect.explorer.Exploration`
        (inline in Jupyter; ``.save("page.html")``), given the ``inputs`` its family's explorer form
        declares (:meth:`Recipe.explorer_form`): GPT and text encoders ``text=``; ViT ``image=`` (a
        file); seq2seq ``src=`` (and ``tgt=`` to force a target). GPTs: ``generate=N`` continues
        the text by N greedy tokens and shows the attention of each as it was produced. ``sae``: a
        folder written by ``attnlab sae train`` on this GPT: each position lists its most active latents."""
        from ..inspect.explorer import Exploration

        data = explored(self, inputs, generate=generate, sae=sae, spelling="=")
        return Exploration(data, f"attnlab explorer: {Path(self.checkpoint).name}")


def evaluation(model, values: dict[str, Any], intervene=None) -> tuple[dict, str]:
    """(the metrics, one line saying them) of ``model`` (a loaded model, in memory) by its family's
    :meth:`Recipe.evaluate`, given the checked ``values`` of its eval options (:meth:`Recipe.eval_specs`):
    what ``attnlab eval`` prints and ``model.evaluate()`` returns."""
    from ..checkpoint import find_checkpoint

    on = Evaluation(**{k: v for k, v in values.items() if k in EVALUATION_FIELDS}, intervene=intervene)
    own = {k: v for k, v in values.items() if k not in EVALUATION_FIELDS}
    metrics, line = model.family_recipe().evaluate(model, on, **own)
    return {**metrics, "checkpoint": str(find_checkpoint(model.checkpoint))}, line


def explored_inputs(recipe: Recipe, ckpt, given: dict[str, Any], spelling: str) -> dict[str, Any]:
    """Every explorer input of every family -> its value in ``given`` (None where not given), once
    the inputs given are checked to be ones ``recipe``'s explorer reads for the model in ``ckpt``
    (``spelling``: "=" names them as keywords, "--" as flags): what `attnlab explore` and
    ``explore()`` pass the family."""
    reads = [i.name for i in recipe.required_explorer_form(ckpt).inputs]
    known = explore_inputs()
    spelled = (lambda n: f"--{n.replace('_', '-')}") if spelling == "--" else (lambda n: f"{n}=")
    for name, value in given.items():
        if value is not None and not isinstance(value, (str, Path)):
            raise OptionError(f"{named(name, value)}: must be a string")
    for name in (n for n, value in given.items() if value is not None and n not in reads):
        what = "is no explorer input of any family" if name not in known else f"is not read by {recipe.name} models"
        raise OptionError(f"{spelled(name)} {what}; give {', '.join(map(spelled, reads))}")
    return {name: given.get(name) for name in known}


def explored(model, given: dict[str, Any], *, generate: int = 0, sae=None, spelling: str = "=") -> dict:
    """The explorer's data for ``model`` (in memory) and the inputs ``given`` (every family's
    input by name, None where not given; checked by :func:`explored_inputs`): what `attnlab
    explore`, ``explore()`` and `attnlab serve` show. ``generate`` and ``sae`` are the GPT's own."""
    import inspect

    recipe = model.family_recipe()
    values = explored_inputs(recipe, model.checkpoint, given, spelling)
    inputs = {i.name: values[i.name] for i in recipe.required_explorer_form(model.checkpoint).inputs}
    takes = inspect.signature(recipe.explore).parameters
    extra = {"generate": generate, "sae": sae}
    does = {"generate": "continues a GPT's text", "sae": "shows an SAE's latents on a GPT's text"}
    for name, value in extra.items():
        if value and name not in takes:
            flag = f"--{name}" if spelling == "--" else f"{name}="
            raise OptionError(f"{flag} {does[name]}; {model.checkpoint} holds {a(recipe.name)} model")
    # the views are computed on this model itself (a server's one loaded model), not a fresh copy
    # read from its checkpoint, which may have changed since
    from ..hooks import in_mode

    with in_mode(model), as_option_errors():
        return recipe.explore(model, **inputs, **{n: v for n, v in extra.items() if n in takes})


@contextlib.contextmanager
def as_option_errors():
    """A family's own refusal (a ``ValueError`` saying what to give: "explore a ViT with --image
    FILE") reaches a Python caller as the API's :class:`OptionError`, in the same words."""
    try:
        yield
    except ValueError as e:
        if isinstance(e, AttnlabError):
            raise
        raise OptionError(one_line(e)) from None
