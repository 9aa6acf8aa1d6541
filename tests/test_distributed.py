"""Two processes with gloo on CPU, launched by torchrun, equal one process with the same global batch."""

import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file
import torch

TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 60


def _train(out, corpus, *extra, nproc=1):
    base = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        if nproc > 1
        else [sys.executable]
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        *base,
        "-m",
        "attnlab",
        "train",
        "gpt",
        "--data",
        str(corpus),
        "--out",
        str(out),
        "--preset",
        "nano",
        "--block-size",
        "16",
        "--dropout",
        "0",
        "--eval-interval",
        "3",
        "--eval-iters",
        "1",
        "--lr-decay-iters",
        "6",
        "--warmup-iters",
        "2",
        "--no-progress",
        "--sample-chars",
        "0",
        "--seed",
        "7",
        *extra,
    ]
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
