"""Two processes with gloo on CPU, launched by torchrun, equal one process with the same global batch."""

import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file
import torch

pytestmark = pytest.mark.slow  # (each test starts processes: tens of seconds)

TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 60


GPT_RUN = ["--preset", "nano", "--block-size", "16", "--dropout", "0", "--eval-interval", "3", "--eval-iters", "1"]
GPT_RUN += ["--lr-decay-iters", "6", "--warmup-iters", "2", "--no-progress", "--sample-chars", "0", "--seed", "7"]


def _argv(out, corpus, *extra, nproc=1, launcher=("--standalone",)):
    """A small GPT run on ``corpus`` into ``out`` (later options win): one process, or ``nproc``
    per torchrun agent started with ``launcher``'s options."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", *launcher, f"--nproc_per_node={nproc}"]
    base = torchrun if nproc > 1 or launcher != ("--standalone",) else [sys.executable]
    return [*base, "-m", "attnlab", "train", "gpt", "--data", str(corpus), "--out", str(out), *GPT_RUN, *extra]


def _train(out, corpus, *extra, nproc=1):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = _argv(out, corpus, *extra, nproc=nproc)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return load_file(str(out / "last" / "model.safetensors"))


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_ddp_equals_single_process_and_resumes_in_one(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    single = _train(tmp_path / "single", corpus, "--batch-size", "8", "--max-iters", "6")
    # 2 processes x batch 4 for 3 steps, then 1 process x batch 8 resumes to step 6
    _train(tmp_path / "ddp", corpus, "--batch-size", "4", "--max-iters", "3", nproc=2)
    resumed = _train(tmp_path / "ddp", corpus, "--resume", "--batch-size", "8", "--max-iters", "6")
    for k, v in single.items():
        assert torch.allclose(v, resumed[k], atol=1e-5), k
    ddp_first = _train(tmp_path / "ddp2", corpus, "--batch-size", "4", "--max-iters", "6", "--grad-accum", "1", nproc=2)
    for k, v in single.items():
        assert torch.allclose(v, ddp_first[k], atol=1e-5), k


def test_grad_accumulation_under_ddp(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    single = _train(tmp_path / "s", corpus, "--batch-size", "4", "--grad-accum", "2", "--max-iters", "3")
    ddp = _train(tmp_path / "d", corpus, "--batch-size", "2", "--grad-accum", "2", "--max-iters", "3", nproc=2)
    for k, v in single.items():
        assert torch.allclose(v, ddp[k], atol=1e-5), k


WINDOWS_LOG = """
import json, os
import attnlab.training.distributed as D

drawn = D.shard
def shard(batch, info):  # the windows this rank trains on, one line per micro-batch drawn
    mine = drawn(batch, info)
    with open(os.environ["WINDOWS_LOG"] + f".{info.rank}", "a") as f:
        f.write(json.dumps(mine[0].tolist()) + "\\n")
    return mine
D.shard = shard
"""


def test_ddp_on_token_shards_reads_disjoint_windows_and_resumes_to_the_same_batches(tmp_path):
    """A corpus prepared into token shards, trained by 2 processes for 3 steps and resumed by 2 to
    step 6: at every step the two ranks train on disjoint halves of the windows one process with
    the global batch trains on, before and after the resume, and end with its weights."""
    import json

    import numpy as np

    from attnlab.data import prepare_shards

    rng = np.random.default_rng(0)
    words = np.array("the of and to in is was that for it with as his on be at by had are but".split())
    (tmp_path / "src").mkdir()
    for i in range(12):
        (tmp_path / "src" / f"{i}.txt").write_text(" ".join(rng.choice(words, 400)) + "\n")
    prepare_shards(str(tmp_path / "src"), tmp_path / "shards", shard_tokens=2048, val_fraction=0.25, progress=False)
    logs = {}

    def train(name, *extra, nproc):
        env = {**os.environ, **_inject(tmp_path, WINDOWS_LOG), "OMP_NUM_THREADS": "1",
               "WINDOWS_LOG": str(tmp_path / name)}  # fmt: skip
        argv = _argv(tmp_path / name, tmp_path / "shards", "--grad-accum", "1", *extra, nproc=nproc)
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        logs[name] = [[json.loads(line) for line in (tmp_path / f"{name}.{rank}").read_text().splitlines()]
                      for rank in range(nproc)]  # fmt: skip
        for rank in range(nproc):
            (tmp_path / f"{name}.{rank}").unlink()
        return load_file(str(tmp_path / name / "last" / "model.safetensors"))

    single = train("single", "--batch-size", "8", "--max-iters", "6", nproc=1)
    train("ddp", "--batch-size", "4", "--max-iters", "3", nproc=2)
    first = logs["ddp"]
    resumed = train("ddp", "--batch-size", "4", "--max-iters", "6", "--resume", nproc=2)
    _same(single, resumed)
    one = logs["single"][0]
    # (a batch is drawn one step ahead: the stopped run drew step 4's too, which the resumed run draws again)
    steps = [first[0][:3] + logs["ddp"][0][:3], first[1][:3] + logs["ddp"][1][:3]]
    for step in range(6):
        rank0, rank1 = steps[0][step], steps[1][step]
        assert not {tuple(w) for w in rank0} & {tuple(w) for w in rank1}, step  # disjoint windows
        assert rank0 + rank1 == one[step], step  # together: the global batch of one process


# ---- FSDP2 (fully_shard on CPU with gloo), sharded checkpoints, elastic restarts, two nodes ------------
def _losses(out) -> list[float]:
    import json

    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def _same(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for k, v in a.items():
        assert torch.allclose(v, b[k], atol=atol), (k, (v - b[k]).abs().max())


def _inject(tmp_path, code: str) -> dict:
    """An environment whose Python processes (torchrun's workers) first run ``code``: the test's
    fault, kept out of attnlab."""
    site = tmp_path / "inject"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(code)
    return {"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


FSDP_FIXES = "--device cpu --dtype fp32 --no-compile".split()


def test_fsdp_equals_single_process_and_accumulates(tmp_path):
    """--fsdp on 2 CPU processes: the loss curve and the weights of one process with the same global
    batch (to fp32 rounding), with and without gradient accumulation and activation checkpointing,
    and in bf16 to bf16's precision; the checkpoint holds the sharded state and the full weights."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    single = _train(tmp_path / "s", corpus, "--batch-size", "8", "--max-iters", "6", *FSDP_FIXES)
    fsdp = _train(tmp_path / "f", corpus, "--batch-size", "4", "--max-iters", "6", "--fsdp", *FSDP_FIXES, nproc=2)
    _same(single, fsdp)
    assert _losses(tmp_path / "s") == pytest.approx(_losses(tmp_path / "f"), abs=2e-6)
    shards = sorted(p.name for p in (tmp_path / "f" / "last" / "sharded").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    accum = ["--grad-accum", "2", "--max-iters", "3", *FSDP_FIXES]
    single = _train(tmp_path / "sa", corpus, "--batch-size", "4", *accum)
    fsdp = _train(tmp_path / "fa", corpus, "--batch-size", "2", "--fsdp", *accum, nproc=2)
    _same(single, fsdp)
    # activation checkpointing composes with the sharding: the same numbers again
    ckpt = _train(tmp_path / "fc", corpus, "--batch-size", "2", "--fsdp", "--checkpoint-activations", *accum, nproc=2)
    _same(single, ckpt)
    # bf16: FSDP gathers bf16 parameters (MixedPrecisionPolicy) where one process autocasts fp32
    # weights, so the two round differently; they agree to bf16's precision
    bf16 = ["--max-iters", "6", "--device", "cpu", "--dtype", "bf16", "--no-compile"]
    single = _train(tmp_path / "sb", corpus, "--batch-size", "8", *bf16)
    fsdp = _train(tmp_path / "fb", corpus, "--batch-size", "4", "--fsdp", *bf16, nproc=2)
    _same(single, fsdp, atol=2e-2)
    assert _losses(tmp_path / "sb") == pytest.approx(_losses(tmp_path / "fb"), abs=5e-3)


def test_fsdp_trains_a_vit_like_one_process(tmp_path):
    """A ViT under --fsdp equals one process, and --tensorboard still draws its attention."""
    pytest.importorskip("sklearn")
    args = ["train", "vit", "--max-iters", "4", "--eval-interval", "2", "--eval-iters", "1", "--no-progress"]
    args += ["--dim", "32", "--layers", "2", "--heads", "2", "--seed", "3", "--dropout", "0", *FSDP_FIXES]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {}
    for name, extra, launch in (
        ("single", ["--batch-size", "16"], [sys.executable]),
        (
            "fsdp",
            ["--batch-size", "8", "--fsdp", "--tensorboard"],
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"],
        ),
    ):
        out = tmp_path / name
        r = subprocess.run(
            [*launch, "-m", "attnlab", *args, "--out", str(out), *extra],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        runs[name] = load_file(str(out / "last" / "model.safetensors"))
    _same(runs["single"], runs["fsdp"])
    # TensorBoard under FSDP: the attention images need a forward pass on every rank (sharded weights)
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tmp_path / "fsdp" / "tensorboard"), size_guidance={"images": 0})
    ea.Reload()
    assert sorted(ea.Tags()["images"]) == ["attention/encoder.blocks.0.attn", "attention/encoder.blocks.1.attn"]
    assert [e.step for e in ea.Images("attention/encoder.blocks.0.attn")] == [2, 4]


def test_sharded_checkpoints_resume_exactly_with_any_number_of_processes(tmp_path):
    """Stop at step 3 and resume to 6: 2 -> 2 and 2 -> 1 processes from the sharded checkpoint
    (DCP reshards), and 1 -> 2 from an unsharded one; each equals the uninterrupted run, AdamW
    moments included (a restarted optimizer would not)."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    whole = _train(tmp_path / "whole", corpus, "--batch-size", "8", "--max-iters", "6", *FSDP_FIXES)
    half = ["--max-iters", "3", *FSDP_FIXES]
    rest = ["--max-iters", "6", "--resume", *FSDP_FIXES]
    for name, first, then in (("22", 2, 2), ("21", 2, 1), ("12", 1, 2)):
        out = tmp_path / name
        _train(out, corpus, "--batch-size", str(8 // first), "--fsdp", *half, nproc=first)
        resumed = _train(out, corpus, "--batch-size", str(8 // then), "--fsdp", *rest, nproc=then)
        _same(whole, resumed)
        assert _losses(out) == pytest.approx(_losses(tmp_path / "whole"), abs=2e-6), name


def test_kill_9_during_sharded_saves_leaves_a_run_that_resumes(tmp_path):
    """A checkpoint at every step and SIGKILL to the whole torchrun job at random moments: every
    kill leaves last/ whole (or none yet), and --resume finishes the run with the weights of a run
    that was never killed."""
    import random
    import signal
    import time

    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    opts = ["--batch-size", "4", "--eval-interval", "1", "--log-interval", "1", "--fsdp", *FSDP_FIXES]
    reference = _train(tmp_path / "ref", corpus, *opts, "--max-iters", "12", nproc=2)
    out = tmp_path / "run"
    rng, in_save = random.Random(0), 0
    cmd = _argv(out, corpus, *opts, "--max-iters", "12", nproc=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for trial in range(5):
        resume = ["--resume"] if (out / "last" / "config.json").is_file() else []
        proc = subprocess.Popen(
            [*cmd, *resume], env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.time() + 120
        while time.time() < deadline and not (out / "last.tmp").exists() and proc.poll() is None:
            time.sleep(0.01)  # until the first save of this attempt has begun ...
        time.sleep(rng.uniform(0.0, 1.0))  # ... then a random moment later
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # (on a fast machine the attempt can finish before that moment comes)
            pass
        proc.wait()
        in_save += (out / "last.tmp").exists()
        if (out / "last").exists():
            assert (out / "last" / "sharded" / ".metadata").is_file() and (out / "last" / "model.safetensors").is_file()
    r = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    _same(reference, load_file(str(out / "last" / "model.safetensors")))
    print(f"kill -9 under FSDP: 5 kills, {in_save} inside a sharded save; resumed to the same weights")


def test_elastic_restart_after_a_worker_dies_redoes_the_lost_steps(tmp_path):
    """torchrun --max-restarts=1: rank 1 is killed (SIGKILL) after step 5 of the first attempt;
    the agent restarts both workers, the same command resumes from the step-4 checkpoint, and the
    run ends with the weights of a run without the failure."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    opts = ["--batch-size", "4", "--max-iters", "8", "--eval-interval", "2", "--fsdp", *FSDP_FIXES]
    reference = _train(tmp_path / "ref", corpus, *opts, nproc=2)
    env = _inject(
        tmp_path,
        "import os, signal\n"
        "if os.environ.get('RANK') == '1' and os.environ.get('TORCHELASTIC_RESTART_COUNT') == '0':\n"
        "    from attnlab.training import trainer\n"
        "    step = trainer.Trainer.train_step\n"
        "    def dying(self):\n"
        "        loss = step(self)\n"
        "        if self.step == 5:\n"
        "            os.kill(os.getpid(), signal.SIGKILL)\n"
        "        return loss\n"
        "    trainer.Trainer.train_step = dying\n",
    )
    out = tmp_path / "run"
    cmd = _argv(out, corpus, *opts, nproc=2, launcher=("--standalone", "--max-restarts=1"))
    r = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "torchrun restart 1: resuming from" in r.stderr
    _same(reference, load_file(str(out / "last" / "model.safetensors")))
    assert len(_losses(out)) == 8  # one line per step: the redone steps replaced the lost ones


def test_two_nodes_on_one_machine_equal_one_process(tmp_path):
    """Two torchrun agents, one process each, meeting through a c10d rendezvous on 127.0.0.1 as two
    "nodes": the same weights as one process with the same global batch."""
    import socket

    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    single = _train(tmp_path / "s", corpus, "--batch-size", "8", "--max-iters", "4", *FSDP_FIXES)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "two"
    rendezvous = ("--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=attnlab-test")
    cmd = _argv(out, corpus, "--batch-size", "4", "--max-iters", "4", *FSDP_FIXES, launcher=rendezvous)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    for node in nodes:
        _, err = node.communicate(timeout=300)
        assert node.returncode == 0, err[-3000:]
    _same(single, load_file(str(out / "last" / "model.safetensors")))


def test_nan_on_one_rank_stops_every_rank_with_the_same_error(tmp_path):
    """Rank 1's loss turns NaN at step 3: both ranks stop with the same one-line error, the job
    fails, and last/ (step 2) is intact."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    env = _inject(
        tmp_path,
        "import os\n"
        "if os.environ.get('RANK') == '1':\n"
        "    from attnlab.training import trainer\n"
        "    step = trainer.Trainer.train_step\n"
        "    def poisoned(self):\n"
        "        if self.step == 2:\n"
        "            loss = self.task.loss\n"
        "            self.task.loss = lambda model, batch: loss(model, batch) * float('nan')\n"
        "        return step(self)\n"
        "    trainer.Trainer.train_step = poisoned\n",
    )
    out = tmp_path / "run"
    opts = ["--eval-interval", "2", "--batch-size", "4", "--max-iters", "6", "--fsdp", *FSDP_FIXES]
    cmd = _argv(out, corpus, *opts, nproc=2)
    r = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, timeout=300
    )
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and errors[0] == errors[1] and "nan" in errors[0] and "step 3" in errors[0], r.stderr[
        -3000:
    ]
    import json

    assert json.loads((out / "last" / "trainer.json").read_text())["step"] == 2
