"""Faults lose nothing: kill -9 at random moments (also inside a checkpoint write), two trainings
into one folder, a diverging loss, SIGTERM, a crash between the two renames of a swap, a full disk."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from attnlab.checkpoint import find_checkpoint
from attnlab.recipes import load_model
from attnlab.cli import main
from attnlab.training.state import read_metrics

TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 80
# 4 layers, 384 wide, one 8-token window per step: ~7M parameters, so each checkpoint (weights +
# AdamW moments) is ~85 MB and takes longer than a step; a checkpoint at every step, so a good
# share of the kills land inside a save.
BIG = [
    "--n-layer",
    "4",
    "--n-head",
    "4",
    "--n-embd",
    "384",
    "--block-size",
    "8",
    "--batch-size",
    "1",
    "--eval-interval",
    "1",
    "--eval-iters",
    "1",
    "--log-interval",
    "1",
    "--no-progress",
    "--sample-chars",
    "0",
    "--dtype",
    "fp32",
]
SMALL = [
    "--preset",
    "nano",
    "--block-size",
    "16",
    "--eval-iters",
    "1",
    "--no-progress",
    "--sample-chars",
    "0",
    "--dtype",
    "fp32",
]


def _spawn(out, corpus, *extra):
    cmd = [sys.executable, "-m", "attnlab", "train", "gpt", "--data", str(corpus), "--out", str(out), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for(pred, timeout=60.0):
    t0 = time.time()
    while not pred():
        if time.time() - t0 > timeout:
            raise TimeoutError
        time.sleep(0.05)


def _usable(out) -> int:
    """The step of the run's last checkpoint, after checking sample/eval could load it (or 0)."""
    try:
        ckpt = find_checkpoint(out, prefer="last")
    except Exception:
        return 0
    load_model(ckpt)  # raises on a truncated or corrupt checkpoint
    json.loads((ckpt / "config.json").read_text())
    read_metrics(out / "metrics.jsonl")
    return json.loads((ckpt / "config.json").read_text())["step"]


@pytest.mark.slow
def test_kill_9_at_random_moments_leaves_a_usable_run(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "run"
    rng = random.Random(int(os.environ.get("ATTNLAB_KILL_SEED", "0")))
    trials = int(os.environ.get("ATTNLAB_KILL_TRIALS", "6"))
    in_save = 0
    for trial in range(trials):
        start = _usable(out)
        proc = _spawn(out, corpus, *BIG, "--max-iters", "1000", *(["--resume"] if start else []))
        # wait until this process has trained a step (so it holds the lock), then kill at a random moment
        metrics = out / "metrics.jsonl"
        _wait_for(lambda: len(read_metrics(metrics)) > start or proc.poll() is not None)
        if trial == 0:  # a second training into the same folder is refused while the first runs
            second = _spawn(out, corpus, *BIG, "--max-iters", "5", "--resume")
            _, err = second.communicate(timeout=120)
            assert second.returncode == 2 and "another training" in err, err
        time.sleep(rng.uniform(0.0, 1.5))
        proc.kill()
        proc.wait()
        in_save += any((out / n).exists() for n in ("last.tmp", "last.old", "best.tmp", "best.old"))
        _usable(out)  # every kill leaves a loadable run (or none yet)
    step = _usable(out)
    assert step > 0
    # after the last kill: the stale lock is no obstacle, and --resume finishes the run
    proc = _spawn(out, corpus, *BIG, "--max-iters", str(step + 2), "--resume")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert _usable(out) == step + 2
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    assert steps == list(range(1, step + 3))  # one line per step, none lost or doubled
    print(f"kill -9: {trials} kills, {in_save} inside a checkpoint write, {trials} runs usable")


def test_sigterm_saves_like_ctrl_c(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "run"
    proc = _spawn(out, corpus, *SMALL, "--max-iters", "100000", "--eval-interval", "100000")
    _wait_for(lambda: (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").stat().st_size > 0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "SIGTERM" in err and "--resume" in err
    assert _usable(out) > 0


def _tiny_run(tmp_path, *extra):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "run"
    argv = ["train", "gpt", "--data", str(corpus), "--out", str(out), *SMALL, "--eval-interval", "3", *extra]
    return argv, out


def test_nan_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    argv, out = _tiny_run(tmp_path)
    assert main([*argv, "--max-iters", "3"]) == 0
    good = (out / "last" / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert main([*argv, "--resume", "--max-iters", "60", "--lr", "1e9", "--grad-clip", "0"]) == 2
    err = capsys.readouterr().err
    assert "diverged at step" in err and "untouched" in err, err
    assert (out / "last" / "model.safetensors").read_bytes() == good
    assert main([*argv, "--resume", "--max-iters", "6"]) == 0  # continues from the last good step
    assert _usable(out) == 6


def test_a_crash_between_the_two_renames_is_repaired(tmp_path, capsys):
    argv, out = _tiny_run(tmp_path)
    assert main([*argv, "--max-iters", "3"]) == 0
    os.replace(out / "last", out / "last.old")  # the new last/ never arrived
    shutil.rmtree(out / "best")
    (out / "last.tmp").mkdir()  # and a partial write is lying around
    assert main(["sample", "--ckpt", str(out), "--max-new-tokens", "5"]) == 0
    assert main([*argv, "--resume", "--max-iters", "6"]) == 0
    assert (out / "last").is_dir() and not (out / "last.old").exists() and not (out / "last.tmp").exists()
    assert _usable(out) == 6


def test_resume_with_nothing_to_resume_and_a_partial_first_write(tmp_path, capsys):
    argv, out = _tiny_run(tmp_path)
    (out / "last.tmp").mkdir(parents=True)  # killed during the very first save
    assert main([*argv, "--resume", "--max-iters", "3"]) == 2
    assert "no checkpoint to resume" in capsys.readouterr().err
    assert main([*argv, "--max-iters", "3"]) == 0  # so start it: the leftovers do not block a new run


def test_a_full_disk_is_reported_before_training(tmp_path, capsys, monkeypatch):
    argv, out = _tiny_run(tmp_path)
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000))
    assert main([*argv, "--max-iters", "3"]) == 2
    assert "not enough free space" in capsys.readouterr().err
    assert not out.exists()


def test_an_unwritable_out_is_reported_before_training(tmp_path, capsys, monkeypatch):
    argv, out = _tiny_run(tmp_path)
    out.mkdir()
    real = type(out).write_bytes

    def read_only(self, data):
        if self.parent == out:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, data)

    monkeypatch.setattr(type(out), "write_bytes", read_only)
    assert main([*argv, "--max-iters", "3"]) == 2
    assert "cannot write to --out" in capsys.readouterr().err
    assert list(out.iterdir()) == []


NEWER = {  # small runs of the newer families, with a checkpoint at every step
    "caption": ["--train-scenes", "64", "--dim", "32", "--emb-dim", "16", "--attention-dim", "16", "--batch-size", "8"],
    "encoder": ["--preset", "tiny", "--context", "32", "--dim", "32", "--mlp-dim", "64", "--batch-size", "8"],
}


def _spawn_family(family, out, *extra):
    every_step = [
        "--eval-interval",
        "1",
        "--eval-iters",
        "1",
        "--log-interval",
        "1",
        "--no-progress",
        "--dtype",
        "fp32",
    ]
    cmd = [sys.executable, "-m", "attnlab", "train", family, "--out", str(out), *NEWER[family], *every_step, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(NEWER))
def test_newer_families_survive_sigterm_and_kill_9(tmp_path, family):
    out = tmp_path / "run"
    rng = random.Random(1)
    for trial in range(3):  # kill -9 at random moments: a checkpoint is written at every step
        start = _usable(out)
        logged = len(read_metrics(out / "metrics.jsonl"))  # (lines past the checkpoint are dropped on resume)
        proc = _spawn_family(family, out, "--max-iters", "100000", *(["--resume"] if start else []))
        _wait_for(lambda: len(read_metrics(out / "metrics.jsonl")) > logged or proc.poll() is not None, 120)
        time.sleep(rng.uniform(0.0, 1.0))
        proc.kill()
        proc.wait()
        _usable(out)  # loadable after every kill
    start = _usable(out)
    assert start > 0
    logged = len(read_metrics(out / "metrics.jsonl"))
    proc = _spawn_family(family, out, "--max-iters", "100000", "--resume")
    _wait_for(lambda: len(read_metrics(out / "metrics.jsonl")) > logged or proc.poll() is not None, 120)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "SIGTERM" in err, err[-2000:]
    step = _usable(out)
    assert step > start  # SIGTERM saved the steps since the last kill
    proc = _spawn_family(family, out, "--max-iters", str(step + 2), "--resume")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert _usable(out) == step + 2
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    assert steps == list(range(1, step + 3))  # one line per step, none lost or doubled
