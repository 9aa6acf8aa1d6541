"""Run folders: the one path every family trains a new run, resumes one or replays one by, and
:func:`fit_model`, the training every run (and every claim's model) ends in.

A family is data to this module: whatever offers the methods :func:`train` calls (its
``train_options`` dataclass, ``prepare``, ``check_new``, ``run_options``, ``train_defaults_for``,
``finish``, ``models``, ``model_fields``), a :class:`attnlab.recipes.Recipe` in practice; nothing
here imports the families. Nothing here prints: what a run has to say goes to ``say``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..config import option_fields
from ..data.fingerprint import check_same_data, fingerprint
from ..errors import CheckpointError, OptionError
from ..runoptions import write_options
from .config import TrainConfig


@dataclass
class TrainingRun:
    """What a family prepares for the trainer: the model to build (type and config), the task
    (data + loss), what to save beside the weights, and a line that describes the run."""

    model_type: str
    config: Any
    task: Any
    meta: dict
    summary: str
    setup: Callable | None = None  # called with the built model (e.g. an RNN's teacher forcing)
    notes: list[str] = field(default_factory=list)  # what the run says of its data before it starts


@dataclass
class TrainResult:
    """What :func:`train` leaves: the trained model (in memory), its trainer and the final step."""

    model: Any
    trainer: Any
    run: TrainingRun
    step: int
    best_val: float


def train_config(over: dict, saved: dict | None, defaults: TrainConfig | None = None, say=None) -> TrainConfig:
    """The TrainConfig of this run: a new one from the family's ``defaults`` and the training
    options given (``over``). A resumed run keeps its saved values and takes the training options
    given now (they are safe to change, and are listed); its learning-rate schedule stays the one
    it started with (decay to its original ``lr_decay_iters``) unless --lr-decay-iters is given."""
    if not saved:
        return dataclasses.replace(defaults or TrainConfig(), **over)
    old = dict(saved.get("train", {}))
    if old.get("lr_decay_iters") is None:  # runs written before the schedule was saved explicitly
        old["lr_decay_iters"] = old.get("max_iters")
    cfg = TrainConfig.from_dict({**old, **over}, strict=False)
    changed = {k: v for k, v in over.items() if saved.get("train", {}).get(k) != v}
    if changed and say:
        say(f"resume: training options changed from the saved run: {changed}")
    if "max_iters" in over and "lr_decay_iters" not in over and say:
        say(
            f"resume: keeping the run's schedule (cosine decay to step {cfg.lr_decay_iters}, then min lr); "
            "pass --lr-decay-iters N for another"
        )
    return cfg


def refuse_model_changes(out, model_cfg, model_over: dict, others: dict | None = None) -> None:
    """On --resume, model options (and ``others``: {option: (given, saved)}) must match the run."""
    clash = {k: v for k, v in model_over.items() if not hasattr(model_cfg, k) or getattr(model_cfg, k) != v}
    clash.update({k: new for k, (new, old) in (others or {}).items() if new is not None and new != old})
    if clash:
        shown = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in clash.items())
        raise CheckpointError(
            f"--resume with options that differ from the checkpoint in {out} ({shown}); model "
            "and data options cannot change: drop them to continue the run, or start a new --out"
        )


def run_header(trainer, why: bool = False) -> str:
    """The device and dtype of a run and its CPU threads; ``why``: with the reasons (what
    ``--verbose`` shows and hardware.log keeps)."""
    dtype = str(trainer.dtype).replace("torch.", "")
    head = f"{trainer.device} {dtype}" + (f" ({trainer.dtype_reason})" if why else "")
    if trainer.device.type == "cpu":
        share = trainer.cpu_share
        head += f", {share.threads} thread{'s' * (share.threads > 1)}" + (f" ({share.reason})" if why else "")
    return head


def replay_options(
    family, own, out: Path, run: TrainingRun, tcfg, model_over: dict, saved: dict | None
) -> dict[str, Any]:
    """The options that re-run this run (``--config RUN``): the family's (``own``, its
    ``train_options``), the model's as built (only those given when its shape came from --init)
    and the trainer's as resolved. A resumed run keeps what its options.json says of the family
    and the model; its training options are the ones it now runs with."""
    from ..runoptions import OPTIONS_FILE

    earlier = out / OPTIONS_FILE
    if saved and earlier.is_file():
        try:
            options = dict(json.loads(earlier.read_text()).get("options", {}))
        except (ValueError, AttributeError):  # (a damaged file is rewritten from what the run knows)
            options = {}
    else:
        options = {f.name: getattr(own, f.name) for f in dataclasses.fields(own) if f.name != "data_dir"}
        if getattr(own, "init", None):
            options.update(model_over)
        else:
            options.update({n: getattr(run.config, n) for n in family.model_fields() if hasattr(run.config, n)})
        options["data"] = own.data if own.data is not None else (saved or {}).get("data_spec")
    options.update({n: getattr(tcfg, n) for n in option_fields(TrainConfig)})
    return options


def fits_in_memory(model, task, tcfg) -> None:
    """Refuse, before the first step, a batch whose activations cannot fit in memory (see
    :mod:`attnlab.training.memory`); the model's buffers (BatchNorm statistics) are left as they were."""
    import torch

    from .devices import pick_device
    from .memory import check_fits

    buffers = {n: b.clone() for n, b in model.named_buffers()}
    try:
        check_fits(model, task, tcfg.batch_size, pick_device(tcfg.device), ema=bool(tcfg.ema))
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(buffers[n])


def _say_nothing(line: str) -> None:
    pass


def train(
    family,
    options: dict[str, Any],
    *,
    out: str | Path,
    resume: bool = False,
    callbacks: list | None = None,
    say: Callable[[str], None] = _say_nothing,
) -> TrainResult:
    """Train a run of ``family`` into the run folder ``out``, new or resumed (``resume``): every
    family, from the command line or from Python, goes through here. ``options``: the checked
    value of each of its train options (the family's own, the model's fields and the trainer's;
    None: not given). ``say``: where the run's lines go (its header, resuming, the end)."""
    import torch

    from ..checkpoint import run_config

    if not str(out).strip():  # (Path("") is the current folder: the run would land among other files)
        raise OptionError("--out '' names no folder; give the run folder to write (e.g. runs/gpt)")
    out = Path(out)
    names = {f.name for f in dataclasses.fields(family.train_options)}
    own = family.train_options(**{k: v for k, v in options.items() if k in names})
    model_over = {k: options[k] for k in family.model_fields() if options.get(k) is not None}
    training_over = {k: options[k] for k in option_fields(TrainConfig) if options.get(k) is not None}
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restarts and not resume and (out / "last" / "config.json").is_file():
        # torchrun's elastic agent restarted the workers after a failure (--max-restarts): the
        # same command continues from the last checkpoint, which redoes the lost steps exactly
        resume = True
        if int(os.environ.get("RANK", "0")) == 0:
            say(f"torchrun restart {restarts}: resuming from {out / 'last'}")
    if not resume:  # check the options before anything is read or written
        tcfg = train_config(training_over, None, family.train_defaults_for(own))
        family.check_new(own, model_over)
    saved = run_config(out, resume, tuple(family.models))
    if saved:
        check_resumable(family, own, out, saved, model_over, training_over)
        tcfg = train_config(training_over, saved, say=say)
    elif family.default_seconds and own.data is None and not (model_over or training_over):
        say(f"the embedded default run: expect {expected_time(family.default_seconds)}")
    asked = training_over.get("target")  # (a family's default target is for the data it suits)
    if asked is not None and asked > 1 and not family.target_is_loss:
        raise OptionError(f"--target must be in [0, 1] for a {family.name} run (a fraction: accuracy, exact match)")
    run = family.prepare(own, saved, model_over, tcfg, out)
    for note in filter(None, run.notes):
        say(note)
    # what it trains on, for a later --resume to compare (kept as first recorded)
    run.meta["data_fingerprint"] = (
        saved["data_fingerprint"] if saved and "data_fingerprint" in saved else fingerprint(own.data)
    )
    metric = getattr(run.task, "target_metric", None)
    if asked is not None and metric is None:
        raise OptionError(
            f"--target {asked}: this {family.name} run has no validation metric to reach (classifiers have "
            "accuracy, synthetic seq2seq tasks exact match, language models a loss); drop --target"
        )
    torch.manual_seed(tcfg.seed)  # the initial weights follow from the seed
    model = family.models[run.model_type].model_class(run.config)
    if run.setup is not None:
        run.setup(model)

    def started(trainer) -> None:
        if trainer.dist.main:
            write_options(out, family.name, replay_options(family, own, out, run, tcfg, model_over, saved))
        if resume:
            trainer.resume()
        n_params = sum(p.numel() for p in model.parameters())
        trainer.note_hardware(f"step {trainer.step}: {run_header(trainer, why=True)}", lambda line: None)
        say(f"{run.summary} | {n_params / 1e6:.2f}M parameters | {run_header(trainer, why=tcfg.verbose)}")

    def finished(trainer, result) -> None:
        if trainer.dist.main:
            for line in family.finish(own, run, trainer, result):
                say(line)

    trainer, result = fit_model(
        model, run.task, tcfg, out, meta=run.meta, callbacks=callbacks, started=started, finished=finished
    )
    return TrainResult(trainer.model, trainer, run, result["step"], result["best_val"])


def check_resumable(family, own, out: Path, saved: dict, model_over: dict, training_over: dict) -> None:
    """Refuse to resume the run ``saved`` (its config.json) with other model or data options, other
    data, or a --max-iters it has already passed."""
    saved_cfg = family.models[saved["model_type"]].config_class.from_dict(saved["model"])
    refuse_model_changes(out, saved_cfg, model_over, family.run_options(own, saved))
    data_now = fingerprint(own.data if own.data is not None else saved.get("data_spec"))
    if "data_fingerprint" in saved:  # (runs written before fingerprints are not checked)
        if saved["data_fingerprint"] is None and own.data is not None:
            raise CheckpointError(
                f"--resume {out}: it trained on the family's default data, not --data {own.data}; drop --data "
                "to resume it, or start a new run in another --out"
            )
        check_same_data(out, saved["data_fingerprint"], data_now)
    asked_iters = training_over.get("max_iters")
    if asked_iters is not None and asked_iters < saved.get("step", 0):  # (it would exit 0 having done nothing)
        raise OptionError(
            f"--max-iters {asked_iters}: the run in {out} is at step {saved['step']} already; give --max-iters "
            f"above {saved['step']} to train it further (sample or eval use it as it is)"
        )


def fit_model(model, task, tcfg, out, *, meta=None, callbacks=None, started=None, finished=None) -> tuple[Any, dict]:
    """Train ``model`` on ``task`` with the TrainConfig ``tcfg`` into the run folder ``out``: the
    training every family's run ends in (:func:`train`), and that of a claim's model that no
    family trains (a graph transformer on cycles, a GPT on an induction task: ``attnlab
    reproduce``). A batch that cannot fit is refused first; ``started(trainer)`` runs before the
    first step (options.json, resume, the run's header) and ``finished(trainer, result)`` after
    the last, before a distributed job's processes part. Returns (trainer, the trainer's result)."""
    from . import distributed as D
    from .trainer import Trainer

    fits_in_memory(model, task, tcfg)
    trainer = Trainer(model, task, tcfg, Path(out), meta=meta or {}, callbacks=callbacks)
    try:
        if started is not None:
            started(trainer)
        result = trainer.fit()
        if finished is not None:
            finished(trainer, result)
    finally:
        D.cleanup(trainer.dist)
    return trainer, result


def expected_time(seconds: int | tuple[int, int]) -> str:
    """A family's measured default-run time as the banner says it: (quiet, busy) seconds, measured
    by benchmarks/first_hour.py on a 2-core machine alone and with another job using both cores,
    as a range; one number, as measured on a quiet machine."""

    def said(s: float) -> str:
        return f"{s:.0f} seconds" if s < 120 else f"{s / 60:.1f} minutes"

    where = "on 2 CPU cores (a 2-core AMD EPYC"
    if isinstance(seconds, tuple):
        low, high = seconds
        span = f"{low}-{high} seconds" if high < 120 else f"{low / 60:.1f}-{high / 60:.1f} minutes"
        return f"{span} {where}: alone, and with another job using both cores)"
    return f"about {said(seconds)} {where}, alone)"
