"""--compile auto: the pay-off rule on both sides, and the trainer switching (or falling back)
mid-run without changing what it computes. torch.compile itself is replaced: these tests check
attnlab's decision and plumbing, not the compiler (benchmarks/gpt_speed.py --compile measures that)."""

import pytest
import torch

from attnlab.training import compiling
from attnlab.training import trainer as T

from test_train import TEXT, _setup

CPU = torch.device("cpu")


def test_a_long_run_compiles_and_a_short_one_does_not(monkeypatch):
    monkeypatch.setattr(compiling, "cpp_compiler", lambda: "g++")
    cost, speedup = compiling.COMPILE_SECONDS["cpu"], compiling.EXPECTED_SPEEDUP["cpu"]
    # the break-even number of 1-second steps: saved = n (1 - 1/s) = MARGIN * cost
    even = compiling.MARGIN * cost / (1 - 1 / speedup)
    long = compiling.pays_off(int(even) + 10, 1.0, CPU)
    short = compiling.pays_off(int(even) - 10, 1.0, CPU)
    assert long.on and long.reason.startswith("on:")
    assert not short.on and short.reason.startswith("off:")
    # the nanoGPT CPU recipe (2,000 steps of ~36 ms) is too short to pay back compiling
    assert not compiling.pays_off(2000, 0.036, CPU).on
    # and under bf16 autocast a compiled CPU step is slower: never worth it
    bf16 = compiling.pays_off(int(even) * 10, 1.0, CPU, torch.bfloat16)
    assert not bf16.on and "bf16" in bf16.reason


def test_no_cpp_compiler_means_no_compile_on_cpu(monkeypatch):
    monkeypatch.setattr(compiling, "cpp_compiler", lambda: None)
    choice = compiling.pays_off(10**6, 10.0, CPU)
    assert not choice.on and "C++ compiler" in choice.reason


def _always_on(remaining, seconds, device, dtype):
    return compiling.CompileChoice(True, "on: test")


def _losses(trainer):
    return [r["loss"] for r in trainer.history]


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "corpus.txt").write_text(TEXT)
    return tmp_path


def test_auto_switches_to_the_compiled_model_mid_run_and_computes_the_same(corpus, monkeypatch):
    (corpus / "a").mkdir()
    (corpus / "a" / "corpus.txt").write_text(TEXT)
    eager = _setup(corpus / "a", dropout=0.0, compile=False)
    eager.fit()

    calls = []

    def fake_compile(model):  # stands in for torch.compile: a wrapper that runs the same model
        calls.append(model)
        return _Wrapper(model)

    monkeypatch.setattr(T, "pays_off", _always_on)
    monkeypatch.setattr(torch, "compile", fake_compile)
    auto = _setup(corpus, dropout=0.0)  # compile=None: auto
    assert auto.cfg.compile is None
    auto.fit()
    assert len(calls) == 1 and auto._compiled is not None and auto.compile_reason == "on: test"
    assert _Wrapper.calls > 0  # training steps after the decision went through the compiled model
    assert _losses(auto) == pytest.approx(_losses(eager), abs=1e-6)


class _Wrapper(torch.nn.Module):
    calls = 0

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *a, **kw):
        type(self).calls += 1
        return self.inner(*a, **kw)


def test_a_failing_compiler_falls_back_to_eager_without_losing_the_step(corpus, monkeypatch):
    (corpus / "a").mkdir()
    (corpus / "a" / "corpus.txt").write_text(TEXT)
    eager = _setup(corpus / "a", compile=False)  # dropout on: the random stream must be replayed too
    eager.fit()

    class Broken(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *a, **kw):
            raise RuntimeError("C++ compile error: no such header\nmore lines")

    monkeypatch.setattr(T, "pays_off", _always_on)
    monkeypatch.setattr(torch, "compile", Broken)
    auto = _setup(corpus)
    auto.fit()
    assert auto._compiled is None
    assert auto.compile_reason.startswith("off: compiling failed (C++ compile error: no such header)")
    assert _losses(auto) == pytest.approx(_losses(eager), abs=1e-6)


def test_auto_never_compiles_tasks_whose_batches_change_shape(corpus, monkeypatch):
    monkeypatch.setattr(T, "pays_off", lambda *a: pytest.fail("asked although the shapes vary"))
    auto = _setup(corpus)
    monkeypatch.setattr(type(auto.task), "static_shapes", False)
    auto.fit()
    assert auto._compiled is None and "change shape" in auto.compile_reason


def test_the_decision_uses_the_measured_step_time_and_the_steps_left(corpus, monkeypatch):
    seen = []
    monkeypatch.setattr(
        T,
        "pays_off",
        lambda remaining, seconds, device, dtype: (
            seen.append((remaining, seconds)) or compiling.CompileChoice(False, "off: test")
        ),
    )
    auto = _setup(corpus, max_iters=12)
    auto.fit()
    ((remaining, seconds),) = seen
    assert remaining == 12 - (1 + compiling.PROBE_STEPS) and 0 < seconds < 60
    assert auto.compile_reason == "off: test"
