"""TensorBoard beside ``metrics.jsonl`` (``attnlab train ... --tensorboard``; ``pip install
'attnlab[tensorboard]'``): every number of every metrics record as a scalar under the same name
(``loss``, ``lr``, ``items_per_s``, ``val_loss``, ``val_acc``, ...) at its step; at each
evaluation the attention patterns of one fixed validation example as images (one per attention
layer, its heads side by side); the run's configuration as hparams with the final validation
numbers. Events go to ``RUN/tensorboard/``:

    tensorboard --logdir runs/        # every run under runs/, side by side

A resumed run purges the events logged after the checkpoint it resumes from, as it does with
``metrics.jsonl``, so the curves never hold the steps that were redone.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

from ..checkpoint import unwrap_model
from ..errors import OptionError
from ..hooks import in_mode
from .callbacks import Callback

FOLDER = "tensorboard"


def summary_writer(log_dir: Path, purge_step: int | None):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise OptionError("--tensorboard needs the tensorboard package: pip install 'attnlab[tensorboard]'") from None
    return SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)


class TensorBoardLog:
    """The TensorBoard side of a run's log; ``record`` takes what ``metrics.jsonl`` gets."""

    def __init__(self, out: Path, resume_step: int = 0) -> None:
        # events after the checkpoint a resumed run starts from are hidden (TensorBoard purges
        # every step >= purge_step when it reads the new file)
        self.writer = summary_writer(Path(out) / FOLDER, resume_step + 1 if resume_step else None)

    def record(self, rec: dict) -> None:
        for key, value in rec.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                if math.isfinite(value):
                    self.writer.add_scalar(key, value, rec["step"])

    def attention(self, step: int, patterns: dict[str, torch.Tensor]) -> None:
        """``patterns``: {hook name: (H, T, S) attention of one example} -> one image per layer."""
        for name, p in patterns.items():
            self.writer.add_image(f"attention/{name.removesuffix('.hook_pattern')}", heads_image(p), step)

    def hparams(self, config: dict, final: dict) -> None:
        """The run's configuration (numbers, strings and booleans; the rest as text) with its final
        validation numbers, for TensorBoard's HPARAMS tab."""
        flat = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in config.items() if v is not None}
        metrics = {f"hparam/{k}": v for k, v in final.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        self.writer.add_hparams(flat, metrics, run_name=".")

    def close(self) -> None:
        self.writer.close()


class TensorBoardCallback(Callback):
    """``--tensorboard`` as a callback: the log opened at the start (rank 0's), each record's
    numbers, the probe example's attention at each evaluation, the hparams at the end."""

    def __init__(self) -> None:
        self.log: TensorBoardLog | None = None
        self.probe: list[torch.Tensor] = []

    def on_train_start(self, trainer) -> None:
        if trainer.dist.main:
            self.log = TensorBoardLog(trainer.out, resume_step=trainer.step)
            logs = trainer.out / FOLDER
            print(
                f"tensorboard: logging to {logs}; watch with: tensorboard --logdir {logs}", file=sys.stderr, flush=True
            )
        # the fixed validation example whose attention TensorBoard shows
        batch = trainer.task.batch("val", 1, torch.Generator().manual_seed(0))
        self.probe = [t.to(trainer.device) for t in batch]

    def on_step(self, trainer, record: dict) -> None:
        if self.log is not None:
            self.log.record(record)

    def on_evaluation(self, trainer, record: dict) -> None:
        if self.log is not None or trainer.sharded:  # (a sharded forward needs every rank)
            patterns = probe_patterns(unwrap_model(trainer.model), trainer.task, self.probe)
            if self.log is not None:
                self.log.attention(record["step"], patterns)

    def on_train_end(self, trainer, reason: str) -> None:
        if self.log is None:
            return
        if not reason.startswith("failed"):  # (a run that failed keeps the events it logged, no hparams)
            evals = [r for r in trainer.history if "val_loss" in r]
            final = {k: v for k, v in evals[-1].items() if k.startswith("val_")} if evals else {}
            self.log.hparams({**trainer.cfg.to_dict(), "model": type(unwrap_model(trainer.model)).__name__}, final)
        self.log.close()
        self.log = None


def heads_image(pattern: torch.Tensor, gap: int = 2) -> torch.Tensor:
    """(H, T, S) attention -> a (1, T, H·S + (H−1)·gap) greyscale image in [0, 1]: the heads side
    by side, each row scaled to its own maximum (so that a query attending over many keys still
    shows where it looks)."""
    p = pattern.detach().float().cpu()
    p = p / p.amax(-1, keepdim=True).clamp_min(1e-12)
    h, t, s = p.shape
    img = torch.ones(t, h * s + (h - 1) * gap)
    for i in range(h):
        img[:, i * (s + gap) : i * (s + gap) + s] = p[i]
    return img[None]


def probe_patterns(model, task, batch) -> dict[str, torch.Tensor]:
    """The attention patterns of the first example of ``batch`` (every ``*hook_pattern`` point the
    model passes while the task computes its loss), {name: (H, T, S)}; empty for models without
    attention (the CNN)."""
    with in_mode(model), torch.no_grad(), model.caching("*hook_pattern") as cache:
        task.loss(model, batch)
    return {name: cache[name][0] for name in cache}
