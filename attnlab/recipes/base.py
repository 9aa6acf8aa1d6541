"""What a recipe is, and the one path every family trains, resumes and evaluates by.

A recipe says everything attnlab needs to know about one model family: its models and
presets, its training defaults, its data options, how it turns data into a training task,
how it evaluates, which inspections and extra commands it offers. The command line, the
checkpoint loader and the dispatch of ``eval`` / ``inspect`` are all generated from the
registry of recipes (:mod:`attnlab.recipes`), so a new family is one recipe file plus its model.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import CheckpointError


@dataclass
class TrainingRun:
    """What a recipe prepares for the trainer: the model to build (type and config), the task
    (data + loss), what to save beside the weights, and a line that describes the run."""

    model_type: str
    config: Any
    task: Any
    meta: dict
    summary: str
    setup: Callable | None = None  # called with the built model (e.g. an RNN's teacher forcing)


class Recipe:
    """One model family. Subclasses fill in the class attributes and override the hooks."""

    name: str = ""  # `attnlab train NAME`
    help: str = ""
    description: str = ""
    models: dict[str, type] = {}  # model_type (as saved in config.json) -> model class
    hf_model_types: dict[str, str] = {}  # HuggingFace config "model_type" -> attnlab model_type
    presets: dict[str, dict] = {}
    set_by_data: tuple[str, ...] = ()  # config fields that follow from the data, not options
    train_defaults: dict = {}  # TrainConfig values that differ from its defaults for this family
    inspections: dict[str, str] = {}  # `attnlab inspect WHAT` -> help
    explore_kind: str | None = None  # what `attnlab explore` / `serve` show: text | image | cross
    default_seconds: int | None = None  # wall time of the embedded default run, measured on 2 CPU cores

    @property
    def default_out(self) -> str:
        return f"runs/{self.name}"

    def config_classes(self) -> list[type]:
        return list(dict.fromkeys(m.config_class for m in self.models.values()))

    # ---- command line ------------------------------------------------------------------------
    def add_train_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Data and task options of ``attnlab train NAME`` (model and trainer fields are added
        from the configs)."""

    def add_eval_arguments(self, group) -> None:
        """Options of ``attnlab eval`` that this family reads."""

    def add_inspect_arguments(self, group) -> None:
        """Options of ``attnlab inspect`` that this family's inspections read."""

    def add_commands(self, sub) -> None:
        """Extra top-level commands (``sample``, ``translate``, ``predict``)."""

    # ---- training ------------------------------------------------------------------------------
    def train_defaults_for(self, args) -> dict:
        """The training defaults of a new run (a family may size them to its data)."""
        return self.train_defaults

    def check_new(self, args, model_over: dict) -> None:
        """Refuse bad options of a new run before anything is read or written."""

    def run_options(self, args, saved: dict) -> dict[str, tuple]:
        """Options besides the model fields that a resumed run cannot change: {option: (given
        now or None, the run's value)}."""
        return {}

    def prepare(self, args, saved: dict | None, model_over: dict, tcfg) -> TrainingRun:
        """Read the data and return the run (for a resumed run, from its ``saved`` config)."""
        raise NotImplementedError

    def finish(self, args, run: TrainingRun, trainer, result: dict) -> None:
        print(f"done: step {result['step']}, best val loss {result['best_val']:.4f}, run folder {trainer.out}",
              file=sys.stderr)

    # ---- using a trained model ---------------------------------------------------------------
    def evaluate(self, args) -> tuple[dict, str]:
        """``attnlab eval``: (the metrics, one line saying them); the command prints either."""
        raise CheckpointError(f"attnlab eval does not know how to evaluate {self.name} models yet")

    def inspect(self, args) -> int:
        raise CheckpointError(f"{self.name} models offer no inspections")

    def explore(self, args) -> dict:
        """The data of ``attnlab explore`` for this family (see :mod:`attnlab.inspect.explorer`)."""
        raise CheckpointError(f"attnlab explore does not show {self.name} models yet")

    def predict(self, args) -> int:
        """``attnlab predict`` for this family's checkpoints (classifiers)."""
        raise CheckpointError(f"{args.ckpt} holds a {self.name} model; predict needs a classifier (train vit, cnn, "
                              "or encoder --task classify)")


# ---- options shared by every family ---------------------------------------------------------------
def given(args, names) -> dict:
    """The options among ``names`` that the user gave (argparse default None = not given)."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def train_config(args, saved: dict | None, defaults: dict | None = None):
    """The TrainConfig of this run: a new one from the family's ``defaults`` and the options given.
    A resumed run keeps its saved values and takes the training
    options given now (they are safe to change, and are listed); its learning-rate schedule stays
    the one it started with (decay to its original ``lr_decay_iters``) unless --lr-decay-iters is given."""
    from ..train import TrainConfig

    over = given(args, args.train_fields)
    if not saved:
        return TrainConfig(**{**(defaults or {}), **over})
    old = dict(saved.get("train", {}))
    if old.get("lr_decay_iters") is None:  # runs written before the schedule was saved explicitly
        old["lr_decay_iters"] = old.get("max_iters")
    cfg = TrainConfig.from_dict({**old, **over}, strict=False)
    changed = {k: v for k, v in over.items() if saved.get("train", {}).get(k) != v}
    if changed:
        print(f"resume: training options changed from the saved run: {changed}", file=sys.stderr)
    if "max_iters" in over and "lr_decay_iters" not in over:
        print(f"resume: keeping the run's schedule (cosine decay to step {cfg.lr_decay_iters}, then min lr); "
              "pass --lr-decay-iters N for another", file=sys.stderr)
    return cfg


def refuse_model_changes(out, model_cfg, model_over: dict, others: dict | None = None) -> None:
    """On --resume, model options (and ``others``: {option: (given, saved)}) must match the run."""
    clash = {k: v for k, v in model_over.items() if not hasattr(model_cfg, k) or getattr(model_cfg, k) != v}
    clash.update({k: new for k, (new, old) in (others or {}).items() if new is not None and new != old})
    if clash:
        shown = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in clash.items())
        raise CheckpointError(f"--resume with options that differ from the checkpoint in {out} ({shown}); model "
                              "and data options cannot change: drop them to continue the run, or start a new --out")


def run_header(trainer) -> str:
    """The device and dtype of a run, with the reason for the dtype."""
    dtype = str(trainer.dtype).replace("torch.", "")
    return f"{trainer.device} {dtype} ({trainer.dtype_reason})"


# ---- the one path: train a new run or resume one -------------------------------------------------
def train(recipe: Recipe, args) -> int:
    """``attnlab train NAME``: every family, new or resumed, goes through here."""
    import torch

    from ..checkpoint import run_config
    from ..train import Trainer
    from ..train import distributed as D

    out = Path(args.out)
    model_over = given(args, args.model_fields)
    if not args.resume:  # check the options before anything is read or written
        tcfg = train_config(args, None, recipe.train_defaults_for(args))
        recipe.check_new(args, model_over)
    saved = run_config(out, args.resume, tuple(recipe.models))
    if saved:
        saved_cfg = recipe.models[saved["model_type"]].config_class.from_dict(saved["model"])
        refuse_model_changes(out, saved_cfg, model_over, recipe.run_options(args, saved))
        tcfg = train_config(args, saved)
    if recipe.default_seconds and not saved and args.data is None and not model_over and not given(args, args.train_fields):
        secs = recipe.default_seconds
        expect = f"{secs} seconds" if secs < 120 else f"{secs / 60:.1f} minutes"
        print(f"the embedded default run: expect about {expect} on 2 CPU cores (measured on a 2-core AMD EPYC)",
              file=sys.stderr)
    run = recipe.prepare(args, saved, model_over, tcfg)
    torch.manual_seed(tcfg.seed)  # the initial weights follow from the seed
    model = recipe.models[run.model_type](run.config)
    if run.setup is not None:
        run.setup(model)
    trainer = Trainer(model, run.task, tcfg, out, meta=run.meta)
    try:
        if args.resume:
            trainer.resume()
        n_params = sum(p.numel() for p in model.parameters())
        print(f"{run.summary} | {n_params / 1e6:.2f}M parameters | {run_header(trainer)}", file=sys.stderr)
        result = trainer.fit()
        if trainer.dist.main:
            recipe.finish(args, run, trainer, result)
    finally:
        D.cleanup(trainer.dist)
    return 0
