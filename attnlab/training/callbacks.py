"""Callbacks: code of your own run at the trainer's events, as Lightning's and HuggingFace's
``TrainerCallback`` are. ``attnlab.train(..., callbacks=[...])`` passes them in::

    class PrintVal(attnlab.Callback):
        def on_evaluation(self, trainer, record):
            print(record["step"], record["val_loss"])

Events, in order: ``on_train_start`` (the model built, before the first step; a resumed run
at its checkpoint's step), ``on_step`` (each logged step's record: ``loss``, ``lr``,
``items_per_s``, ...), ``on_evaluation`` (the record with ``val_loss`` and the task's metrics,
before the checkpoints are written), ``on_checkpoint`` (after ``last/`` or ``best/`` is written),
``on_train_end`` (the run finished, stopped early, or was interrupted: ``reason`` says which).

A callback stops the run by calling ``trainer.stop(reason)``: the run ends after the current
evaluation's checkpoints, as a finished run does. Callbacks run on every rank under torchrun
(``trainer.dist.main`` is True on rank 0); the built-in ones write on rank 0 only. The trainer's
own behaviour is built from them: :class:`TargetReached` (``--target``), :class:`EarlyStopping`
and :class:`attnlab.training.tensorboard.TensorBoardCallback` (``--tensorboard``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import torch

from ..hooks import in_mode


class Trainer(Protocol):
    """What a callback reads of :class:`attnlab.training.trainer.Trainer` (which imports this
    module; this module imports nothing of it)."""

    step: int
    out: Path
    cfg: Any  # its TrainConfig
    model: Any
    task: Any
    dist: Any  # .main is True on rank 0
    device: Any
    history: list[dict]
    best_val: float

    @property
    def sharded(self) -> bool: ...

    def stop(self, reason: str) -> None: ...


class Callback:
    """The trainer's events; each does nothing unless overridden."""

    def on_train_start(self, trainer: Trainer) -> None:
        """Before the first step (or the first step after the checkpoint a resumed run starts from)."""

    def on_step(self, trainer: Trainer, record: dict) -> None:
        """A logged step: ``record`` as metrics.jsonl gets it (``step``, ``loss``, ``lr``, ...)."""

    def on_evaluation(self, trainer: Trainer, record: dict) -> None:
        """An evaluation: ``record`` holds ``train_loss``, ``val_loss`` and the task's metrics."""

    def on_checkpoint(self, trainer: Trainer, path: Path) -> None:
        """``path`` (``RUN/last`` or ``RUN/best``) was just written, whole."""

    def on_train_end(self, trainer: Trainer, reason: str) -> None:
        """The run ended: ``reason`` is "finished", "stopped: ..." (a callback), "interrupted"
        (Ctrl-C, SIGTERM) or "failed: ..." (a diverged loss, an error)."""


class TargetReached(Callback):
    """Stop once ``metric`` reaches ``target`` at an evaluation: ``--target``. An accuracy or
    exact match reaches it from below; a loss (a metric named ``*_loss``) from above."""

    def __init__(self, metric: str, target: float) -> None:
        self.metric, self.target = metric, target
        self.lower_is_better = metric.endswith("loss")

    def on_evaluation(self, trainer: Trainer, record: dict) -> None:
        if self.metric not in record:
            return
        value = record[self.metric]
        if (value <= self.target) if self.lower_is_better else (value >= self.target):
            trainer.stop(
                f"{self.metric.replace('_', ' ')} {value:.4f} reached the target {self.target}; stopping early"
            )


class EarlyStopping(Callback):
    """Stop when ``monitor`` (``val_loss`` by default; lower is better unless ``mode="max"``)
    has not improved by more than ``min_delta`` for ``patience`` evaluations in a row: Keras's
    and Lightning's ``EarlyStopping``. best/ keeps the best evaluation's weights as always."""

    def __init__(self, monitor: str = "val_loss", patience: int = 3, min_delta: float = 0.0, mode: str = "min"):
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStopping mode must be min or max, got {mode!r}")
        if patience < 1:
            raise ValueError(f"EarlyStopping patience must be at least 1, got {patience}")
        self.monitor, self.patience, self.min_delta, self.sign = (
            monitor,
            patience,
            min_delta,
            1 if mode == "min" else -1,
        )
        self.best, self.waited = math.inf, 0

    def on_evaluation(self, trainer: Trainer, record: dict) -> None:
        if self.monitor not in record:
            known = ", ".join(k for k in record if k not in ("step", "lr"))
            raise ValueError(f"EarlyStopping monitors {self.monitor!r}, which evaluations do not report ({known})")
        value = self.sign * record[self.monitor]
        if value < self.best - self.min_delta:
            self.best, self.waited = value, 0
            return
        self.waited += 1
        if self.waited >= self.patience:
            trainer.stop(f"{self.monitor} has not improved for {self.patience} evaluations; stopping early")


class MeasureAtSteps(Callback):
    """A learning curve: ``measure()`` (the model's accuracy on a fixed set, say) at the logged
    steps ``steps`` of a run, with the model in eval mode and no gradients, into ``curve``
    ({step: value}). The measurement must draw no random numbers, so the run goes on as it would
    without it; the schedule is the whole run's, so step 500 of a 1,500-step run is not a 500-step run."""

    def __init__(self, model: Any, measure: Callable[[], Any], steps: Iterable[int]) -> None:
        self.model, self.measure, self.steps = model, measure, set(steps)
        self.curve: dict[int, Any] = {}

    def on_step(self, trainer: Trainer, record: dict) -> None:
        if record["step"] in self.steps:
            with in_mode(self.model), torch.no_grad():
                self.curve[record["step"]] = self.measure()


def quarter_steps(steps: int, log_interval: int = 10) -> list[int]:
    """A quarter, half, three quarters and all of ``steps``, each on a logged step (a run's
    budgets for :class:`MeasureAtSteps`)."""
    return sorted(
        {min(steps, max(log_interval, round(steps * f / log_interval) * log_interval)) for f in (0.25, 0.5, 0.75, 1)}
    )


class CallbackList(Callback):
    """Several callbacks as one, called in order."""

    def __init__(self, callbacks: list[Callback]) -> None:
        for c in callbacks:
            if not isinstance(c, Callback):
                raise TypeError(f"callbacks must be attnlab.Callback instances, got {type(c).__name__}")
        self.callbacks = list(callbacks)

    def on_train_start(self, trainer: Trainer) -> None:
        for c in self.callbacks:
            c.on_train_start(trainer)

    def on_step(self, trainer: Trainer, record: dict) -> None:
        for c in self.callbacks:
            c.on_step(trainer, record)

    def on_evaluation(self, trainer: Trainer, record: dict) -> None:
        for c in self.callbacks:
            c.on_evaluation(trainer, record)

    def on_checkpoint(self, trainer: Trainer, path: Path) -> None:
        for c in self.callbacks:
            c.on_checkpoint(trainer, path)

    def on_train_end(self, trainer: Trainer, reason: str) -> None:
        for c in self.callbacks:
            c.on_train_end(trainer, reason)


class WandbCallback(Callback):
    """Log to Weights & Biases (``pip install 'attnlab[wandb]'``): every record's numbers at its
    step (evaluations included), the run's configuration, and how it ended. ``WANDB_MODE=offline``
    writes to ``./wandb`` without an account (``wandb sync`` uploads it later). Rank 0 logs."""

    def __init__(self, project: str = "attnlab", name: str | None = None, **init_kwargs: Any) -> None:
        try:
            import wandb
        except ImportError:
            raise ImportError("WandbCallback needs the wandb package: pip install 'attnlab[wandb]'") from None
        self.wandb, self.project, self.name, self.init_kwargs = wandb, project, name, init_kwargs
        self.run: Any = None  # the wandb run, on rank 0 while training

    def on_train_start(self, trainer: Trainer) -> None:
        if not trainer.dist.main:
            return
        from ..checkpoint import model_config_dict, unwrap_model

        config = {**trainer.cfg.to_dict(), "model": model_config_dict(unwrap_model(trainer.model))}
        self.run = self.wandb.init(
            project=self.project, name=self.name or trainer.out.name, config=config, **self.init_kwargs
        )

    def on_step(self, trainer: Trainer, record: dict) -> None:
        if self.run is not None:
            numbers = {k: v for k, v in record.items() if k != "step" and _finite_number(v)}
            self.run.log(numbers, step=record["step"])

    def on_train_end(self, trainer: Trainer, reason: str) -> None:
        if self.run is not None:
            self.run.summary["end"] = reason
            self.run.summary["best_val_loss"] = trainer.best_val
            self.run.finish()
            self.run = None


def _finite_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
