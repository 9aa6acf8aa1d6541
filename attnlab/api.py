"""The Python API: everything the command line does, as functions that return values.

    run = attnlab.train("gpt", data="shakespeare", out="runs/shk", max_iters=500)   # -> Run
    model = attnlab.load("runs/shk")             # a GPT that knows its tokenizer
    model.generate("ROMEO:", max_new_tokens=200)
    attnlab.evaluate(model)                      # {"loss": ..., "perplexity": ...}
    attnlab.explore(model, text="To be or not")  # renders inline in Jupyter; .save("page.html")

Options have the names of the command line's flags (``--max-iters`` is ``max_iters``) and are
checked the same way; a bad one raises :class:`attnlab.errors.OptionError` (an
:class:`~attnlab.errors.AttnlabError`) with the command line's one-line message. The command
line (:mod:`attnlab.cli`) parses its flags and calls these functions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import AttnlabError, OptionError
from .recipes import Recipe, checkpoint_recipe, recipes
from .options import OptionSpecs, path_argument
from .recipes.base import Verbs

if TYPE_CHECKING:
    from _typeshed import DataclassInstance  # (train_args' dataclasses)

    from .inspect.explorer import Exploration
    from .training.callbacks import Callback

__all__ = ["train", "Run", "load", "evaluate", "explore", "Exploration", "families", "train_options", "train_args"]


def families() -> list[str]:
    """The names ``train`` takes: gpt, vit, cnn, seq2seq, encoder, caption, ..."""
    return [r.name for r in recipes()]


def _recipe(family: str) -> Recipe:
    for r in recipes():
        if r.name == family:
            return r
    raise OptionError(f"unknown model family {family!r}; choose one of {', '.join(families())}")


# ---- training ---------------------------------------------------------------------------------------
def train_args(family: str) -> type:
    """The typed options of ``train(family)``: a dataclass with one keyword field per option of
    ``attnlab train <family>`` (``GPTTrain(lr=3e-4, max_iters=500)``), each typed and checked as
    its flag is; its default instance holds what a run given no options uses. ``train`` takes an
    instance in place of the family's name (a field left at its default counts as not given)."""
    return _recipe(family).train_arguments


def train_options(family: str) -> dict[str, Any]:
    """Every option ``train(family, ...)`` takes -> the value a run given no options uses (the
    default preset's and the family's training defaults; None where the data decides, or where
    unset means automatic, such as ``threads``): :func:`train_args`'s default instance as a dict."""
    import dataclasses

    return dataclasses.asdict(train_args(family)())


def train(
    family: str | DataclassInstance,
    *,
    data: str | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    config: str | Path | None = None,
    callbacks: list[Callback] | None = None,
    **options: Any,
) -> Run:
    """Train a model of ``family`` (see :func:`families`) and return the :class:`Run`.

    ``family`` is the family's name, or its typed options (:func:`train_args`:
    ``attnlab.train(attnlab.train_args("gpt")(lr=3e-4, max_iters=500))``).

    ``data``: a file, folder or dataset name (None: the family's embedded default); ``out``: the
    run folder (default ``runs/<family>``); ``resume``: continue the run in ``out`` exactly.
    ``config``: a YAML or JSON file of options, or a run folder to re-run (its ``options.json``);
    ``data`` and ``options`` given here override it. ``callbacks``: :class:`attnlab.Callback`
    instances, told of the run's events (steps, evaluations, checkpoints, its end).
    ``options``: any option of ``attnlab train <family>`` by its flag's name (``preset``,
    ``layers``, ``lr``, ``max_iters``, ``device``, ``dtype``, ...; :func:`train_options` lists them).
    """
    import dataclasses
    import sys

    from .training.runs import train as train_run

    if out is not None and not isinstance(out, (str, Path)):  # ('' is refused below, with the flag's words)
        path_argument(out, "out")
    if not isinstance(resume, bool):  # (resume="no" is true to Python)
        raise OptionError(f"resume={resume!r}: must be True (continue the run in out) or False")
    name = family if isinstance(family, str) else str(getattr(family, "family", family))
    if not isinstance(family, str):  # (typed options: those not at their default)
        defaults = train_options(name)
        options = {**{k: v for k, v in dataclasses.asdict(family).items() if v != defaults[k]}, **options}
    recipe = _recipe(name)
    specs = recipe.train_specs()
    alias_of = {f.lstrip("-").replace("-", "_"): s.dest for s in specs for f in s.flags}  # every flag's name -> option
    if config is not None:
        file_data, from_file = _config_options(recipe, name, config, specs, alias_of)
        data = file_data if data is None else data
        options = {**from_file, **options}
    values: dict[str, Any] = {n: s.default for n, s in specs.specs.items()}
    for option, value in options.items():
        key = alias_of.get(option, option)
        if key in ("out", "resume", "data", "config", "callbacks"):
            raise OptionError(f"give {key} as train({name!r}, {key}=...), not among the options")
        if key in specs and option in alias_of:
            values[key] = specs.check(key, value)
        elif option in recipe.set_by_data:
            raise OptionError(f"{option} follows from the data for {name} models; it is not an option")
        else:
            raise OptionError(f"train {name} has no option {option!r}; attnlab.train_options({name!r}) lists them")
    if data is not None:
        values["data"] = specs.check("data", str(data)) if "data" in specs else str(data)
    if values.get("init"):  # --init gpt2: a HuggingFace hub name
        from .hub import resolve

        values["init"] = str(resolve(values["init"]))
    if callbacks is not None:
        from .training.callbacks import CallbackList

        try:
            CallbackList(list(callbacks))
        except TypeError as e:
            raise OptionError(str(e)) from None
    run_folder = str(out) if out is not None else recipe.default_out  # ('' is refused by the run, not made '.')
    from .checkpoint import abandon_new_runs

    def say(line: str) -> None:  # (the run's header, resuming and its end: on stderr, as its progress)
        print(line, file=sys.stderr)

    try:
        result = train_run(recipe, values, out=run_folder, resume=bool(resume), callbacks=callbacks, say=say)
    except ValueError as e:  # a config's own check (a model too large, --lr <= 0): the API's error type
        abandon_new_runs()  # a refused run leaves no folder behind, as on the command line
        if isinstance(e, AttnlabError):
            raise
        raise OptionError(str(e)) from None
    except BaseException:
        abandon_new_runs()
        raise
    result.model.eval()
    return Run(name, Path(run_folder), result.step, result.best_val, result.model)


def _config_options(
    recipe: Recipe, family: str, config: str | Path, specs: OptionSpecs, alias_of: dict[str, str]
) -> tuple[Any, dict[str, Any]]:
    """What a ``config`` file (or a run folder's options.json) gives ``train(family)``, whose
    options are ``specs``: (its ``data``, its other options). A value the run would take anyway is
    left out: it stays what the family decides (a default --target that this data has no metric
    for, a caption --heads its --arch lacks). A number written as text (YAML reads ``1e-3`` so) is
    read as its flag's would be."""
    from .runoptions import NOT_REPLAYED, read_options

    defaults = recipe.default_values()
    from_file = read_options(config, family, tuple(recipe.models), tuple(specs.specs))
    unknown = sorted(k for k in from_file if k not in alias_of and k not in NOT_REPLAYED)
    if unknown:
        raise OptionError(
            f"--config {config}: train {family} has no option {unknown[0]!r}; "
            f"attnlab.train_options({family!r}) lists them"
        )
    for k, v in from_file.items():
        check = specs.specs[alias_of[k]].type if k in alias_of else None
        if isinstance(v, str) and getattr(check, "bounds", None):
            try:
                from_file[k] = check(v)  # type: ignore[misc]
            except ValueError as e:
                raise OptionError(f"--config {config}: {k}: {e}") from None
    kept = {
        k: v
        for k, v in from_file.items()
        if k not in ("data", *NOT_REPLAYED) and not (k in defaults and defaults[k] == v)
    }
    return from_file.get("data"), kept


@dataclass
class Run:
    """A finished (or stopped) training run: its folder, the model in memory, its metrics."""

    family: str
    out: Path
    step: int
    best_val: float
    model: Any = field(repr=False)

    @property
    def metrics(self) -> list[dict]:
        """One dict per logged step (loss, lr, tokens/s, val_loss at evaluations): metrics.jsonl."""
        path = self.out / "metrics.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    @property
    def checkpoint(self) -> Path:
        """The folder ``load`` / ``evaluate`` read: the best checkpoint, else the last."""
        return self.out / "best" if (self.out / "best").is_dir() else self.out / "last"

    def load(self, device: str | None = None) -> Verbs:
        """The run's best model, from disk, with its tokenizer and verbs (see :func:`load`)."""
        return load(self.out, device=device)


# ---- using a trained model ---------------------------------------------------------------------------
LOAD_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def load(path: str | Path, *, device: str | None = None, dtype: str | None = None) -> Verbs:
    """A ready model (eval mode) from an attnlab run or checkpoint folder or a HuggingFace folder,
    knowing its tokenizer or image statistics, with its family's verbs: ``generate`` (GPT),
    ``translate`` (seq2seq), ``caption`` (captioner), ``predict`` (classifiers), ``embed``
    (text encoders), and ``evaluate`` / ``explore`` for all. It is the family's model class (a
    ``GPT`` is a ``GPT``) with hook points, ``run_with_cache`` and ``hooks``. ``dtype``: fp32,
    bf16 or fp16 weights (default: as saved; a HuggingFace checkpoint in fp32; ``bf16`` keeps a
    bf16 checkpoint's weights as they are, without a widened copy)."""
    import torch

    from .hub import resolve

    if dtype is not None and dtype not in LOAD_DTYPES:
        raise OptionError(f"dtype={dtype!r}: choose one of {', '.join(LOAD_DTYPES)} (or None: as saved)")
    path = resolve(path_argument(path, "path"))  # (a HuggingFace hub name: its folder in the hub cache)
    recipe = checkpoint_recipe(path)
    torch_dtype = getattr(torch, LOAD_DTYPES[dtype]) if dtype else None
    return recipe.model_of(path, device or "cpu", dtype=torch_dtype)


def _loaded(model_or_path: Verbs | str | Path) -> Verbs:
    if isinstance(model_or_path, (str, Path)):
        return load(model_or_path)
    if not isinstance(model_or_path, Verbs):
        raise OptionError(
            "this model was not loaded from a run folder; use attnlab.load(run) first (evaluate and "
            "explore read the run's data and tokenizer)"
        )
    return model_or_path


def evaluate(
    model_or_path: Verbs | str | Path, *, data: str | None = None, split: str | None = None, **options: Any
) -> dict[str, Any]:
    """The metrics of ``attnlab eval`` for a loaded model or a run folder (see ``Verbs.evaluate``)."""
    return _loaded(model_or_path).evaluate(data, split=split, **options)


def explore(model_or_path: Verbs | str | Path, **inputs: Any) -> Exploration:
    """The explorer's data for a loaded model or a run folder (see ``Verbs.explore``): ``text=``,
    ``image=``, ``src=`` / ``tgt=``. Shown inline in Jupyter; ``.save("page.html")`` writes the page."""
    return _loaded(model_or_path).explore(**inputs)


def __getattr__(name: str) -> object:
    """``Exploration`` (what :func:`explore` returns), imported when first used."""
    if name == "Exploration":
        from .inspect.explorer import Exploration

        return Exploration
    raise AttributeError(f"module 'attnlab.api' has no attribute {name!r}")
