"""One trainer for every attnlab model: the training loop.

AdamW (decay / no-decay groups), linear warmup + cosine decay, gradient clipping and
accumulation, bf16 autocast where the hardware has fast bf16, optional torch.compile,
periodic validation, best and last checkpoints, exact resume, Ctrl-C saves. Its options are
:mod:`.config`, the device and dtype choice :mod:`.devices`, the optimizer state and metrics on
disk :mod:`.state`.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Protocol

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..checkpoint import (
    SHARDED,
    commit_checkpoint,
    find_checkpoint,
    load_trainer_state,
    load_weights,
    unwrap_model,
    write_checkpoint,
    write_checkpoint_files,
)
from ..errors import AttnlabError, CheckpointError, one_line
from ..syncs import to_host
from . import distributed as D
from .callbacks import Callback, CallbackList, TargetReached
from .compiling import PROBE_STEPS, CompileChoice, on_from_start, pays_off
from .config import TrainConfig
from .devices import CPU_BF16_MIN_SPEEDUP, autocast, pick_device, pick_dtype, use_tf32
from .optim import make_optimizer, warmup_cosine, warmup_stable_decay
from .stream import BatchStream
from .threads import CpuShare
from .state import optimizer_tensors, read_metrics, restore_optimizer, rewrite_metrics


class Task(Protocol):
    """What the trainer needs to know about a dataset + objective."""

    items_per_batch: int  # tokens (or images) in one micro-batch, for throughput
    # optional: static_shapes = True when every training batch has the same shape (--compile auto
    # only compiles such tasks; others would recompile for each new shape)

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> tuple[Tensor, ...]: ...

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...]) -> Tensor: ...

    def meta(self) -> dict: ...


# A training loss above this many times the run's first loss (or 1 nat, if that was smaller) is
# divergence even while it is finite: a loss that learns never climbs there (the first loss is
# about that of a uniform guess), while an exploding one (--lr 1e6) passes it within steps.
DIVERGED_FACTOR = 10.0


class Diverged(AttnlabError):
    """The loss (or gradient norm) stopped being finite, or exploded (``DIVERGED_FACTOR``);
    nothing was saved after the last good step."""

    def __init__(self, step: int, what: str, value: float, out: Path, lr: float, why: str = ""):
        last = out / "last"
        if last.is_dir():
            saved, advice = f"the last good checkpoint in {last} is untouched", "continue with --resume"
        else:
            saved, advice = "no checkpoint was written", "start the run again"
        super().__init__(
            f"training diverged at step {step}: {what} is {value:.4g}{why} (lr {lr:.3g}); stopped, {saved}; "
            f"lower --lr (or raise --warmup-iters) and {advice}"
        )
        self.step = step


class TaskLoss(nn.Module):
    """``task.loss(model, batch)`` as one module, which is what the trainer compiles: the model's
    forward and the loss (the fp32 cast of the logits, log-softmax, the gather of the targets)
    become one graph, so the compiler fuses the loss into a kernel each way instead of running
    it eagerly over the full (B, T, V) logits. Calls go through ``model``'s own ``__call__``
    (DDP's gradient hooks, hook points)."""

    def __init__(self, model: nn.Module, task) -> None:
        super().__init__()
        self.model, self.task = model, task

    def forward(self, *batch: Tensor) -> Tensor:
        return self.task.loss(self.model, list(batch))


ESTIMATE_STEPS = 3  # steps timed after the first before the run says how long it will take


def time_left_line(steps: int, per_step: float) -> str:
    """ "about 1 min 10 s for the 994 steps left (70 ms a step), besides evaluations"."""
    total = steps * per_step
    when = f"{total:.0f} s" if total < 90 else f"{total / 60:.0f} min" if total < 5400 else f"{total / 3600:.1f} h"
    return f"about {when} for the {steps:,} steps left ({per_step * 1000:,.0f} ms a step), besides evaluations"


@dataclass
class Meter:
    """A run's progress while it trains: its bar, and the logging window its throughput is measured
    over (from ``t0``, ``items`` trained since). Throughput counts from the end of step ``warm`` (the
    first: compilation, caches); ``decide_at``: the step at which ``--compile auto`` decides, timed
    from ``warm_at``; ``compile_next``: the next step compiles (falling back to eager if it cannot)."""

    bar: tqdm
    plain: bool  # a plain line every PLAIN_PROGRESS_S instead of the bar (the output is no terminal)
    t0: float
    warm_at: float
    warm: int
    decide_at: int | None
    compile_next: bool
    started: float
    last_line: float
    first_step: int
    estimated: bool = False  # whether the time the run will take has been said
    items: int = 0


class TrainingInterrupted(Exception):
    """Ctrl-C during training; a checkpoint was saved first (``saved=False``: an FSDP run, whose
    ranks cannot be trusted to meet in a collective save once a signal has scattered them)."""

    def __init__(self, step: int, path: Path, why: str = "interrupted", saved: bool = True):
        where = f"checkpoint saved to {path}" if saved else f"no checkpoint written (FSDP); {path} holds the last one"
        super().__init__(f"{why} at step {step}; {where}; continue with --resume")
        self.step, self.path = step, path


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        task: Task,
        cfg: TrainConfig,
        out_dir: str | Path,
        meta: dict | None = None,
        callbacks: list[Callback] | None = None,
    ):
        if cfg.lr_decay_iters is None:  # saved explicitly, so that --resume --max-iters N keeps the schedule
            cfg = replace(cfg, lr_decay_iters=cfg.max_iters)
        self.cfg, self.task = cfg, task
        self.out = Path(out_dir)
        self.meta = meta or {}
        self.dist, dist_device = D.setup(cfg.device)
        if cfg.fsdp and not self.dist.enabled:
            print(
                "note: --fsdp shards the model over the processes of a torchrun launch; this is one process, "
                "so it trains unsharded (with N: torchrun --nproc-per-node N -m attnlab train ... --fsdp)",
                file=sys.stderr,
                flush=True,
            )
        self.device = dist_device or pick_device(cfg.device)
        # (each torchrun process keeps the thread count torchrun gave it)
        fixed = cfg.threads or (torch.get_num_threads() if self.dist.enabled else None)
        self.cpu_share = CpuShare(fixed)
        self.dtype, self.dtype_reason = pick_dtype(cfg.dtype, self.device, model)
        if self.device.type == "cuda" and self.dtype == torch.float32:
            use_tf32()  # fp32 matmuls on tensor cores (TF32): what fp32 training on a GPU is expected to run
        torch.manual_seed(cfg.seed + self.dist.rank)  # dropout differs per rank; data does not
        set_activation_checkpointing(model, cfg.checkpoint_activations)
        self.model = model.to(self.device)
        self.optimizer = make_optimizer(model, cfg, self.device.type)
        # --ema: the weights' moving average (a second copy of the model), updated after every step
        self.ema = None
        if cfg.ema:
            from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

            self.ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(cfg.ema), use_buffers=True)
        # every rank draws the same global batch and keeps its slice (see distributed.shard)
        self.data_gen = torch.Generator().manual_seed(cfg.seed + 1)
        self.stream = BatchStream(
            lambda: self.task.batch("train", cfg.batch_size * self.dist.world, self.data_gen),
            self.data_gen,
            self.device,
            prepare=lambda batch: D.shard(batch, self.dist),
            weigh=getattr(task, "batch_weight", None),
        )
        # where the data stream and the random numbers stood when the running step began: what a
        # checkpoint saves when Ctrl-C lands inside a step (after its batches were drawn ahead)
        self.data_state = self.data_gen.get_state()
        self.rng_state = torch.get_rng_state()
        self.in_step = False
        # the steps not yet read back from the device (losses, gradient norms): checked and logged
        # together, in one transfer, at each logged step (flush_pending)
        self.pending: list[dict] = []
        self.step = 0
        self.best_val = math.inf
        # best/ is chosen on the task's own measure where it has one (classifiers: validation
        # accuracy over the whole split), else on the validation loss
        self.select_metric: str | None = getattr(task, "select_metric", None)
        self.best_score = -math.inf
        self.first_loss: float | None = None  # the run's first training loss: the divergence yardstick
        self.history: list[dict] = []
        # the events' listeners: the user's, then the trainer's own (--target, --tensorboard)
        builtin: list[Callback] = []
        metric = getattr(task, "target_metric", None)
        if cfg.target is not None and metric is not None:
            builtin.append(TargetReached(metric, cfg.target))
        if cfg.tensorboard:
            from .tensorboard import TensorBoardCallback

            builtin.append(TensorBoardCallback())
        self.callbacks = CallbackList([*(callbacks or []), *builtin])
        self.stop_reason: str | None = None  # set by stop(): the run ends after this evaluation
        self._parallel = None  # the model wrapped for DDP/FSDP (itself when not distributed), built in fit()
        self._compiled = None  # torch.compile of TaskLoss(model, task), when compiling is on
        self.compile_from_start = bool(cfg.compile)
        self.compile_reason = {True: "on: asked for (--compile)", False: "off: --no-compile"}.get(
            cfg.compile, "off: the run ends before its first steps could be timed"
        )
        start = on_from_start(self.device, getattr(task, "static_shapes", False)) if cfg.compile is None else None
        if start is not None:  # (a GPU: decided now, not by timing)
            self.compile_from_start, self.compile_reason = start.on, start.reason
        if self.dtype is None:  # --dtype auto on a CPU where only a measurement can tell
            self.dtype, self.dtype_reason = self.choose_by_timing()

    def choose_by_timing(self, steps: int = 3) -> tuple[torch.dtype, str]:
        """Time ``steps`` training steps in fp32 and under bf16 autocast, on a copy of the model
        with a throw-away optimizer and batch (the run itself is not touched, RNG states
        included), and return the faster, with the measurement as the reason."""
        import copy

        rng = torch.get_rng_state()
        model = copy.deepcopy(self.model)
        opt = torch.optim.AdamW(model.parameters(), lr=0.0)
        batch = [
            t.to(self.device) for t in self.task.batch("train", self.cfg.batch_size, torch.Generator().manual_seed(0))
        ]

        def step(dtype):
            with autocast(self.device, dtype):
                loss = self.task.loss(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        best = {}
        for dtype in (torch.float32, torch.bfloat16, torch.float32, torch.bfloat16):  # warm-up, then measure
            best[dtype] = min(time_call(step, dtype) for _ in range(steps))
        torch.set_rng_state(rng)
        speedup = best[torch.float32] / best[torch.bfloat16]
        if self.dist.enabled:  # every rank must run the same dtype: rank 0's measurement decides
            t = torch.tensor([speedup], dtype=torch.float64, device=self.device)
            torch.distributed.broadcast(t, 0)
            speedup = t.item()
        dtype = torch.bfloat16 if speedup >= CPU_BF16_MIN_SPEEDUP else torch.float32
        return dtype, (
            f"CPU has fast bf16; timed {steps} steps each: bf16 is {speedup:.2f}x fp32 "
            f"({'>=' if dtype == torch.bfloat16 else '<'} {CPU_BF16_MIN_SPEEDUP} to choose bf16)"
        )

    @property
    def sharded(self) -> bool:
        """True under --fsdp with several processes: the model, its optimizer state and its
        checkpoints are sharded, and collectives need every rank."""
        return self.cfg.fsdp and self.dist.enabled

    def _wrapped(self) -> nn.Module:
        """The model to train, DDP/FSDP-wrapped (itself when not distributed), never compiled:
        evaluation runs it eagerly (other shapes and eval mode would each cost a recompilation);
        training steps go through :meth:`loss_of`."""
        if self._parallel is None:
            carried = None
            if self.sharded and self.optimizer.state:  # a resumed run: its moments move into the sharded optimizer
                carried = D.full_optimizer_state(self.model, self.optimizer)
            m = D.wrap(self.model, self.dist, self.device, self.cfg.fsdp, self.dtype)
            if self.sharded:  # FSDP2 replaced the parameters by sharded ones: a new optimizer holds those
                self.optimizer = make_optimizer(m, self.cfg, self.device.type)
                if carried is not None:
                    D.set_full_optimizer_state(m, self.optimizer, carried)
            self._parallel = m
            if self.compile_from_start:
                self._compiled = torch.compile(TaskLoss(m, self.task))
        return self._parallel

    def loss_of(self, batch: list[Tensor]) -> Tensor:
        """The training loss of one micro-batch: through the compiled model-and-loss graph when
        compiling is on, else eagerly (the same computation)."""
        model = self._wrapped()
        if self._compiled is not None:
            return self._compiled(*batch)
        return self.task.loss(model, batch)

    def decide_compile(self, step_seconds: float) -> bool:
        """``--compile auto``: compile now if the rest of the run pays it back (``compiling.pays_off``;
        never for tasks whose batches change shape, which would recompile). True if switched on."""
        if not getattr(self.task, "static_shapes", False):
            self.compile_reason = "off: this task's batches change shape from step to step"
            return False
        choice = pays_off(self.cfg.max_iters - self.step, step_seconds, self.device, self.dtype)
        if self.dist.enabled:  # every rank must compile or none: rank 0's decision holds
            t = torch.tensor([float(choice.on)], device=self.device)
            torch.distributed.broadcast(t, 0)
            if bool(t.item()) != choice.on:
                choice = CompileChoice(bool(t.item()), "as rank 0 decided")
        self.compile_reason = choice.reason
        if choice.on:
            self._compiled = torch.compile(TaskLoss(self._wrapped(), self.task))
        return choice.on

    def _train_step_or_eager(self) -> float:
        """The first compiled step under ``--compile auto``: if compiling fails, say why and run the
        step again eagerly (same batch, same random numbers) instead of stopping the run."""
        rng, data = torch.get_rng_state(), self.stream.next_state()
        try:
            return self.train_step()
        except (AttnlabError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - any compiler failure; the eager step below shows real errors
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.compile_reason = f"off: compiling failed ({first[:200]})"
            print(f"note: torch.compile failed, training on eagerly: {first[:200]}", file=sys.stderr, flush=True)
            self._compiled = None
            self.optimizer.zero_grad(set_to_none=True)
            torch.set_rng_state(rng)
            self.stream.rewind(data)
            return self.train_step()

    # -- schedule --------------------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        c = self.cfg
        kw = dict(
            lr=c.lr,
            min_lr=c.lr / 10 if c.min_lr is None else c.min_lr,
            warmup=c.warmup_iters,
            decay_steps=c.lr_decay_iters or c.max_iters,
        )
        if c.schedule == "trapezoid":
            return warmup_stable_decay(step, cooldown=c.cooldown, **kw)
        return warmup_cosine(step, **kw)

    def autocast(self):
        return autocast(self.device, self.dtype)

    # -- one step --------------------------------------------------------------------------
    def train_step(self) -> Tensor:
        """One optimizer step; returns its training loss as a 0-dim tensor on the device. Nothing
        here waits for the device: the loss and the gradient norm are read back, checked and
        logged later, many steps in one transfer (:meth:`flush_pending`)."""
        cfg, model, world = self.cfg, self._wrapped(), self.dist.world
        model.train()
        self.data_state, self.rng_state, self.in_step = self.stream.next_state(), torch.get_rng_state(), True
        lr = self.lr_at(self.step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr * g.get("lr_factor", 1.0)  # (Muon's groups run at --muon-lr, on the same schedule)
        total = torch.zeros((), device=self.device)
        # a loss that is a mean over tokens (``batch_weight``: the micro-batch's token count, counted
        # on the host) is summed as mean x tokens and divided by all the tokens at the end, so that
        # accumulation equals the big batch without holding every micro-batch at once; other losses
        # weigh the micro-batches equally
        weighed = getattr(self.task, "batch_weight", None) is not None
        tokens, parts = 0.0, {}
        for micro in range(cfg.grad_accum):
            drawn = self.stream.take()
            scale = drawn.weight if weighed else 1.0 / cfg.grad_accum
            tokens += scale
            with D.no_sync(model, micro == cfg.grad_accum - 1), self.autocast():
                loss = self.loss_of(drawn.tensors) * scale
                loss.backward()
            self.stream.prefetch()  # the next batch, built while the device runs this one
            total = total + loss.detach().float()
            for name, value in (getattr(self.task, "parts", None) or {}).items():  # the loss's terms, to log
                parts[name] = parts.get(name, 0.0) + value * scale
        if weighed and tokens > 0:
            for p in model.parameters():  # (the wrapper's: under FSDP the gradients live on its flat parameters)
                if p.grad is not None:
                    p.grad.div_(tokens)
            total, parts = total / tokens, {k: v / tokens for k, v in parts.items()}
        if world > 1:  # report the global mean loss
            torch.distributed.all_reduce(total)
            total = total / world
        norm = None
        if cfg.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor, the norm over every rank's shards
                norm = norm.full_tensor()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update_parameters(self.model)
        # the record first, then the count: an interrupt between the two (SIGTERM lands between any two
        # statements) then finds the step's record pending, never a counted step without one
        self.pending.append({"step": self.step + 1, "loss": total, "norm": norm, "lr": lr, "parts": parts})
        self.step, self.in_step = self.step + 1, False
        return total

    def flush_pending(self) -> list[dict]:
        """Read the losses and gradient norms of the steps not yet logged back (one transfer), stop
        at the first that diverged (``Diverged``: the caller saves nothing after it), and return
        their records for the caller to log. A step leaves the pending list once its record is in
        the history, not before: an interrupt anywhere in between loses no line."""
        logged = self.history[-1]["step"] if self.history else 0
        self.pending = pending = [p for p in self.pending if p["step"] > logged]
        if not pending:
            return []
        norms = [p["norm"] for p in pending if p["norm"] is not None]
        values = to_host(*[p["loss"] for p in pending], *norms)
        losses, norms = values[: len(pending)], iter(values[len(pending) :])
        records = []
        for p, loss in zip(pending, losses):
            norm = next(norms) if p["norm"] is not None else None
            if not math.isfinite(loss):
                raise Diverged(p["step"], "the training loss", loss, self.out, p["lr"])
            if norm is not None and not math.isfinite(norm):  # a finite loss can still have an infinite gradient
                raise Diverged(p["step"], "the gradient norm", norm, self.out, p["lr"])
            if self.first_loss is None:
                self.first_loss = loss
            elif loss > DIVERGED_FACTOR * max(self.first_loss, 1.0):
                raise Diverged(
                    p["step"],
                    "the training loss",
                    loss,
                    self.out,
                    p["lr"],
                    f", more than {DIVERGED_FACTOR:g}x the run's first loss ({self.first_loss:.4g})",
                )
            records.append({"step": p["step"], "loss": loss, **p["parts"], "lr": p["lr"]})
        return records

    @torch.no_grad()
    def evaluate(self, splits=("train", "val")) -> dict[str, float]:
        """Mean loss over ``eval_iters`` batches per split, drawn from a fixed-seed generator
        so evaluation never disturbs the training data stream."""
        model = self.ema.module if self.ema is not None else self._wrapped()
        model.eval()
        # the loss to report and select on: without training-only terms such as label smoothing
        eval_loss = getattr(self.task, "eval_loss", self.task.loss)
        sums = []
        for split in splits:
            g = torch.Generator().manual_seed(self.cfg.seed + 2)
            total = torch.zeros((), device=self.device)
            for _ in range(self.cfg.eval_iters):  # every rank evaluates the same batches
                batch = [t.to(self.device) for t in self.task.batch(split, self.cfg.batch_size, g)]
                with self.autocast():
                    total = total + eval_loss(model, batch).float()
            sums.append(total)
        out = {split: value / self.cfg.eval_iters for split, value in zip(splits, to_host(*sums))}
        extra = getattr(self.task, "eval_metrics", None)  # e.g. validation accuracy
        if extra is not None:
            with self.autocast():
                out.update(extra(model, self.device))
        return out

    # -- checkpoints -----------------------------------------------------------------------
    def _state(self, optimizer: bool = True) -> tuple[dict, dict[str, Tensor]]:
        """The trainer state beside the weights: step, best scores, RNG streams and (unless
        ``optimizer=False``: FSDP writes it sharded) the optimizer's moments by parameter name."""
        opt_meta, tensors = optimizer_tensors(self.optimizer, unwrap_model(self.model)) if optimizer else (None, {})
        # between steps: the streams as they stand (an evaluation may have drawn random numbers since);
        # inside one (Ctrl-C): as they stood when it began, so that --resume runs that step again
        tensors["rng.torch"] = self.rng_state if self.in_step else torch.get_rng_state()
        tensors["rng.data"] = self.data_state if self.in_step else self.stream.next_state()
        if torch.cuda.is_available():
            for i, s in enumerate(torch.cuda.get_rng_state_all()):
                tensors[f"rng.cuda.{i}"] = s
        if self.ema is not None:  # model.safetensors holds the average; the weights that train go here
            tensors.update({f"{RAW_PREFIX}{k}": v.clone() for k, v in self.model.state_dict().items()})
            tensors["ema.n_averaged"] = self.ema.n_averaged
        state = {
            "step": self.step,
            "best_val": self.best_val,
            "best_score": self.best_score if math.isfinite(self.best_score) else None,
            "optimizer": opt_meta,
            "train_config": self.cfg.to_dict(),
        }
        return state, tensors

    def save(self, name: str = "last") -> Path:
        """Rank 0 writes the checkpoint. Under FSDP every rank takes part: each writes its shards of
        the model and the optimizer (``sharded/``, torch.distributed.checkpoint) into the same
        ``<name>.tmp`` folder, the full weights are gathered for ``model.safetensors`` (what
        sample, eval and export read), and only when all of it is on disk does rank 0 swap the
        folder in: a kill at any moment leaves the previous checkpoint whole."""
        path = self.out / name
        if self.sharded:
            return self._save_sharded(name)
        if self.dist.main:
            state, tensors = self._state()
            weights = self.ema.module if self.ema is not None else self.model
            write_checkpoint(path, weights, self._checkpoint_meta(), *((state, tensors) if name != "best" else ()))
        self.callbacks.on_checkpoint(self, path)
        return path

    def _save_sharded(self, name: str) -> Path:
        path = self.out / name
        tmp = path.with_name(path.name + ".tmp")
        model = self._wrapped()
        if self.dist.main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        D.barrier(self.dist)
        if name != "best":  # best/ is for reading (eval, sample): weights only
            D.save_sharded(model, self.optimizer, tmp / SHARDED)
        full = D.full_state_dict(model)
        if self.dist.main:
            state, tensors = self._state(optimizer=False)
            state["sharded_world_size"] = self.dist.world
            files = (state, tensors) if name != "best" else ()
            write_checkpoint_files(tmp, _fresh_copy(self.model, full), self._checkpoint_meta(), *files)
            commit_checkpoint(tmp, path)
        D.barrier(self.dist)
        return path

    def _checkpoint_meta(self) -> dict:
        return {
            **self.meta,
            **self.task.meta(),
            "train": self.cfg.to_dict(),
            "step": self.step,
            "world_size": self.dist.world,
        }

    def resume(self) -> None:
        """Continue from ``last/``: weights, optimizer moments (saved by name, or sharded by an
        FSDP run and read back with any number of processes), step, RNG and data streams."""
        ckpt = find_checkpoint(self.out, prefer="last")
        state, tensors = load_trainer_state(ckpt)
        load_weights(self.model, ckpt)
        if self.ema is not None:  # (a run that had no average starts one from these weights)
            self.ema.module.load_state_dict(self.model.state_dict())
            self.ema.n_averaged.copy_(tensors.get("ema.n_averaged", torch.tensor(0)))
        raw = {k[len(RAW_PREFIX) :]: v for k, v in tensors.items() if k.startswith(RAW_PREFIX)}
        if raw:  # trained with --ema: model.safetensors held the average, these are the weights that train
            self.model.load_state_dict(raw)
        if state.get("optimizer") is not None:
            restore_optimizer(self.optimizer, state["optimizer"], tensors, unwrap_model(self.model))
        elif (ckpt / SHARDED).is_dir():
            D.load_sharded(unwrap_model(self.model), self.optimizer, ckpt / SHARDED)
        elif self.dist.main:
            print("note: this checkpoint has no optimizer state; AdamW moments restart", flush=True)
        self.step, self.best_val = state["step"], state["best_val"]
        torch.set_rng_state(tensors["rng.torch"])
        self.stream.rewind(tensors["rng.data"])
        if torch.cuda.is_available():
            cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng.cuda.")]
            if len(cuda) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(cuda)
        self.history = read_metrics(self.out / "metrics.jsonl", upto=self.step)
        self.first_loss = next((r["loss"] for r in self.history if isinstance(r.get("loss"), (int, float))), None)
        if self.select_metric is not None:  # (runs written before it was saved: from their metrics)
            scores = [r[self.select_metric] for r in self.history if self.select_metric in r]
            saved = state.get("best_score")
            self.best_score = saved if saved is not None else max(scores, default=-math.inf)

    # -- the loop --------------------------------------------------------------------------
    def log(self, record: dict) -> None:
        """Keep a step's record: in the history on every rank, in metrics.jsonl on rank 0; then
        the callbacks' ``on_step``."""
        self.history.append(record)
        if self.dist.main:
            with open(self.out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
        self.callbacks.on_step(self, record)

    def stop(self, reason: str) -> None:
        """End the run after the current evaluation's checkpoints (for callbacks; call it on every
        rank under torchrun, e.g. from the evaluation record, which every rank shares)."""
        self.stop_reason = reason

    def check_space(self) -> None:
        """A clear error before training when the run folder cannot hold two checkpoints."""
        n_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        need = 2 * 3 * n_bytes + (1 << 20)  # last (weights + two AdamW moments) and a .tmp copy of it
        free = shutil.disk_usage(self.out).free
        if free < need:
            raise CheckpointError(
                f"not enough free space in {self.out}: checkpoints need about {need / 1e6:.0f} MB, "
                f"{free / 1e6:.0f} MB is free; free some space or choose another --out"
            )

    def open_run_folder(self) -> None:
        """The run folder made (with room checked), its metrics.jsonl started afresh, or, when resuming,
        cut back to the lines of the steps up to the checkpoint resumed from (main process only)."""
        if not self.dist.main:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        self.check_space()
        if self.step == 0:
            (self.out / "metrics.jsonl").write_text("")
        else:  # drop lines logged after the checkpoint we resumed from
            rewrite_metrics(self.out / "metrics.jsonl", self.history)

    def fit(self) -> dict:
        """Train from the current step to ``max_iters``: a step (:meth:`train_step`), then what is due
        after it (:meth:`after_step`: log, evaluate and save). A callback may end it early
        (``--target``, early stopping); a diverged loss raises ``Diverged``; Ctrl-C or SIGTERM saves
        the run and re-raises. Returns {"step", "best_val", "seconds"}."""
        self.open_run_folder()
        self.callbacks.on_train_start(self)
        meter = self.start_meter()
        term = _sigterm_as_interrupt()
        ended = "finished"
        try:
            with term:
                while self.step < self.cfg.max_iters:
                    if meter.compile_next:  # (a compiled step falls back to eager if compiling fails)
                        meter.compile_next = False
                        self._train_step_or_eager()
                    else:
                        self.train_step()
                    if self.after_step(meter):
                        ended = f"stopped: {self.stop_reason}"
                        break
        except KeyboardInterrupt:
            meter.bar.close()
            interrupted = self.save_interrupted(term.reason or "interrupted")
            ended = "interrupted"
            raise interrupted from None
        except BaseException as e:
            ended = f"failed: {one_line(e)}"
            raise
        finally:
            self.cpu_share.restore()
            if ended != "finished" and not ended.startswith("stopped"):
                self.callbacks.on_train_end(self, ended)  # (a run that diverged keeps its events too)
        meter.bar.close()
        self.final_model()
        self.callbacks.on_train_end(self, ended)
        return {"step": self.step, "best_val": self.best_val, "seconds": time.perf_counter() - meter.warm_at}

    def start_meter(self) -> Meter:
        """The progress and throughput of the steps from now on (:class:`Meter`)."""
        cfg, main = self.cfg, self.dist.main
        # a progress bar on a terminal; into a pipe or a log file, a plain line now and then instead of
        # hundreds of carriage-return redraws
        plain = bool(cfg.progress and main and not sys.stderr.isatty())
        bar = tqdm(total=cfg.max_iters, initial=self.step, disable=not (cfg.progress and main) or plain, unit="it",
                   dynamic_ncols=True)  # fmt: skip
        now, warm = time.perf_counter(), self.step + 1
        return Meter(
            bar,
            plain,
            now,
            warm_at=now,
            warm=warm,
            # --compile auto: time a few eager steps (on CUDA it is on from the start: nothing to decide)
            decide_at=warm + PROBE_STEPS if cfg.compile is None and not self.compile_from_start else None,
            compile_next=self.compile_from_start and cfg.compile is None,
            started=now,
            last_line=now,
            first_step=self.step,
        )

    def after_step(self, m: Meter) -> bool:
        """What is due after a step: at a logging or evaluation step (or one that ``m`` times), the
        steps since the last look read back from the device (the one host sync, which also makes the
        timings wall-clock times of finished work), logged, the throughput shown, and at an
        evaluation step :meth:`evaluate_and_save`. True when a callback stopped the run there."""
        cfg, main = self.cfg, self.dist.main
        # a compiled graph is guarded on the thread count: changing it would recompile (once per
        # count, ~30 s each), so the count stays as it was when compiling began
        threads = self.cpu_share.poll() if self._compiled is None else None
        if threads is not None:
            self.note_hardware(f"step {self.step}: threads: {self.cpu_share.describe()}", m.bar.write)
        logged = self.step % cfg.log_interval == 0 or self.step == cfg.max_iters
        evaluating = self.step % cfg.eval_interval == 0 or self.step == cfg.max_iters
        if not (logged or evaluating or self.step in (m.warm, m.decide_at)):
            m.items += self.task.items_per_batch * cfg.grad_accum
            m.bar.update(1)
            return False
        *earlier, rec = self.flush_pending()
        for r in earlier:
            self.log(r)
        # how long the run will take, said early: at the first look (a read-back it makes anyway: --compile
        # auto's decision, or the first logged step) a few steps after the first
        if not m.estimated and self.step >= m.warm + ESTIMATE_STEPS and self.step < cfg.max_iters:
            m.estimated = True
            if main:
                per_step = (time.perf_counter() - m.warm_at) / (self.step - m.warm)
                m.bar.write(time_left_line(cfg.max_iters - self.step, per_step))
        if self.step == m.decide_at:
            if self.decide_compile((time.perf_counter() - m.warm_at) / PROBE_STEPS):
                m.compile_next, m.warm = True, self.step + 1  # throughput restarts after compiling
            self.note_hardware(f"step {self.step}: compile: {self.compile_reason}", m.bar.write)
        if self.step == m.warm:  # throughput is measured from the end of the first step (compilation, caches)
            m.t0 = m.warm_at = time.perf_counter()
            m.items = 0
        else:
            m.items += self.task.items_per_batch * cfg.grad_accum
        if logged:  # the throughput of this logging window (steps since the last look)
            dt = time.perf_counter() - m.t0
            rec["items_per_s"] = m.items / dt if dt > 0 else 0.0
            m.bar.set_postfix(loss=f"{rec['loss']:.4f}", tok_s=f"{rec['items_per_s']:.0f}")
            now = time.perf_counter()
            if m.plain and now - m.last_line >= PLAIN_PROGRESS_S:
                m.last_line = now
                self.print_progress(rec, (now - m.started) / max(1, self.step - m.first_step))
        if evaluating:
            self.evaluate_and_save(rec, m.bar.write)
            if self.stop_reason is not None:
                if main:
                    m.bar.write(f"step {self.step}: {self.stop_reason}")
                return True
        else:
            self.log(rec)
        m.t0, m.items = time.perf_counter(), 0  # the next window starts now: without evaluations and saves
        m.bar.update(1)
        return False

    def save_interrupted(self, why: str) -> TrainingInterrupted:
        """After Ctrl-C or SIGTERM: the steps not yet logged logged (and checked: a diverged one saves
        nothing), so that the checkpoint about to be saved and metrics.jsonl agree (a resumed run has
        one line per step), then ``last`` saved; the error that says so, to raise."""
        main, path = self.dist.main, self.out / "last"
        for r in self.flush_pending():
            self.log(r)
        if main:  # (the interrupt may have come between a record's history entry and its line)
            rewrite_metrics(self.out / "metrics.jsonl", self.history)
        if not self.sharded:  # (a sharded save would need every rank at the same point)
            path = self.save("last")
        if main:
            self.plot()
        return TrainingInterrupted(self.step, path, why, saved=not self.sharded)

    def final_model(self) -> None:
        """The run's model once it ends: its average when it keeps one (as its checkpoints are), and
        whole on rank 0 after a sharded run; the run's plot drawn."""
        if self.ema is not None:
            self.model.load_state_dict(self.ema.module.state_dict())
        if self.sharded:
            # what follows the run on rank 0 alone (a test accuracy, a sample) needs the whole model:
            # a sharded one would wait forever for the other ranks' shards
            full = D.full_state_dict(self._wrapped())
            if self.dist.main:
                self.model = _fresh_copy(self.model, full).to(self.device)
        if self.dist.main:
            self.plot()

    def note_hardware(self, line: str, write: Callable[[str], None]) -> None:
        """A hardware choice and its reason (dtype, CPU threads, compile): always appended to the run
        folder's hardware.log, and said with ``write`` under ``--verbose``."""
        if not self.dist.main:
            return
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            with open(self.out / "hardware.log", "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError:  # (a note about the hardware is not worth stopping a run for)
            pass
        if self.cfg.verbose:
            write(line)

    def print_progress(self, rec: dict, seconds_per_step: float) -> None:
        """The plain progress line printed now and then when the output is not a terminal."""
        left = (self.cfg.max_iters - self.step) * seconds_per_step
        print(
            f"step {self.step}/{self.cfg.max_iters}: loss {rec['loss']:.4f}, "
            f"{rec['items_per_s']:.0f} items/s, about {left / 60:.1f} min left",
            file=sys.stderr,
            flush=True,
        )

    def evaluate_and_save(self, rec: dict, write: Callable[[str], None]) -> None:
        """At an evaluation step: evaluate (a non-finite loss stops the run, the last good checkpoint
        intact), log ``rec`` with the results, tell the callbacks, then save last/ and, if the
        selection measure improved, best/. ``write``: prints a line beside the progress bar."""
        ev = self.evaluate()
        for split in ("train", "val"):
            if not math.isfinite(ev[split]):
                raise Diverged(self.step, f"the {split} loss", ev[split], self.out, rec["lr"])
        rec.update(train_loss=ev.pop("train"), val_loss=ev.pop("val"), **ev)
        extra = "".join(f", {k.replace('_', ' ')} {v:.4f}" for k, v in ev.items())
        if self.dist.main:
            write(f"step {self.step}: train loss {rec['train_loss']:.4f}, val loss {rec['val_loss']:.4f}{extra}")
        self.log(rec)  # before the saves: a kill during them keeps the line
        self.callbacks.on_evaluation(self, rec)
        if self.select_metric in rec:
            improved = rec[self.select_metric] > self.best_score
        else:
            improved = rec["val_loss"] < self.best_val
        if improved:
            self.best_val = rec["val_loss"]
            self.best_score = rec.get(self.select_metric, self.best_score)
        self.save("last")  # last before best: best/ never exists without last/
        if improved:
            self.save("best")
        D.barrier(self.dist)

    def checkpoints_line(self) -> str:
        """Which evaluation best/ and last/ hold, and their validation numbers: one clause when
        they are the same step, both when they differ, saying by which measure best/ was chosen
        (eval, predict and explore read best/)."""
        evals = [r for r in self.history if "val_loss" in r]
        if not evals:
            return "no evaluation yet"
        key = self.select_metric if self.select_metric in evals[-1] else None
        best = max(evals, key=lambda r: r[key]) if key else min(evals, key=lambda r: r["val_loss"])

        def numbers(r):
            shown = f", {key.replace('_', ' ')} {r[key]:.4f}" if key else ""
            return f"val loss {r['val_loss']:.4f}{shown}"

        last = evals[-1]
        if best["step"] == last["step"]:
            return f"best/ = last/ (step {last['step']}: {numbers(last)})"
        by = f"the highest {key.replace('_', ' ')}" if key else "the lowest val loss"
        return f"best/ step {best['step']} ({by}: {numbers(best)}), last/ step {last['step']} ({numbers(last)})"

    def plot(self) -> Path | None:
        from .curves import loss_curve

        return loss_curve(self.history, self.out / "loss.png")


# Seconds between two progress lines when the output is not a terminal (a log file, a pipe, CI).
PLAIN_PROGRESS_S = 30.0

RAW_PREFIX = "weights."  # trainer.safetensors keys of the training weights under --ema


def time_call(fn, *args) -> float:
    """Seconds one call of ``fn(*args)`` takes (the start-up dtype timing; tests replace it)."""
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


class _sigterm_as_interrupt(contextlib.AbstractContextManager):
    """Within the block, SIGTERM (what schedulers and ``docker stop`` send) interrupts training
    like Ctrl-C does, so it saves a checkpoint first. ``reason`` says which signal came."""

    def __init__(self) -> None:
        self.reason = ""
        self._previous = None

    def _handle(self, signum, frame):
        self.reason = "stopped by SIGTERM"
        raise KeyboardInterrupt

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        return False


def _fresh_copy(model: nn.Module, state: dict) -> nn.Module:
    """A CPU model of the same config (and plain class) holding ``state``: FSDP's gathered weights."""
    raw = unwrap_model(model)
    fresh = D.plain_class(raw)(raw.config)
    fresh.load_state_dict(state)
    return fresh


def set_activation_checkpointing(model: nn.Module, on: bool) -> None:
    """Turn per-block activation checkpointing on or off for every block of ``model``."""
    from ..blocks import DecoderBlock, TransformerBlock

    for m in model.modules():
        if isinstance(m, (TransformerBlock, DecoderBlock)):
            m.checkpoint_activations = on
