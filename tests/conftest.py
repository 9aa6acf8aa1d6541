import os
from pathlib import Path

import pytest
import torch
from figure_checks import judging

# A run's thread count follows the machine's load unless it is fixed (attnlab/training/threads.py);
# the suite fixes it, in this process and in the commands it starts, so that what else runs on the
# machine cannot change a sum's order between two runs that must agree to the last bit
# (tests/test_threads.py drives the adaptive choice with made-up load figures instead).
# OMP_NUM_THREADS=1 (or 2) in the environment runs the whole suite at that count; otherwise each of
# pytest-xdist's workers (`make test` runs one per core, up to four) takes its share of the cores.
# (The count asked for is kept apart: pytest-xdist's workers inherit this process's environment.)
_asked = os.environ.setdefault("ATTNLAB_TESTS_OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", ""))
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
torch.set_num_threads(int(_asked or max(1, min(2, (os.cpu_count() or 1) // _workers))))
os.environ["OMP_NUM_THREADS"] = str(torch.get_num_threads())

# The suite runs the same on every CPU: `--dtype auto` sees "no fast bf16" unless a test says
# otherwise (tests/test_dtype.py runs both branches by setting this itself). Subprocesses inherit it.
# ATTNLAB_FAST_BF16=1 in the environment runs the whole suite as a CPU with fast bf16 would, so
# that both sides of the detection can be checked on one machine (tests never depend on which).
os.environ.setdefault("ATTNLAB_FAST_BF16", "0")

# Tests never download: a model named by its HuggingFace hub id is read from the cache a test
# builds (tests/test_hub.py), and a missing one is an error at once, not a network timeout.
os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def data_dir() -> Path | None:
    """../shared/data through ATTNLAB_DATA (CI sets it); None when absent."""
    d = os.environ.get("ATTNLAB_DATA")
    if d and Path(d).is_dir():
        return Path(d)
    guess = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    return guess if guess.is_dir() else None


@pytest.fixture
def shared_data():
    d = data_dir()
    if d is None:
        pytest.skip("shared data not found; set ATTNLAB_DATA")
    return d


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """``tiny_run(family)``: that family's run with its ``Recipe.tiny`` options (a few seconds,
    pinned to the CPU in fp32), trained the first time a test asks for it and shared by every test
    that only needs a trained model of that family. Tests must not change its folder."""
    import attnlab
    from attnlab.recipes import recipes

    runs = {}

    def get(family: str):
        if family not in runs:
            recipe = next(r for r in recipes() if r.name == family)
            opts = dict(recipe.tiny)
            data = opts.pop("data", None)
            out = tmp_path_factory.mktemp(f"tiny_{family}") / family
            with pytest.MonkeyPatch.context() as mp, judging():  # (its loss curve judged for a slide)
                mp.setenv("ATTNLAB_FAST_BF16", "0")
                runs[family] = attnlab.train(family, data=data, out=out, **opts)
        return runs[family]

    return get


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Every claim at the tiny size, in one context (they share trained models, as in `attnlab
    reproduce`): ``(ctx, results)``. The machinery each claim runs through (its training, its
    statistics, its control, its figures and its report lines), not its verdict: verdicts are
    judged at the quick and full sizes (`attnlab reproduce --quick`, the full report)."""
    from attnlab.experiments import CLAIMS, Context, run_claims
    from attnlab.training.trainer import Trainer

    tmp = tmp_path_factory.mktemp("reproduce")
    ctx = Context(out=tmp / "out", work=tmp / "work", size="tiny")
    # every Trainer's device, dtype and thread count, kept in ctx.cache["trainer settings"] (the claims'
    # training must be pinned: tests/test_reproduce.py)
    seen, original = [], Trainer.__init__

    def recording(self, model, task, cfg, *args, **kwargs):
        seen.append((cfg.device, cfg.dtype, cfg.threads))
        original(self, model, task, cfg, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp, judging():  # (every claim figure judged for a slide: test_figure_text.py)
        mp.setattr(Trainer, "__init__", recording)
        results = run_claims(list(CLAIMS), ctx, log=lambda m: None)
    ctx.cache["trainer settings"] = seen
    return ctx, results
