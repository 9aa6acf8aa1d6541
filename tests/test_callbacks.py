"""Callbacks see the trainer's events in order, can stop a run cleanly, and the built-in ones
(early stopping, W&B offline) work."""

import json
import os

import pytest

import attnlab
from attnlab.errors import OptionError
from helpers import PINNED_TRAINING

TEXT = "the quick brown fox jumps over the lazy dog. " * 200
SMALL = dict(PINNED_TRAINING, preset="nano", context=16, batch_size=4, eval_iters=1, sample_chars=0, progress=False)


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text(TEXT)
    return str(path)


class Recorder(attnlab.Callback):
    def __init__(self):
        self.events = []

    def on_train_start(self, trainer):
        self.events.append(("start", trainer.step))

    def on_step(self, trainer, record):
        self.events.append(("step", record["step"]))

    def on_evaluation(self, trainer, record):
        assert "val_loss" in record and "train_loss" in record
        self.events.append(("evaluation", record["step"]))

    def on_checkpoint(self, trainer, path):
        assert (path / "model.safetensors").is_file()  # written whole before the event
        self.events.append(("checkpoint", path.name))

    def on_train_end(self, trainer, reason):
        self.events.append(("end", reason))


def test_events_arrive_in_order(corpus, tmp_path):
    rec = Recorder()
    attnlab.train(
        "gpt", data=corpus, out=tmp_path / "run", max_iters=6, eval_interval=3, log_interval=2, callbacks=[rec], **SMALL
    )
    kinds = [e[0] for e in rec.events]
    assert rec.events[0] == ("start", 0) and rec.events[-1] == ("end", "finished")
    steps = [s for k, s in rec.events if k == "step"]
    logged = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == logged  # one on_step per line of metrics.jsonl
    assert [s for k, s in rec.events if k == "evaluation"] == [3, 6]
    at3 = kinds.index("evaluation")
    assert rec.events[at3 - 1] == ("step", 3)  # the evaluation's record is logged first
    assert ("checkpoint", "last") in rec.events[at3:] and ("checkpoint", "best") in rec.events[at3:]


class StopAt(attnlab.Callback):
    def __init__(self, step):
        self.step, self.ends = step, []

    def on_evaluation(self, trainer, record):
        if record["step"] >= self.step:
            trainer.stop(f"asked at step {record['step']}")

    def on_train_end(self, trainer, reason):
        self.ends.append(reason)


def test_a_callback_stops_the_run_after_its_checkpoints_and_it_resumes(corpus, tmp_path):
    stopper = StopAt(4)
    run = attnlab.train(
        "gpt", data=corpus, out=tmp_path / "run", max_iters=20, eval_interval=2, callbacks=[stopper], **SMALL
    )
    assert run.step == 4 and stopper.ends == ["stopped: asked at step 4"]
    saved = json.loads((tmp_path / "run" / "last" / "config.json").read_text())
    assert saved["step"] == 4
    resumed = attnlab.train("gpt", data=corpus, out=tmp_path / "run", resume=True, max_iters=6, **SMALL)
    assert resumed.step == 6


def test_early_stopping_waits_its_patience(corpus, tmp_path):
    # no evaluation can improve on the first by 10 nats: the run stops after `patience` more
    early = attnlab.EarlyStopping(patience=2, min_delta=10.0)
    run = attnlab.train(
        "gpt", data=corpus, out=tmp_path / "run", max_iters=40, eval_interval=2, callbacks=[early], **SMALL
    )
    assert run.step == 6
    with pytest.raises(ValueError, match="monitors 'val_acc'"):
        attnlab.train(
            "gpt",
            data=corpus,
            out=tmp_path / "run2",
            max_iters=4,
            eval_interval=2,
            callbacks=[attnlab.EarlyStopping("val_acc")],
            **SMALL,
        )
    with pytest.raises(ValueError, match="mode must be min or max"):
        attnlab.EarlyStopping(mode="up")


def test_a_failed_run_tells_the_callbacks(corpus, tmp_path):
    rec = Recorder()
    with pytest.raises(Exception, match="diverged"):
        attnlab.train(
            "gpt", data=corpus, out=tmp_path / "run", max_iters=30, eval_interval=2, lr=1e9, callbacks=[rec], **SMALL
        )
    assert rec.events[-1][0] == "end" and rec.events[-1][1].startswith("failed: ")


def test_callbacks_must_be_callbacks(corpus, tmp_path):
    with pytest.raises(OptionError, match="attnlab.Callback instances"):
        attnlab.train("gpt", data=corpus, out=tmp_path / "run", callbacks=[print], max_iters=2, **SMALL)


def test_wandb_logs_offline(corpus, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    cb = attnlab.WandbCallback(project="attnlab-test")
    attnlab.train("gpt", data=corpus, out=tmp_path / "run", max_iters=4, eval_interval=2, callbacks=[cb], **SMALL)
    runs = [p for p in (tmp_path / "wandb").iterdir() if p.name.startswith("offline-run-")]
    assert len(runs) == 1
    logged = [f for f in os.listdir(runs[0]) if f.endswith(".wandb")]
    assert logged and (runs[0] / logged[0]).stat().st_size > 0
    assert cb.run is None  # finished


def test_an_interrupt_right_after_a_step_is_counted_keeps_its_line(corpus, tmp_path, monkeypatch):
    """SIGTERM lands between any two statements; the worst place was between a step's count and
    its record (CI once lost a line there): the record now comes first. An interrupt raised as
    soon as the count moves (a property watching it) leaves the checkpoint and metrics.jsonl agreed."""
    from attnlab.training.trainer import Trainer, TrainingInterrupted

    def get(self):
        return self.__dict__["_step_value"]

    def set_(self, value):
        self.__dict__["_step_value"] = value
        if value == 3 and self.__dict__.get("in_step"):  # inside train_step, right after the count moved
            self.__dict__["in_step"] = False  # (what the same statement sets)
            raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "step", property(get, set_), raising=False)
    with pytest.raises(TrainingInterrupted):
        attnlab.train("gpt", data=corpus, out=tmp_path / "run", max_iters=10, eval_interval=1, log_interval=1, **SMALL)
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    saved = json.loads((tmp_path / "run" / "last" / "config.json").read_text())["step"]
    assert steps == list(range(1, saved + 1)) and saved == 3
