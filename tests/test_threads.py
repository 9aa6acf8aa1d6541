"""The thread count a run computes with (attnlab/training/threads.py): both sides of the choice,
driven by made-up CPU samples (never by this machine's load or timing)."""

import pytest
import torch

from attnlab.training.threads import CpuSample, CpuShare, free_threads, others_busy, read_cpu_sample


@pytest.fixture(autouse=True)
def keep_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_others_busy_subtracts_our_own_time():
    # 4 s of wall: the cores were busy 7.5 core-seconds, 3.5 of them ours -> others used 1 core
    assert others_busy(CpuSample(100.0, 10.0, 50.0), CpuSample(107.5, 13.5, 54.0)) == pytest.approx(1.0)
    assert others_busy(CpuSample(0.0, 0.0, 1.0), CpuSample(1.0, 2.0, 2.0)) == 0.0  # never negative


@pytest.mark.parametrize(
    "cores, others, threads",
    [(2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.0, 1), (2, 3.0, 1), (8, 2.2, 6), (8, 0.0, 8), (1, 0.9, 1)],
)
def test_free_threads_rounds_to_whole_cores_and_keeps_one(cores, others, threads):
    assert free_threads(cores, others) == threads


class FakeMachine:
    """CPU samples of a machine where other processes use ``others`` cores, and we use the rest."""

    def __init__(self, cores):
        self.cores, self.others, self.t = cores, 0.0, 0.0
        self.busy = self.own = 0.0

    def advance(self, seconds, ours):
        self.t += seconds
        self.own += ours * seconds
        self.busy += (ours + self.others) * seconds

    def __call__(self, cores):
        return CpuSample(self.busy, self.own, self.t)


def test_a_run_gives_cores_to_a_neighbour_and_takes_them_back():
    machine = FakeMachine(2)
    share = CpuShare(cores=[0, 1], sample=machine, interval=2.0)
    assert share.adapting and share.threads == 2 and torch.get_num_threads() == 2
    machine.advance(1.0, ours=2.0)
    assert share.poll(now=machine.t) is None  # too early to look again
    machine.others = 1.0  # a second training starts
    machine.advance(2.0, ours=1.0)
    assert share.poll(now=machine.t) == 1 and torch.get_num_threads() == 1
    assert "1 of 2 cores (other processes used 0.7)" in share.describe()  # 2 of the 3 s since the last look
    machine.advance(2.0, ours=1.0)
    assert share.poll(now=machine.t) is None  # still shared: no change
    machine.others = 0.0  # it ended
    machine.advance(2.0, ours=1.0)
    assert share.poll(now=machine.t) == 2 and torch.get_num_threads() == 2


def test_threads_asked_for_or_in_the_environment_stay_fixed(monkeypatch):
    machine = FakeMachine(2)
    share = CpuShare(1, cores=[0, 1], sample=machine)
    assert not share.adapting and torch.get_num_threads() == 1 and share.reason == "--threads"
    machine.advance(5.0, ours=1.0)
    assert share.poll(now=machine.t) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert not CpuShare(cores=[0, 1], sample=machine).adapting


def test_a_system_without_load_figures_keeps_all_cores():
    share = CpuShare(cores=[0, 1, 2], sample=lambda cores: None)
    assert not share.adapting and share.threads == 3 and "does not report" in share.reason
    assert share.poll(now=1e9) is None


def test_this_machine_reports_a_sample_with_our_own_time():
    sample = read_cpu_sample([0])
    if sample is None:
        pytest.skip("no /proc on this system")
    assert sample.busy >= 0 and sample.own > 0  # (this process has run)


def test_a_run_restores_the_callers_thread_count(tmp_path):
    from attnlab.data.text import prepare
    from attnlab.models import GPT, GPTConfig
    from attnlab.training.runs import run_header
    from attnlab.training import LanguageModelTask, TrainConfig, Trainer

    (tmp_path / "corpus.txt").write_text("a small corpus of text for a tiny model. " * 40)
    data = prepare(str(tmp_path / "corpus.txt"), tmp_path / "run" / "data")
    model = GPT(GPTConfig(vocab_size=data.tokenizer.vocab_size, context=8, layers=1, heads=1, dim=8))
    torch.set_num_threads(2)
    cfg = TrainConfig(max_iters=2, batch_size=2, eval_interval=2, eval_iters=1, progress=False, threads=1)
    trainer = Trainer(model, LanguageModelTask(data, 8, 2), cfg, tmp_path / "run")
    assert torch.get_num_threads() == 1
    assert run_header(trainer).endswith(", 1 thread") and run_header(trainer, why=True).endswith(
        ", 1 thread (--threads)"
    )
    trainer.fit()
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match=r"\(--threads\).*must be at least 1"):
        TrainConfig(threads=0)


def test_a_compiled_run_keeps_its_thread_count(tmp_path, monkeypatch):
    """torch.compile guards a graph on the thread count: changing it mid-run recompiled the model
    (`GLOBAL_STATE changed: num_threads` under TORCH_LOGS=recompiles), once per count. A compiled run
    does not look at the machine's load; an eager one does."""
    from attnlab.data.text import prepare
    from attnlab.models import GPT, GPTConfig
    from attnlab.training import LanguageModelTask, TrainConfig, Trainer

    polled = []
    monkeypatch.setattr(CpuShare, "poll", lambda self, now=None: polled.append(1) or None)
    (tmp_path / "corpus.txt").write_text("a small corpus of text for a tiny model. " * 40)
    data = prepare(str(tmp_path / "corpus.txt"), tmp_path / "data")
    for compiled in (False, True):
        polled.clear()
        model = GPT(GPTConfig(vocab_size=data.tokenizer.vocab_size, context=8, layers=1, heads=1, dim=8))
        cfg = TrainConfig(max_iters=2, batch_size=2, eval_interval=2, eval_iters=1, progress=False, compile=compiled)
        trainer = Trainer(model, LanguageModelTask(data, 8, 2), cfg, tmp_path / f"run_{compiled}")
        trainer.fit()
        assert len(polled) == (0 if compiled else 2), compiled
