"""`attnlab reproduce`: the computed claims PASS exactly and their controls fail; at the tiny size
every trained claim runs through its training, statistics, control, figure and report (its verdict
is judged at the quick and full sizes: benchmarks/reproduce_quick.py and the full report)."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab.cli import main
from attnlab.experiments import CLAIMS, Context, Control, Result, run_claims, write_docs, write_report
from attnlab.experiments import runs
from attnlab.models import GPT, GPTConfig

COMPUTED = [
    "worked-example",
    "masks",
    "soft-lookup",
    "scaling",
    "table1",
    "attention-memory",
    "permutation",
    "pe-requirements",
    "sinusoidal",
    "receptive-field",
    "conv-expression",
]


def test_computed_claims_pass_and_their_controls_fail(tmp_path):
    ctx = Context(out=tmp_path / "out", work=tmp_path / "work", size="tiny")
    results = run_claims(COMPUTED, ctx, log=lambda m: None)
    for name, r in results.items():
        assert r.status == "PASS", (name, r.measured)
        assert r.control is not None and not r.control.cleared, (name, r.control)
        assert r.data == "computed: no data" or "digits" in r.data
    assert "58.89" in results["worked-example"].measured and "0.850" in results["worked-example"].measured
    assert "0.953" in results["worked-example"].control.measured  # softmax(102, 99) unscaled, by hand
    assert (tmp_path / "out" / "scaling.png").stat().st_size > 1000


TRAINED = [n for n in CLAIMS if n not in COMPUTED]


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINED)
def test_every_trained_claim_runs_its_control_and_reports_at_the_tiny_size(name, tiny):
    ctx, results = tiny
    r = results[name]
    assert not r.measured.startswith("could not run"), r.measured
    assert r.status in ("PASS", "FAIL", "INCONCLUSIVE", "SKIPPED", "WITHDRAWN") and r.data and r.seconds >= 0
    if r.status in ("SKIPPED", "WITHDRAWN"):  # data absent (never a substitute), or nothing to run
        pytest.skip(r.measured)
    assert r.control is not None, f"{name} has no control"
    assert r.control.what and r.control.measured and isinstance(r.control.cleared, bool)
    assert r.status != "PASS" or not r.control.cleared  # a cleared control never leaves a PASS
    if r.figure:
        assert (ctx.out / r.figure).stat().st_size > 1000
    report = write_report({name: r}, ctx).read_text()
    assert f"— {r.status}" in report and f"**Control**: {r.control.what}" in report


def test_a_claims_vit_is_the_run_attnlab_train_vit_makes_with_the_same_options(tiny, tmp_path):
    """`reproduce` trains through the family's own code: the digits ViT the image claims share and
    `attnlab train vit` given the same options (as flags) end with identical weights."""
    from safetensors.torch import load_file

    ctx, _ = tiny
    flags = []
    for name, value in runs.digits_vit_options(ctx).items():
        flag = "--" + name.replace("_", "-")
        flags += [flag if value else "--no-" + flag[2:]] if isinstance(value, bool) else [flag, str(value)]
    assert main(["train", "vit", *flags, "--out", str(tmp_path / "cli")]) == 0
    claim_run = ctx.work / runs.digits_vit_run(ctx)
    ours, theirs = (load_file(run / "last" / "model.safetensors") for run in (claim_run, tmp_path / "cli"))
    assert ours.keys() == theirs.keys() and len(ours) > 10
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_a_control_that_clears_the_criterion_makes_the_claim_inconclusive(tmp_path):
    cleared = Result("m", True, "c", control=Control("the model before training", "as good", True))
    assert cleared.status == "INCONCLUSIVE"
    assert Result("m", True, "c", control=Control("x", "worse", False)).status == "PASS"
    assert Result("m", False, "c", control=Control("x", "as good", True)).status == "FAIL"
    assert Result("m", True, "c", verdict="SKIPPED").status == "SKIPPED"
    ctx = Context(out=tmp_path, work=tmp_path / "w", size="tiny")
    report = write_report({"masks": cleared}, ctx).read_text()
    assert "0 of 1 claims PASS, 1 INCONCLUSIVE" in report
    assert "**Control**: the model before training: as good (by the claim's criterion: PASS)" in report
    assert (
        "**Verdict**: INCONCLUSIVE: the must-fail control (the model before training) reaches the same PASS" in report
    )


def test_report_and_command(tmp_path, capsys):
    assert main(["reproduce", "worked-example", "masks", "--out", str(tmp_path / "rep")]) == 0
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "2 of 2 claims PASS" in report and "> With q·k₁ = 102" in report
    assert "**Data**: computed: no data" in report and "**Control**: the same attention without dividing" in report
    assert "- **Deck**: CS-433, 001_1521457a98367c77.txt:251" in report
    assert "CS-433, 001_1521457a98367c77.txt:292 (“58.9”)" in report
    assert main(["reproduce", "nonsense", "--out", str(tmp_path / "x")]) == 2
    assert "unknown claim" in capsys.readouterr().err


def test_a_stopped_report_resumes_with_the_claims_it_had_judged(tmp_path, capsys, monkeypatch):
    """Each result is saved in OUT/results.json as its claim ends; --resume keeps those (not run
    again, numbers and control as they were) and runs the rest; a file of the other size is refused."""
    import json

    out = tmp_path / "rep"
    assert main(["reproduce", "worked-example", "--quick", "--out", str(out)]) == 0
    saved = json.loads((out / "results.json").read_text())
    assert saved["size"] == "quick" and list(saved["claims"]) == ["worked-example"]
    first = saved["claims"]["worked-example"]
    ran = []
    original = CLAIMS["worked-example"].check
    monkeypatch.setattr(CLAIMS["worked-example"], "check", lambda ctx: ran.append(1) or original(ctx))
    assert main(["reproduce", "worked-example", "masks", "--quick", "--resume", "--out", str(out)]) == 0
    assert not ran and "kept from" in capsys.readouterr().err
    again = json.loads((out / "results.json").read_text())["claims"]
    assert list(again) == ["worked-example", "masks"] and again["worked-example"] == first
    assert "2 of 2 claims PASS" in (out / "report.md").read_text()
    assert main(["reproduce", "masks", "--resume", "--out", str(out)]) == 2  # full size on quick results
    assert "holds quick-size results" in capsys.readouterr().err
    assert main(["reproduce", "worked-example", "--quick", "--out", str(out)]) == 0  # no --resume: runs again
    assert ran and list(json.loads((out / "results.json").read_text())["claims"]) == ["worked-example"]


def test_ctrl_c_in_a_claims_training_stops_the_report_and_resume_reruns_what_could_not_run(
    tmp_path, capsys, monkeypatch
):
    """Ctrl-C inside a claim's training stops the whole report (exit 130, never an ERROR for that
    claim), saying where the judged claims are and how to continue; a claim that could not run
    (ERROR) is not kept by --resume: it runs again."""
    import json

    from attnlab.training.trainer import TrainingInterrupted

    out, masks = tmp_path / "rep", CLAIMS["masks"].check

    def interrupted(ctx):
        raise TrainingInterrupted(3, tmp_path / "run")

    monkeypatch.setattr(CLAIMS["masks"], "check", interrupted)
    assert main(["reproduce", "worked-example", "masks", "soft-lookup", "--quick", "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "stopped: the 1 claim(s) judged so far are saved in" in err and "with --resume continues" in err
    assert list(json.loads((out / "results.json").read_text())["claims"]) == ["worked-example"]
    monkeypatch.setattr(CLAIMS["masks"], "check", lambda ctx: 1 / 0)  # a check that cannot run: ERROR
    assert main(["reproduce", "worked-example", "masks", "--quick", "--resume", "--out", str(out)]) == 1
    assert json.loads((out / "results.json").read_text())["claims"]["masks"]["verdict"] == "ERROR"
    monkeypatch.setattr(CLAIMS["masks"], "check", masks)
    assert main(["reproduce", "worked-example", "masks", "--quick", "--resume", "--out", str(out)]) == 0
    assert json.loads((out / "results.json").read_text())["claims"]["masks"]["verdict"] is None  # run again: PASS
    # a resumed run that saves a claim (worked-example) and is stopped (in masks) before it reaches a kept
    # claim (soft-lookup) still has that one in the file, in the claims' order: --resume never loses what
    # an earlier run judged
    assert main(["reproduce", "soft-lookup", "--quick", "--resume", "--out", str(out)]) == 0
    kept = json.loads((out / "results.json").read_text())["claims"]
    (out / "results.json").write_text(json.dumps({"size": "quick", "claims": {"soft-lookup": kept["soft-lookup"]}}))
    monkeypatch.setattr(CLAIMS["masks"], "check", interrupted)
    assert main(["reproduce", "--quick", "--resume", "--out", str(out)]) == 130
    after = json.loads((out / "results.json").read_text())["claims"]
    assert list(after) == ["worked-example", "soft-lookup"] and after["soft-lookup"] == kept["soft-lookup"]


def test_a_check_that_cannot_run_is_reported_as_an_error_not_raised(tmp_path, monkeypatch):
    """A check that raises is ERROR ("could not run: ..." in one line), counted apart from FAIL:
    no verdict on the lecture's statement."""

    def broken(ctx):
        raise RuntimeError("boom\nmore lines")

    monkeypatch.setitem(CLAIMS, "masks", CLAIMS["masks"].__class__("masks", "t", "s", broken))
    ctx = Context(out=tmp_path, work=tmp_path / "w", size="tiny")
    r = run_claims(["masks"], ctx, log=lambda m: None)["masks"]
    assert not r.passed and r.status == "ERROR" and r.measured == "could not run: RuntimeError: boom"
    report = write_report({"masks": r}, ctx).read_text()
    assert "0 of 1 claims PASS, 1 ERROR" in report and "1 FAIL" not in report


def test_an_untrained_model_fails_the_heads_criterion():
    """The heads claim's baseline: before training, removing a head barely moves the loss (< 0.05
    nats), so the claim's test cannot pass on a model that learned nothing."""
    import torch

    from attnlab.experiments.heads import head_statistics
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
    trained = []

    def fake_train(ctx, pos, steps, **kw):
        trained.append((pos, kw["seed"]))
        model = GPT(GPTConfig(vocab_size=runs.corpus(ctx).tokenizer.vocab_size, context=64, layers=1, heads=1, dim=8))
        return model.eval(), None

    monkeypatch.setattr(runs, "train_gpt", fake_train)
    ctx = Context(out=tmp_path, work=tmp_path, size="tiny")
    variants = {"learned": {"pos": "learned"}, "rope": {}}
    runs.gpt_losses(ctx, variants, steps=1, seeds=(0, 1, 2))
    assert trained == [("learned", 0), ("learned", 1), ("learned", 2), ("rope", 0), ("rope", 1), ("rope", 2)]
    assert variants["learned"] == {"pos": "learned"}  # (not emptied either)
    (r,) = run_claims(["multi-head"], ctx, log=lambda m: None).values()
    assert r.data.startswith("the embedded corpus") and "Tiny Shakespeare was not used" in r.data
    assert f"| {r.data} |" in write_report({"multi-head": r}, ctx).read_text()


def test_the_cka_claim_compares_matched_depths_and_is_controlled_by_a_trained_a_a_run(tiny):
    """cka: the ViT's blocks at the CNN's stages' relative depths (4 blocks, 2 stages: blocks 2 and 4),
    a bootstrap interval over the test images, and its null a second trained ViT (another seed) in the
    CNN's place, by the same criterion (when it clears the bar, the claim is INCONCLUSIVE)."""
    from attnlab.experiments.stats import aa_seeds

    ctx, results = tiny
    r = results["cka"]
    assert "blocks 2 and 4 of 4" in r.measured and "stages 1 and 2" in r.measured
    assert "95 % bootstrap interval" in r.measured and "95 % bootstrap interval" in r.control.measured
    assert r.control.what.startswith("an A/A run") and "CKA(ViT, another seed)" in r.control.measured
    assert (ctx.work / f"vit_learned_{runs.DIGITS_STEPS[0]}st_s{aa_seeds([0], 'cka')[0]}").is_dir()  # trained
    if r.control.cleared:
        assert r.status == "INCONCLUSIVE"
    report = write_report({"cka": r}, ctx).read_text()
    assert f"— {r.status}" in report and "**Control**: an A/A run" in report


def test_the_cka_null_clears_when_two_models_layers_differ_in_kind_and_not_for_one_model_twice():
    """cka's A/A null is the claim's own criterion with a second model in the CNN's place: the same
    model twice does not clear it (every resampling's difference is 0); a second model whose last layer
    is unrelated to its first does, as a real difference between two seeds' models would."""
    from attnlab.experiments.vision import cka_gap

    g = torch.Generator().manual_seed(0)
    first = torch.randn(128, 16, generator=g, dtype=torch.float64)
    one = (first, torch.tanh(first @ torch.randn(16, 16, generator=g, dtype=torch.float64) / 4))
    same = cka_gap(one, one, reps=200)
    assert same[:2] == (False, False) and same[2] == "+0.000 [+0.000, +0.000]"
    unrelated = (first, torch.randn(128, 16, generator=g, dtype=torch.float64))
    assert cka_gap(one, unrelated, reps=200)[0]


def test_gram_cka_and_the_bootstrap_interval():
    """gram_cka on x xᵀ and y yᵀ is linear_cka of x and y; the bootstrap interval of a mean over
    items holds the mean and is about ±1.96 standard errors wide (hand-computed)."""
    from attnlab.experiments.stats import bootstrap_interval
    from attnlab.inspect import analysis as A

    torch.manual_seed(0)
    x, y = torch.randn(100, 12).double(), torch.randn(100, 7).double()
    y = y + x[:, :7]
    assert A.gram_cka(x @ x.T, y @ y.T) == pytest.approx(A.linear_cka(x, y), abs=1e-12)
    values = np.random.default_rng(1).normal(0.0, 1.0, 400)
    mean, low, high = bootstrap_interval(lambda i: values[i].mean(), len(values), reps=2000)
    se = values.std() / np.sqrt(len(values))
    assert mean == pytest.approx(values.mean()) and low < mean < high
    assert high - low == pytest.approx(2 * 1.96 * se, rel=0.15)


def test_an_accuracy_interval_holds_the_test_sets_sampling_error_beside_the_seeds():
    """Per-item differences (seeds, N): the variance of the mean is the two-way analysis of
    variance's components (σ_a²/S + σ_b²/N + σ_e²/(S N), each at least 0), the mean squares summed
    by hand here (independent Bernoulli draws: only σ_e² is real); a difference the seeds agree on exactly but that rests
    on 3 of 400 items is not significant."""
    from scipy import stats as scipy_stats

    from attnlab.experiments.stats import better_verdict, paired_interval

    rng = np.random.default_rng(0)
    items = (rng.random((3, 400)) < 0.8).astype(float) - (rng.random((3, 400)) < 0.75).astype(float)
    mean, low, high = paired_interval(None, items=items)
    S, N = items.shape
    grand = sum(sum(row) for row in items) / (S * N)
    rows = [sum(items[s]) / N for s in range(S)]
    cols = [sum(items[s][i] for s in range(S)) / S for i in range(N)]
    ms_seeds = N * sum((r - grand) ** 2 for r in rows) / (S - 1)
    ms_items = S * sum((c - grand) ** 2 for c in cols) / (N - 1)
    ms_error = sum((items[s][i] - rows[s] - cols[i] + grand) ** 2 for s in range(S) for i in range(N)) / (
        (S - 1) * (N - 1)
    )
    assert ms_seeds < ms_error < ms_items  # (the seeds' component estimated below 0: it counts as 0)
    variance = (ms_items - ms_error) / S / N + ms_error / (S * N)  # σ_b²/N + σ_e²/(S N)
    half = scipy_stats.t.ppf(0.975, N - 1) * np.sqrt(variance)  # (σ_b² + σ_e²/S: the items' mean square, N − 1)
    assert mean == pytest.approx(grand) and (high - low) / 2 == pytest.approx(half, rel=1e-3)
    few = np.zeros((3, 400))
    few[:, :3] = 1.0  # every seed right on the same 3 items more: +0.0075 each, no seed spread
    assert better_verdict(few.mean(1), "x", resolution=0.0)[0]  # (seeds alone: significant)
    passed, verdict, words = better_verdict(None, "x", items=few)
    assert not passed and verdict == "INCONCLUSIVE" and "400 test items" in words


@pytest.mark.parametrize(
    "seeds,n,seed_sd,item_sd,noise_sd",
    [(3, 360, 0.02, 0.3, 0.4), (3, 360, 0.0, 0.3, 0.4), (5, 144, 0.02, 0.2, 0.4), (3, 360, 0.01, 0.0, 0.45)],
)
def test_the_seeds_and_items_interval_covers_95_percent_in_simulation(seeds, n, seed_sd, item_sd, noise_sd):
    """d[s, i] = a[s] + b[i] + e[s, i], true mean 0, drawn 1,000 times: the 95 % interval holds 0 in
    93-97 % of the draws (the quadrature sum it replaced: 98.5-99.4 % on these four). Where one
    seed's effect outweighs everything else by far (3 seeds, seed sd 0.03 against noise 0.3 on 200
    items) Satterthwaite's 2 degrees of freedom leave it at 93.0 %."""
    from attnlab.experiments.stats import seeds_items_interval

    rng = np.random.default_rng(0)
    held = 0
    for _ in range(1000):
        d = seed_sd * rng.standard_normal((seeds, 1)) + item_sd * rng.standard_normal((1, n))
        d = d + noise_sd * rng.standard_normal((seeds, n))
        _, low, high = seeds_items_interval(d)
        held += low <= 0 <= high
    assert 0.93 <= held / 1000 <= 0.97


def test_the_t_quantile_between_the_tables_entries():
    from scipy import stats as scipy_stats

    from attnlab.experiments.stats import t95

    for df in (1, 2, 3.7, 7.5, 15.3, 45, 90, 250, 1000, 1e12):
        exact = scipy_stats.t.ppf(0.975, df)
        assert exact * 0.999 <= t95(df) <= exact * (1.005 if df >= 3 else 1.2), df


def test_a_threshold_judged_per_seed_passes_in_all_fails_in_none_and_is_undecided_between():
    from attnlab.experiments.stats import seeds_verdict

    assert seeds_verdict([True, True, True]) == (True, None)
    assert seeds_verdict([False, False]) == (False, "FAIL")
    assert seeds_verdict(h for h in (True, False, True)) == (False, "INCONCLUSIVE")


def test_the_filters_smoothness_is_their_leading_components_low_frequency_share():
    """By hand: filters that are multiples of a constant image have one component, all of it at
    DCT (0, 0): share 1; multiples of a checkerboard: nearly all at the highest frequencies, share under 0.01; a horizontal ramp's
    energy sits at u = 0 and odd v, 99 % of it at v = 1, so above 0.9; white-noise filters sit near the low coefficients' share, 6 of 49."""
    from attnlab.experiments.vision import low_frequency_share

    scale = torch.linspace(-1, 1, 16)[:, None, None, None]
    checker = (torch.arange(7)[:, None] + torch.arange(7)[None, :]) % 2 * 2.0 - 1
    ramp = torch.arange(7.0).expand(7, 7) - 3
    assert low_frequency_share(scale * torch.ones(1, 7, 7), n=1) == pytest.approx(1.0)  # (one component: rank 1)
    assert low_frequency_share(scale * checker[None], n=1) < 0.01
    assert low_frequency_share(scale * ramp[None], n=1) > 0.9
    noise = [
        low_frequency_share(torch.randn(64, 1, 7, 7, generator=torch.Generator().manual_seed(s))) for s in range(20)
    ]
    assert np.mean(noise) == pytest.approx(6 / 49, abs=0.03)


SINGLE_MODEL_ONCE = ("bottleneck", "alignment", "caption-bottleneck", "rollout", "vit-figures")


@pytest.mark.slow
def test_claims_that_rested_on_one_model_judge_every_seeds_own(tmp_path, monkeypatch):
    """Given two seeds, each of these claims trains its models again for the second and reports
    that seed's measures (its verdict needs both: seeds_verdict)."""
    from attnlab.experiments import recurrence, vision

    for module in (recurrence, vision):
        monkeypatch.setattr(module, "seeds_for", lambda ctx, full=3: (0, 1))
    ctx = Context(out=tmp_path / "out", work=tmp_path / "work", size="tiny")
    results = run_claims(list(SINGLE_MODEL_ONCE), ctx, log=lambda m: None)
    mnist = results["vit-figures"].status != "SKIPPED"  # (its filters are trained on MNIST where it is found)
    for name, r in results.items():
        assert not r.measured.startswith("could not run"), r.measured
        if name != "vit-figures" or mnist:
            assert "seed 1" in r.measured or "seeds 0, 1" in r.measured, (name, r.measured)
    trained = {p.name for p in (tmp_path / "work").rglob("*") if p.is_dir()}
    expected = {"align_s1", "captioner_rnn_s1", "captioner_rnn-attention_s1"}
    if mnist:
        expected.add("mnist_vit_s1")
    assert expected <= trained, trained
    assert any(n.endswith("_s1") and n.startswith("RNN") for n in trained), trained


def test_a_claim_whose_data_is_absent_is_skipped_not_run_on_a_substitute(tmp_path, monkeypatch):
    monkeypatch.setattr("attnlab.experiments.vision.mnist_vit", lambda ctx, seed=0: None)
    ctx = Context(out=tmp_path / "out", work=tmp_path / "work", size="tiny")
    r = run_claims(["vit-figures"], ctx, log=lambda m: None)["vit-figures"]
    assert r.status == "SKIPPED" and "MNIST" in r.measured and r.seconds < 5


def test_the_reorder_task_and_its_reference_alignment():
    import random

    from attnlab.data.parallel import reorder_alignment, synthetic_pair

    assert reorder_alignment("nab") == [1, 0, 2]  # adjective n + noun a swap; the lone noun b stays
    assert reorder_alignment("azqb") == [0, 2, 1, 3]
    rng = random.Random(0)
    for _ in range(200):
        src, tgt = synthetic_pair("reorder", rng, 5, 12)
        order = reorder_alignment(src)
        assert 5 <= len(src) <= 12 and sorted(order) == list(range(len(src)))
        assert tgt == "".join(src[j].upper() for j in order)


def test_the_a_a_control_is_the_claims_own_criterion_on_other_seeds():
    """A comparison's control runs the better side again with other seeds and hands the difference
    to the claim's own judging function: a consistent A/A difference clears it (the control can
    clear), noise around 0 does not."""
    from attnlab.experiments.stats import aa_control, aa_seeds, better_verdict

    # a draw of its own per claim: two claims comparing the same configuration never share one A/A run
    draws = {name: aa_seeds((0, 1, 2), name) for name in CLAIMS}
    assert len({d[0] for d in draws.values()}) == len(CLAIMS)
    assert all(d[1:] == (d[0] + 1, d[0] + 2) and d[0] >= 1000 for d in draws.values())
    noise = aa_control(better_verdict([0.01, -0.012, 0.004], "d"))
    assert not noise.cleared and noise.what.startswith("an A/A run") and "[-" in noise.measured
    assert aa_control(better_verdict([0.05, 0.06, 0.055], "d")).cleared


def test_an_a_a_run_shares_the_claims_batches_and_its_spread_floors_the_claims_interval(tmp_path):
    """Paired like the claim: the A/A GPT draws its initial weights from another seed and its batches
    from the claim's own (its run named by both); the A/A differences' spread widens an interval whose
    own seeds happen to agree closely, and leaves a wider one as it is."""
    from attnlab.experiments.stats import aa_spread, paired_interval

    ctx = Context(out=tmp_path / "out", work=tmp_path / "work", size="tiny")
    own, _ = runs.train_gpt(ctx, "rope", 2, context=64, seed=0)
    again, _ = runs.train_gpt(ctx, "rope", 2, context=64, seed=0, init_seed=1007)
    names = sorted(p.name for p in ctx.work.glob("gpt_*"))
    assert len(names) == 2 and any("init-1007" in n and n.endswith("_s0") for n in names), names
    assert not torch.equal(own.tok_emb.weight, again.tok_emb.weight)
    for name in names:  # (the batches: the claim's seed 0, 1337 + 0, for both)
        saved = json.loads((ctx.work / name / "last" / "trainer.json").read_text())
        assert saved["train_config"]["seed"] == 1337, name
    close = [0.051, 0.05, 0.049]
    aa = [0.03, -0.02, 0.0]
    assert aa_spread(aa) == pytest.approx(np.std(aa, ddof=1))
    _, low, _ = paired_interval(close)
    _, floored, _ = paired_interval(close, floor=aa_spread(aa))
    assert low > 0.04 and floored < 0.0
    wide = [0.2, -0.1, 0.05]
    assert paired_interval(wide, floor=aa_spread(aa)) == paired_interval(wide)


def design_table(**fields) -> dict:
    """A design table for a claim a test registers (every field of attnlab/experiments/design.toml)."""
    from attnlab.experiments.design import FIELDS

    blank = {k: [] if t is list else 0 if t is int else "a test" for k, t in FIELDS.items()}
    return {**blank, "source": "beyond the decks: a test", **fields}


def test_a_claim_that_reads_a_cached_run_reports_its_data_and_its_seconds_not_no_data(tmp_path, monkeypatch):
    """Context.cached trains once per report; the claim that trained it counts its seconds as its own,
    a later claim that reads it names the data the training read and the run's seconds ("cached run"),
    and both are marked sized (previews below the full size)."""
    import time

    from attnlab.experiments.design import designs
    from attnlab.experiments.registry import claim
    from attnlab.experiments.report import _seconds

    monkeypatch.setitem(designs(), "cached-a", design_table(title="A"))
    monkeypatch.setitem(designs(), "cached-b", design_table(title="B"))

    def train():
        ctx.cache["data_used"].append("the test corpus")
        time.sleep(0.6)
        return "model"

    @claim("cached-a")
    def first(ctx):
        assert ctx.cached("m", train) == "model"
        return Result("trained", True, "none")

    @claim("cached-b")
    def second(ctx):
        assert ctx.cached("m", train) == "model"
        return Result("read", True, "none")

    try:
        ctx = Context(out=tmp_path / "out", work=tmp_path / "work", size="quick")
        results = run_claims(["cached-a", "cached-b"], ctx, log=lambda m: None)
    finally:
        CLAIMS.pop("cached-a"), CLAIMS.pop("cached-b")
    a, b = results["cached-a"], results["cached-b"]
    assert a.data == b.data == "the test corpus" and not a.final and not b.final
    assert a.cached_seconds == 0 and a.seconds >= 0.6
    assert b.cached_seconds >= 0.6
    assert " + cached run " in _seconds(b) and "cached runs of earlier claims" in _seconds(b, long=True)
    assert " + cached run" not in _seconds(a)


def test_no_control_relabels_the_measured_run(tiny, tmp_path):
    """Every control is a run of its own (untrained models, the mechanism removed, an A/A run, a
    null layer), never the measured run with its labels swapped."""
    _, results = tiny
    computed = run_claims(COMPUTED, Context(out=tmp_path / "out", work=tmp_path / "work", size="tiny"), log=print)
    for name, r in {**results, **computed}.items():
        if r.control is not None:
            assert "swapped" not in r.control.what and "labels" not in r.control.what, (name, r.control.what)


COMPARISONS = ("three-projections", "scaling-convergence", "multi-head", "caption-bottleneck")


@pytest.mark.parametrize("name", COMPARISONS)
def test_every_comparison_is_controlled_by_an_a_a_run_not_by_relabelling_its_own(name, tiny):
    _, results = tiny
    control = results[name].control
    assert control.what.startswith("an A/A run: the same configuration on both sides"), control.what


def test_a_vacuous_criterion_clears_its_a_a_control_and_the_claim_is_inconclusive(tmp_path, monkeypatch):
    """multi-head judged by a criterion that passes whatever it is given: the A/A control, judged by
    the same function, clears it too, so the claim is INCONCLUSIVE, not PASS."""
    from attnlab.experiments import heads

    monkeypatch.setattr(heads, "better_verdict", lambda diffs, what, **_: (True, None, f"{what}: vacuous"))
    ctx = Context(out=tmp_path / "out", work=tmp_path / "work", size="tiny")
    result = run_claims(["multi-head"], ctx, log=lambda m: None)["multi-head"]
    assert result.passed and result.control.cleared and result.status == "INCONCLUSIVE"


def test_comparative_claims_decide_on_intervals_over_seeds():
    from attnlab.experiments.stats import better_verdict, paired_interval, parts_verdict, same_verdict

    mean, low, high = paired_interval([0.05, 0.07, 0.06])
    # by hand: mean 0.06, sd 0.01, t(2) = 4.303, half-width 4.303 * 0.01 / √3 = 0.02484
    assert mean == pytest.approx(0.06) and low == pytest.approx(0.06 - 0.02484, abs=1e-4) and high > 0
    assert better_verdict([0.05, 0.07, 0.06], "d")[:2] == (True, None)  # the interval lies above 0
    assert better_verdict([0.05, -0.04, 0.02], "d")[1] == "INCONCLUSIVE"  # seed noise as large as the gap
    assert better_verdict([-0.05, -0.07, -0.06], "d")[1] == "FAIL"
    assert better_verdict([0.3], "d")[1] == "INCONCLUSIVE"  # one seed decides nothing
    assert same_verdict([0.001, -0.002, 0.0], 0.03, "d", floor=0.0)[:2] == (True, None)
    assert same_verdict([0.2, 0.21, 0.19], 0.03, "d", floor=0.0)[1] == "FAIL"
    assert same_verdict([0.0, 0.05, -0.04], 0.03, "d", floor=0.0)[1] == "INCONCLUSIVE"
    # two seeds that both differ by 5 of 144 test texts: equal differences on a coarse scale are not zero noise
    _, low, high = paired_interval([5 / 144, 5 / 144], resolution=1 / 144)
    assert high - low == pytest.approx(2 * 12.706 * (1 / 144) / 2**0.5)
    assert better_verdict([5 / 144, 5 / 144], "d", resolution=1 / 144)[1] == "INCONCLUSIVE"
    # a statement of several parts: every part must pass; one failing part fails it
    passing, undecided, failing = (
        better_verdict([0.05, 0.07, 0.06], "d"),
        better_verdict([0.3], "d"),
        better_verdict([-0.05, -0.07, -0.06], "d"),
    )
    assert parts_verdict([passing, passing]) == (True, None)
    assert parts_verdict([passing, undecided]) == (False, "INCONCLUSIVE")
    assert parts_verdict([undecided, failing, passing]) == (False, "FAIL")


def test_the_docs_page_is_generated_from_the_claims(tmp_path):
    ctx = Context(out=tmp_path / "out", work=tmp_path / "work", size="tiny")
    results = run_claims(["worked-example", "permutation"], ctx, log=lambda m: None)
    (tmp_path / "reproduce" / "full").mkdir(parents=True)
    (tmp_path / "reproduce" / "full" / "report.md").write_text(
        "# attnlab reproduce\n\nSize `full`; 20 of 30 claims PASS, 10 FAIL; 3600 s in all. Each item: ...\n"
    )
    page = write_docs(results, ctx, tmp_path / "reproduce.md", "2 CPU cores (test)").read_text()
    assert "## Attention" in page and "## Positional encodings" in page and "## Vision" not in page
    assert "### `worked-example`: The worked example" in page and "> With q·k₁ = 102" in page
    assert "- **Deck**: COMP547, 000_bd2ef584872622f0.txt:388 (“Permutation equivariance”)" in page
    assert "- **Control**: the same attention with a causal mask, still without PE" in page
    assert "each run alone on 2 CPU cores (test)" in page and "its verdict at the tiny size" in page
    assert "[docs/reproduce/full/report.md](reproduce/full/report.md), 20 of 30 claims PASS, 10 FAIL; 3,600 s" in page
    assert "docs/reproduce/report.md" not in page  # no quick report there: not listed
    # one table of every bar and margin with its reason
    table = page[page.index("## Bars and margins") :]
    assert "| `worked-example` | scores within 0.05 of 58.9" in table and "Half the last digit the deck prints" in table
    assert table.count("\n| `") == 2


def test_the_spike_rate_counts_spikes_not_noise_or_progress():
    """spike_rate on synthetic curves: a smooth decaying loss with batch noise (σ 0.05, and a noisier
    σ 0.2) reads near 0; the same curve with jumps of +0.6 at 3 % of its steps reads about 0.03;
    a run that diverged at 60 % counts its missing steps as spikes. The old measure (the mean rise
    above the best so far) read the noise as instability."""
    from attnlab.experiments.heads import spike_rate

    rng = np.random.default_rng(0)
    steps = 2000
    t = np.arange(steps)
    smooth = 1.5 + 2.0 * np.exp(-t / 300)
    for sigma in (0.05, 0.2):
        assert spike_rate(smooth + rng.normal(0, sigma, steps), steps) < 0.003
    jumps = rng.random(steps) < 0.03
    spiky = smooth + rng.normal(0, 0.05, steps) + 0.6 * jumps
    counted = jumps[int(0.2 * steps) :].mean()
    assert spike_rate(spiky, steps) == pytest.approx(counted, abs=0.006)
    assert spike_rate(smooth[: int(0.6 * steps)], steps) == pytest.approx(0.4 / 0.8)  # (after the warm-up fifth)
    noisy = smooth + rng.normal(0, 0.2, steps)
    old = float((noisy - np.minimum.accumulate(noisy))[400:].mean())  # the withdrawn measure
    assert old > 0.2  # batch noise alone read as a large rise


def test_the_quick_report_says_it_is_a_preview_and_which_verdicts_are_final(tmp_path):
    computed, trained = Result("m", True, "c"), Result("m", True, "c", final=False)
    (tmp_path / "q").mkdir(), (tmp_path / "f").mkdir()
    results = {"worked-example": computed, "length": trained}
    quick = write_report(results, Context(out=tmp_path / "q", work=tmp_path / "w", size="quick")).read_text()
    full = write_report(results, Context(out=tmp_path / "f", work=tmp_path / "w", size="full")).read_text()
    assert "The quick size is a preview, not the judge" in quick and "preview" not in full
    rows = {line.split("](#")[1].split(")")[0]: line.split(" | ")[2] for line in quick.splitlines() if "](#" in line}
    assert rows == {"worked-example": "yes", "length": "no"}  # (the table's "final" column)
    assert (
        "- **Final at this size**: no: a preview" in quick and "- **Final at this size**: yes (the full size)" in full
    )


def test_a_claim_is_final_below_the_full_size_only_when_it_reads_nothing_sized(tmp_path):
    """`Result.final` comes from what the claim read: a computed claim is final at the tiny size; one
    that reads steps or seeds, or a model trained at this size, is not."""
    ctx = Context(out=tmp_path / "out", work=tmp_path / "work", size="tiny")
    results = run_claims(["worked-example", "sinusoidal", "graphs"], ctx, log=lambda m: None)
    assert {n: r.final for n, r in results.items()} == {"worked-example": True, "sinusoidal": True, "graphs": False}
    full = Context(out=tmp_path / "full", work=tmp_path / "work", size="full")
    assert run_claims(["worked-example"], full, log=lambda m: None)["worked-example"].final


def test_a_withdrawn_claim_runs_nothing_and_says_why(tiny):
    _, results = tiny
    r = results["stability"]
    assert r.status == "WITHDRAWN" and r.measured.startswith("withdrawn: ") and r.control is None
    assert "Liu et al." in r.measured and "stability_sweep.py" in r.note


def test_the_length_criterion_separates_the_encodings_it_names():
    """By hand: ALiBi and relative flat (within 0.1), learned rising 0.1 beyond both, all trained;
    models that learned nothing (flat at their untrained loss) fail it, as a learned model rising too
    little does; sinusoids are not part of it."""
    from attnlab.experiments.positions import length_criterion

    good, bad = ("alibi", "relative"), ("learned",)
    untrained = {"alibi": 4.2, "relative": 4.2, "learned": 4.2, "sinusoidal": 4.2}
    losses = {"alibi": [2.0, 1.99], "relative": [2.0, 2.05], "learned": [2.0, 2.3], "sinusoidal": [2.0, 3.5]}
    assert length_criterion(losses, untrained, good, bad)
    assert not length_criterion({**losses, "learned": [2.0, 2.14]}, untrained, good, bad)  # 0.14 < 0.05 + 0.1
    flat = {p: [4.2, 4.2] for p in losses}  # learned nothing: flat everywhere, the "good" part met
    assert not length_criterion(flat, untrained, good, bad)
    assert not length_criterion(flat, untrained, ("sinusoidal",), ())
    assert not length_criterion(losses, untrained, ("sinusoidal",), ())  # sinusoids rise 1.5


def test_the_length_claims_null_clears_when_learned_positions_extrapolate_and_not_when_they_rise():
    """The length and sinusoid-length nulls are the same criterion with learned positions in the
    extrapolating arm's place, on the same trained models: constructed losses where learned stays flat
    clear it (the claim is then INCONCLUSIVE), the usual case where it rises does not."""
    from attnlab.experiments.positions import length_verdicts

    null = {p: [4.2, 4.2] for p in ("alibi", "relative", "learned", "sinusoidal")}
    rises = {"alibi": [2.0, 1.99], "relative": [2.0, 2.05], "learned": [2.0, 2.3], "sinusoidal": [2.0, 2.02]}
    flat = {**rises, "learned": [2.0, 2.02]}
    assert length_verdicts([rises, rises], [null, null], ("alibi", "relative"), ("learned",)) == (True, None, False)
    assert length_verdicts([rises], [null], ("sinusoidal",), ())[2] is False
    assert length_verdicts([flat], [null], ("sinusoidal",), ()) == (True, None, True)
    passed, verdict, cleared = length_verdicts([flat], [null], ("alibi", "relative"), ("learned",))
    assert (passed, cleared) == (False, True)  # (the claim fails there: learned does not rise)


def test_the_alignment_nulls_clear_when_the_attention_ignores_the_input_and_not_when_it_reads_it():
    """Shuffled across sentences (translation) or words (captioning), a map that points at the same
    place whatever the input hits as often as before, so the null clears; maps that follow each
    input's own layout no longer hit."""
    from attnlab.experiments.recurrence import alignment_hits
    from attnlab.inspect.analysis import pointing_hit, shuffled_pointing_hits

    g = torch.Generator().manual_seed(0)
    reference = torch.stack([torch.randperm(12, generator=g) for _ in range(64)])  # each sentence its own order
    reads = F.one_hot(reference, 12).float()  # attention on the translated symbol
    assert alignment_hits(reads, reference).all()
    assert alignment_hits(reads, reference, shuffled=True).float().mean() < 0.3
    same = reference[:1].expand(64, 12)  # one alignment for every sentence: a pointer that ignores the input
    assert alignment_hits(F.one_hot(same, 12).float(), same, shuffled=True).all()

    def peak(row: int, col: int) -> torch.Tensor:
        grid = torch.zeros(8, 8)
        grid[row, col] = 1.0
        return grid

    cells = torch.randint(0, 8, (200, 2), generator=g).tolist()
    boxes = [(c * 4, r * 4, c * 4 + 4, r * 4 + 4) for r, c in cells]  # (one cell of a 32-pixel image each)
    looking = [peak(r, c) for r, c in cells]  # the map on each word's own object
    assert all(pointing_hit(m, b, 32) for m, b in zip(looking, boxes))
    assert np.mean(shuffled_pointing_hits(looking, boxes, 32)) < 0.1  # (chance: 1/64 of the cells)
    fixed = [(12, 12, 16, 16)] * 200  # every object in the same place, the map always there
    assert all(shuffled_pointing_hits([peak(3, 3)] * 200, fixed, 32))


def test_the_caption_falls_are_paired_image_by_image_and_their_items_average_to_the_difference():
    """caption-bottleneck's items: one value per test scene of the fewest and the most objects whose
    mean is (the fall without attention − the fall with it) in the share of objects named, by hand."""
    from attnlab.experiments.recurrence import NAMED, _falls, fall_items

    rnn = {1: {NAMED: [0.8, 0.6]}, 2: {NAMED: [0.5]}, 3: {NAMED: [0.2, 0.1, 0.0]}}
    att = {1: {NAMED: [0.7, 0.7]}, 2: {NAMED: [0.6]}, 3: {NAMED: [0.6, 0.5, 0.4]}}
    fall_rnn, fall_att, higher = _falls({"rnn": rnn, "att": att}, "rnn", "att")
    assert (fall_rnn, fall_att, higher) == (pytest.approx(0.6), pytest.approx(0.2), True)  # 0.7 − 0.1, 0.7 − 0.5
    values = fall_items(rnn, att)
    assert len(values) == 5 and values.mean() == pytest.approx(fall_rnn - fall_att)
    # (each scene's difference, weighted: 5/2 on the 1-object scenes, −5/3 on the 3-object ones)
    np.testing.assert_allclose(values, [0.25, -0.25, 2 / 3, 2 / 3, 2 / 3])


def test_a_caption_names_an_object_only_with_its_size_colour_and_shape_together():
    from attnlab.data.captions import SceneObject
    from attnlab.recipes.caption import objects_named

    red, blue = (
        SceneObject("circle", "red", "small", (0, 0, 4, 4)),
        SceneObject("square", "blue", "large", (8, 0, 12, 4)),
    )
    assert objects_named("a small red circle and a large blue square", [red, blue]) == 1.0
    assert objects_named("a large blue square to the left of a small red circle", [red, blue]) == 1.0  # any order
    assert objects_named("a small blue circle and a large red square", [red, blue]) == 0.0  # every word, bound wrong
    assert objects_named("a small red circles", [red]) == 0.0  # whole words only


@pytest.mark.parametrize("without_attention, verdict", [(0.9, "PASS"), (0.3, "INCONCLUSIVE")])
def test_caption_bottleneck_needs_the_captioner_without_attention_to_learn_the_short_scenes(
    tmp_path, monkeypatch, without_attention, verdict
):
    """The same falls (without attention 0.6 of the objects lost from 2 to 6 objects, with it none) pass
    when the captioner without attention names most objects of the short scenes, and are INCONCLUSIVE
    when it names few: a captioner that never learned the scenes has no fall to measure."""
    from attnlab.experiments import recurrence

    rng = np.random.default_rng(0)

    def evaluation(start: float, fall: float) -> dict:
        return {"by_objects": {
            str(k): {NAMED: list(np.clip(start - fall * (k - 2) / 4 + rng.normal(0, 0.05, 40), 0, 1)), "bleu4": 50.0}
            for k in (2, 4, 6)
        }}  # fmt: skip

    NAMED = recurrence.NAMED

    def captioner(ctx, arch="rnn-attention", seed=0):
        # (the A/A run's seeds draw the captioner without attention again: the same falls, other noise)
        start, fall = (0.95, 0.0) if arch == "rnn-attention" else (without_attention, min(0.6, without_attention))
        return {"steps": 1, "scenes": 1, "eval": evaluation(start, fall)}

    monkeypatch.setattr(recurrence, "_captioner", captioner)
    monkeypatch.setattr(recurrence, "seeds_for", lambda ctx, full=3: (0, 1, 2, 3, 4))
    ctx = Context(out=tmp_path / "out", work=tmp_path / "work", size="full")
    r = run_claims(["caption-bottleneck"], ctx, log=lambda m: None)["caption-bottleneck"]
    assert r.status == verdict, r.measured
    assert ("did not learn the short scenes" in r.measured) == (verdict == "INCONCLUSIVE")
    assert "from 2 to 6 objects" in r.criterion and not r.control.cleared


def test_the_heads_null_clears_when_tied_heads_still_differ_and_not_when_they_act_as_one():
    """The heads criterion against the untrained model's bars: tied heads that act as one (their maps
    as alike as the untrained model's, every ablation costing the same) fail it; a constructed tied
    model whose heads still differ (ALiBi's slopes, W_O) clears it, which would make the claim
    INCONCLUSIVE."""
    from attnlab.experiments.heads import heads_criterion

    def js(mean: float) -> np.ndarray:
        return np.full((4, 4), mean) - np.eye(4) * mean

    untrained = (js(0.10), [(f"L0H{h}", 0.001 * h) for h in range(4)])
    as_one = (js(0.10), [(f"L0H{h}", 0.08) for h in range(4)])
    differing = (js(0.20), [("L0H0", 0.0), ("L0H1", 0.02), ("L0H2", 0.09), ("L0H3", 0.3)])
    assert not heads_criterion(*as_one, *untrained)[0]
    assert heads_criterion(*differing, *untrained)[0]


def test_the_data_hunger_null_clears_when_the_resnet_again_trails_and_not_when_it_matches():
    """data-hunger's A/A null: the ResNet trained again in the ViT's place, by the same parts. A
    second ResNet that matches the first (the real case: nothing differs but the initial weights)
    fails the lead; a constructed one that trails it with little data and catches up with more
    clears both parts (the criterion would then read seed noise)."""
    from attnlab.experiments.vision import _data_hunger_parts
    from attnlab.experiments.stats import parts_verdict

    def at(again_small: list, again_large: list) -> dict:
        return {
            ("resnet", 0.1): np.array([0.90, 0.91, 0.92]), ("resnet", 1.0): np.array([0.99, 0.99, 0.98]),
            ("vit", 0.1): np.array(again_small), ("vit", 1.0): np.array(again_large),
        }  # fmt: skip

    judged = dict(sizes=[126, 1259], small=0.1, large=1.0, step=1 / 359)
    matches = at([0.905, 0.90, 0.925], [0.985, 0.99, 0.985])
    assert parts_verdict(_data_hunger_parts(matches, **judged))[0] is False
    trails = at([0.80, 0.82, 0.81], [0.99, 0.985, 0.98])
    assert parts_verdict(_data_hunger_parts(trails, **judged))[0] is True


def test_tied_heads_stay_one_head_through_training_and_the_heads_null_trains_them(tiny):
    """The heads claim's null: every layer's W_Q, W_K, W_V rows head by head equal after AdamW steps
    (the gradient hook), W_O free; the claim reports the tied model's numbers beside its own."""
    from attnlab.experiments.runs import tie_heads
    from attnlab.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, context=32, heads=4, layers=2, dim=32, pos="alibi", dropout=0.0))
    tie_heads(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        x = torch.randint(40, (4, 16), generator=torch.Generator().manual_seed(_))
        loss = F.cross_entropy(model(x).flatten(0, 1), x.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    for block in model.blocks:
        w = block.attn.head_weights()
        for name in ("W_Q", "W_K", "W_V"):
            assert torch.equal(w[name], w[name][:1].expand_as(w[name])), name
        assert not torch.equal(w["W_O"], w["W_O"][:1].expand_as(w["W_O"]))
    _, results = tiny
    r = results["heads"]
    assert "heads tied" in r.control.what and "tied heads" in r.table


def test_tied_projections_are_parameter_matched_by_a_wider_mlp(tmp_path, tiny):
    """three-projections' ties give their saved projection back to the MLP. By hand: a 64×64
    projection with its bias per layer in 2 layers is 8,320 weights; a hidden unit is 64 weights in,
    64 out and a bias in each layer, 258; the nearest is 32 units (8,256, 64 short, under half a
    unit). The claim's table shows the counts that close."""
    from attnlab.experiments.runs import gpt_config, parameter_matched
    from attnlab.models import GPT

    ctx = Context(out=tmp_path, work=tmp_path / "w", size="tiny")
    count = lambda opts: sum(p.numel() for p in GPT(gpt_config(ctx, "rope", 64, **opts)).parameters())  # noqa: E731
    for tie in ("qk", "kv"):
        matched = parameter_matched(ctx, {"attn_tie": tie}, {})
        assert matched == {"attn_tie": tie, "mlp_hidden": 288}
        assert count({"attn_tie": tie}) == count({}) - 2 * (64 * 64 + 64)
        assert count(matched) == count({}) - 64
    assert parameter_matched(ctx, {"dim": 32}, {"dim": 32}) == {"dim": 32, "mlp_hidden": 128}  # nothing missing
    _, results = tiny
    r = results["three-projections"]
    counts = [int(line.split("|")[2]) for line in r.table.splitlines() if "W_" in line]
    assert len(counts) == 3 and max(counts) - min(counts) <= 258 // 2, r.table
    assert "parameter-matched" in r.note and "288" in r.note


@pytest.mark.slow
def test_every_claims_training_is_pinned_to_fp32_and_a_fixed_thread_count(tiny):
    """--dtype auto would pick bf16 on some CPUs only, and --threads auto changes the count (and so
    the order of float sums) with the machine's load: a claim's numbers would depend on both. Every
    Trainer the claims started (recorded while the tiny fixture ran them all) ran fp32 on the CPU with
    this process's cores."""
    from attnlab.training.threads import our_cores

    ctx, _ = tiny
    seen = ctx.cache["trainer settings"]
    assert len(seen) >= 30 and set(seen) == {("cpu", "fp32", len(our_cores()))}, set(seen)


def test_the_two_dots_task_and_the_shallow_cnns_blindness_to_far_pairs():
    """Far pairs lie beyond the shallow CNN's 5×5 receptive field and 4 px from the border, so its
    pooled features are the sum of each dot's alone: the image and its mirror (columns swapped,
    label flipped) give it the same output, whatever its weights. Near pairs it can tell apart."""
    import torch

    from attnlab.data.images import two_dots
    from attnlab.experiments.vision import locality_model

    far, near = two_dots(counts=(64, 8, 256)), two_dots(near=True, counts=(64, 8, 256))
    for splits, close in ((far, False), (near, True)):
        x, y = splits.test
        assert x.shape == (256, 2, 24, 24) and set(x.sum((2, 3)).flatten().tolist()) == {1.0}
        red, green = (x[:, c].flatten(1).argmax(1) for c in (0, 1))
        (r1, c1), (r2, c2) = (red // 24, red % 24), (green // 24, green % 24)
        assert torch.equal(y, (c1 < c2).long()) and 0.3 < y.float().mean() < 0.7  # the label, by hand; balanced
        assert min(r1.min(), c1.min(), r2.min(), c2.min()) >= 4 and max(r1.max(), c1.max(), r2.max(), c2.max()) <= 19
        gap = torch.maximum((r1 - r2).abs(), (c1 - c2).abs())
        assert bool((gap <= 2).all()) if close else bool(((c1 - c2).abs() >= 5).all())
    torch.manual_seed(0)
    cnn = locality_model("shallow CNN", 24).eval()
    for splits, blind in ((far, True), (near, False)):
        x = splits.test[0][:32]
        mirrored = torch.zeros_like(x)  # each dot moved to the other's column, its own row: the label flips
        for i in range(len(x)):
            (a, b), (c, d) = ((x[i, ch] == 1).nonzero()[0].tolist() for ch in (0, 1))
            mirrored[i, 0, a, d] = mirrored[i, 1, c, b] = 1.0
        with torch.no_grad():
            same = torch.allclose(cnn(x), cnn(mirrored), atol=1e-5)
        assert same == blind
    with pytest.raises(ValueError, match="no room"):
        two_dots(size=12)


def test_a_measurement_along_the_run_leaves_the_run_unchanged(tmp_path):
    """The learning curves of the budget-sensitive claims are measured inside their runs: the
    measurement must not change what the run trains (no random numbers drawn, train mode back)."""
    import torch

    from attnlab.data.images import two_dots
    from attnlab.experiments.vision import locality_model
    from attnlab.training.callbacks import MeasureAtSteps, quarter_steps
    from attnlab.training.tasks import ImageClassificationTask

    assert quarter_steps(1000) == [250, 500, 750, 1000] and quarter_steps(600) == [150, 300, 450, 600]
    assert quarter_steps(10) == [10]
    splits = two_dots(counts=(256, 32, 64))
    ctx = Context(out=tmp_path / "out", work=tmp_path / "work", size="tiny")
    weights = []
    for kind in ("steps", "test accuracy", None):  # the two learning-curve callbacks, and none
        torch.manual_seed(0)
        model = locality_model("ViT", 24)
        task = ImageClassificationTask(splits, 16, pad=1)  # random shifts: a drawn number would show
        if kind == "steps":
            along = MeasureAtSteps(model, lambda: (task.predict(model, "test")[0] == 1).float().mean().item(), [10, 30])  # noqa: B023
        else:
            along = runs.TestAccuracyCurve([10, 30])
        runs.fit(ctx, model, task, f"run{kind}", 40, callbacks=[along] if kind else (), batch_size=16)
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        assert sorted(along.curve) == ([10, 30] if kind else [])
    assert torch.equal(weights[0], weights[1]) and torch.equal(weights[0], weights[2])


def test_a_budget_claims_verdict_along_its_runs():
    from attnlab.experiments.stats import along_the_run, better_verdict

    # two seeds of A and B, measured at a quarter, half, three quarters and all of 400 steps
    a = [{100: 0.5, 200: 0.6, 300: 0.8, 400: 0.9}, {100: 0.5, 200: 0.7, 300: 0.8, 400: 0.92}]
    b = [{100: 0.6, 200: 0.6, 300: 0.6, 400: 0.6}, {100: 0.6, 200: 0.6, 300: 0.6, 400: 0.6}]
    judge = lambda at: better_verdict(at["A"] - at["B"], "A − B")[:2]  # noqa: E731
    # by hand: A − B = (−0.1, −0.1) FAIL, (0, 0.1) INCONCLUSIVE, (0.2, 0.2) PASS (no spread), (0.3, 0.32) PASS
    assert along_the_run({"A": a, "B": b}, judge) == (
        "¼ (100 steps): FAIL, ½ (200 steps): INCONCLUSIVE, ¾ (300 steps): PASS, all (400 steps): PASS"
    )
    b_short = [{25: 0.6, 50: 0.6, 75: 0.6, 100: 0.6}] * 2  # runs of other lengths: fractions only
    assert along_the_run({"A": a, "B": b_short}, judge).startswith("¼: FAIL, ½: INCONCLUSIVE")


def test_every_claim_cites_the_deck_lines_it_checks_or_says_it_is_from_outside_them(monkeypatch):
    """Each claim carries FILE:LINE references into the lecture decks (../shared/lectures) with the
    words found on that line, checked here against the decks themselves; a claim from outside the
    decks says so and where it comes from; a claim with neither is refused at registration."""
    import os
    from pathlib import Path

    from attnlab.experiments.design import designs
    from attnlab.experiments.registry import DECKS, claim

    outside = [n for n, c in CLAIMS.items() if isinstance(c.source, str)]
    assert outside == ["add-concat", "rollout", "cls-gap", "image-positions", "cka", "induction"], outside
    for name, paper in (("add-concat", "Vaswani"), ("rollout", "Abnar"), ("cls-gap", "Dosovitskiy"),
                        ("image-positions", "Dosovitskiy"), ("cka", "Raghu"), ("induction", "Olsson")):  # fmt: skip
        assert CLAIMS[name].deck_line.startswith(f"beyond the decks: {paper}"), CLAIMS[name].deck_line
    assert all(CLAIMS[n].source for n in CLAIMS)
    monkeypatch.setitem(designs(), "x", design_table(source=[]))
    with pytest.raises(ValueError, match="give its deck lines"):
        claim("x")
    monkeypatch.setitem(designs(), "x", design_table(margin_reason=""))
    with pytest.raises(ValueError, match="say why its bars"):
        claim("x")
    assert all(c.why for c in CLAIMS.values())  # every claim says why its bars are what they are
    data = Path(os.environ.get("ATTNLAB_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    lectures = data.parent / "lectures"
    if not (lectures / DECKS["001"]).is_file():
        pytest.skip("the lecture decks are not beside ATTNLAB_DATA (../shared/lectures)")
    text = {k: (lectures / f).read_text(encoding="utf-8").splitlines() for k, f in DECKS.items()}
    for name, c in CLAIMS.items():
        for ref in () if isinstance(c.source, str) else c.source:
            assert 1 <= ref.line <= len(text[ref.deck]), (name, str(ref))
            assert ref.words.lower() in text[ref.deck][ref.line - 1].lower(), (name, str(ref))


def test_attention_entropy_measures_the_premise_of_scaling_convergence():
    """The premise check of scaling-convergence: uniform attention (zero query/key projections) gives
    the hand-computed mean of log(i + 1) / log T; W_Q, W_K ~ N(0, 1/d) with unscaled scores
    (d_k = 256) leaves the premise's < 0.10 of it, the scaled ones far more."""
    import math

    from attnlab.experiments.runs import attention_entropy
    from attnlab.models import GPT, GPTConfig

    windows = torch.randint(50, (4, 64), generator=torch.Generator().manual_seed(0))

    def entropy(std: float, scale: float | None) -> float:
        torch.manual_seed(0)
        gpt = GPT(GPTConfig(vocab_size=50, context=64, heads=1, dim=256, layers=2, pos="rope", attn_scale=scale))
        with torch.no_grad():
            for block in gpt.blocks:
                a = block.attn
                a.qkv.weight[: (a.n_heads + a.n_kv_heads) * a.d_k].normal_(0.0, std)
        return attention_entropy(gpt, windows)

    uniform = sum(math.log(i + 1) for i in range(1, 64)) / 63 / math.log(64)
    assert entropy(0.0, 1.0) == pytest.approx(uniform, abs=1e-6)  # (float32 weights)
    assert entropy(256**-0.5, 1.0) < 0.10 < 0.5 < entropy(256**-0.5, None)


def test_reproduce_list_and_help_say_what_each_claim_checks_and_where_the_course_says_it(capsys):
    from attnlab.cli import main

    assert main(["reproduce", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(CLAIMS) and all(line.split()[0] in CLAIMS for line in lines)
    worked = next(line for line in lines if line.startswith("worked-example"))
    assert "The worked example" in worked and "[CS-433 001:251, 292, 294, 306]" in worked
    assert main(["reproduce", "--help"]) == 0
    helptext = " ".join(capsys.readouterr().out.split())  # (the help wraps at the terminal's width)
    assert all(" ".join(f"{name:<20} {c.title}".split()) in helptext for name, c in CLAIMS.items())
    assert str(CLAIMS["worked-example"].source[0]).startswith("CS-433, 001_1521457a98367c77.txt:251")


@pytest.mark.slow
def test_every_claim_figure_is_clean_and_carries_its_claim_and_verdict(tiny):
    """Every claim figure of the tiny run is clean for a slide (tests/test_figure_text.py's rules) and
    carries its claim's title and verdict. (Here, beside the other tests of the tiny run: a file's
    tests share one pytest-xdist worker, so the claims are trained once.)"""
    from figure_checks import JUDGED, TITLES

    from attnlab.experiments import CLAIMS

    ctx, results = tiny
    pngs = sorted(ctx.out.glob("*.png"))
    assert len(pngs) >= 20  # (every claim with a figure: at least one each)
    named = {r.figure for r in results.values() if r.figure}
    assert named <= {p.name for p in pngs}
    problems = {p.name: JUDGED[p.name] for p in pngs}  # (judged as each was saved: tests/figure_checks.py)
    bad = {k: v for k, v in problems.items() if v}
    assert bad == {}, "\n".join(f"{k}: {v}" for k, v in bad.items())
    for png in named:  # (a figure two claims share carries the verdict of the claim that drew it)
        banner = " ".join(TITLES[png].split())
        owners = [(CLAIMS[n].title, r) for n, r in results.items() if r.figure == png]
        assert any(" ".join(title.split()) in banner and r.status in banner for title, r in owners), (png, banner)
        assert all(r.final or "a preview at the tiny size" in banner for _, r in owners), (png, banner)
