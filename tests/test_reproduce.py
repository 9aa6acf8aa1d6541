"""`attnlab reproduce`: every claim runs at a tiny size, and the computed ones PASS exactly."""

import pytest

from attnlab.cli import main
from attnlab.experiments.claims import CLAIMS, Context, run_claims, write_report
from attnlab.models import GPT, GPTConfig

COMPUTED = ["worked-example", "masks", "scaling", "permutation", "sinusoidal", "table1"]


def test_computed_claims_pass(tmp_path):
    ctx = Context(out=tmp_path / "out", work=tmp_path / "work", size="tiny")
    results = run_claims(COMPUTED, ctx, log=lambda m: None)
    for name, r in results.items():
        assert r.passed, (name, r.measured)
    assert "58.89" in results["worked-example"].measured and "0.850" in results["worked-example"].measured
    assert (tmp_path / "out" / "scaling.png").stat().st_size > 1000


@pytest.mark.parametrize("name", [n for n in CLAIMS if n not in COMPUTED])
def test_trained_claims_run_at_tiny_size(name, tmp_path):
    ctx = Context(out=tmp_path / "out", work=tmp_path / "work", size="tiny")
    r = run_claims([name], ctx, log=lambda m: None)[name]
    assert not r.measured.startswith("could not run"), r.measured
    if r.figure:
        assert (tmp_path / "out" / r.figure).is_file()


def test_report_and_command(tmp_path, capsys):
    assert main(["reproduce", "worked-example", "masks", "--out", str(tmp_path / "rep")]) == 0
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "2 of 2 claims PASS" in report and "> With q·k₁ = 102" in report
    assert main(["reproduce", "nonsense", "--out", str(tmp_path / "x")]) == 2
    assert "unknown claim" in capsys.readouterr().err


def test_a_failing_check_is_reported_not_raised(tmp_path, monkeypatch):
    def broken(ctx):
        raise RuntimeError("boom")

    monkeypatch.setitem(CLAIMS, "masks", CLAIMS["masks"].__class__("masks", "t", "s", broken))
    ctx = Context(out=tmp_path, work=tmp_path / "w", size="tiny")
    r = run_claims(["masks"], ctx, log=lambda m: None)["masks"]
    assert not r.passed and "boom" in r.measured
    assert "FAIL" in write_report({"masks": r}, ctx).read_text()


def test_an_untrained_model_fails_the_heads_criterion():
    """The heads claim's baseline: before training, removing a head barely moves the loss (< 0.05
    nats), so the claim's test cannot pass on a model that learned nothing."""
    import torch

    from attnlab.experiments.claims import head_statistics
    from attnlab.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=65, context=64, layers=2, heads=4, dim=64, pos="alibi")).eval()
    ids = torch.randint(0, 65, (8, 65))
    js, deltas, base = head_statistics(model, ids[:, :-1], ids[:, 1:])
    assert js.shape == (4, 4) and len(deltas) == 8 and base > 3.5  # about log(65): a uniform guess
    assert max(d for _, d in deltas) < 0.05


def test_every_seed_trains_the_variants_own_positions_and_the_report_names_the_corpus(tmp_path, monkeypatch):
    """The multi-seed helper popped "pos" from the variant on its first seed, so every later seed
    trained RoPE; and a report without a data folder never said it ran on the embedded corpus."""
    from attnlab.experiments import claims

    trained = []

    def fake_train(ctx, pos, steps, **kw):
        trained.append((pos, kw["seed"]))
        model = GPT(
            GPTConfig(vocab_size=claims._corpus(ctx).tokenizer.vocab_size, context=64, layers=1, heads=1, dim=8)
        )
        return model.eval(), None

    monkeypatch.setattr(claims, "_train_gpt", fake_train)
    ctx = claims.Context(out=tmp_path, work=tmp_path, size="tiny")
    variants = {"learned": {"pos": "learned"}, "rope": {}}
    claims._gpt_losses(ctx, variants, steps=1, seeds=(0, 1, 2))
    assert trained == [("learned", 0), ("learned", 1), ("learned", 2), ("rope", 0), ("rope", 1), ("rope", 2)]
    assert variants["learned"] == {"pos": "learned"}  # (not emptied either)
    report = claims.write_report({}, ctx).read_text()
    assert "Text corpus of the text claims: the embedded corpus" in report


def test_the_cka_claim_runs_its_untrained_control_and_says_when_it_cannot_decide(tmp_path):
    ctx = Context(out=tmp_path / "out", work=tmp_path / "work", size="tiny")
    r = run_claims(["cka"], ctx, log=lambda m: None)["cka"]
    assert r.control.startswith("untrained ViT") and r.status in ("PASS", "FAIL", "INCONCLUSIVE")
    untrained = float(r.control.rsplit(" ", 1)[1])
    cnn = float(r.measured.split("CNN ")[1].split(" ")[0].rstrip(","))
    vit = float(r.measured.split("ViT ")[1].split(",")[0])
    if vit > cnn and untrained > cnn:  # the control clears the bar too: not a PASS
        assert r.status == "INCONCLUSIVE" and not r.passed
    report = write_report({"cka": r}, ctx).read_text()
    assert f"— {r.status}" in report and "**Control**: untrained ViT" in report


def test_comparative_claims_decide_on_intervals_over_seeds():
    from attnlab.experiments.claims import better_verdict, paired_interval, same_verdict

    mean, low, high = paired_interval([0.05, 0.07, 0.06])
    # by hand: mean 0.06, sd 0.01, t(2) = 4.303, half-width 4.303 * 0.01 / √3 = 0.02484
    assert mean == pytest.approx(0.06) and low == pytest.approx(0.06 - 0.02484, abs=1e-4) and high > 0
    assert better_verdict([0.05, 0.07, 0.06], "d")[:2] == (True, None)  # the interval lies above 0
    assert better_verdict([0.05, -0.04, 0.02], "d")[1] == "INCONCLUSIVE"  # seed noise as large as the gap
    assert better_verdict([-0.05, -0.07, -0.06], "d")[1] == "FAIL"
    assert better_verdict([0.3], "d")[1] == "INCONCLUSIVE"  # one seed decides nothing
    assert same_verdict([0.001, -0.002, 0.0], 0.03, "d")[:2] == (True, None)
    assert same_verdict([0.2, 0.21, 0.19], 0.03, "d")[1] == "FAIL"
    assert same_verdict([0.0, 0.05, -0.04], 0.03, "d")[1] == "INCONCLUSIVE"
