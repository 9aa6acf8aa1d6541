"""The claims' design, fixed before they run, and the one verdict rule that decides every claim
(issue 79): constructed cases of the rule, the design file against the registered claims, the hash
and machine a result records, and a design changed after a result was seen."""

import json

import numpy as np
import pytest

from attnlab.cli import main
from attnlab.experiments import CLAIMS, Context, Control, Result, run_claims, write_report
from attnlab.experiments import design as design_module
from attnlab.experiments.design import FIELDS, design_hash, designs
from attnlab.experiments.registry import decide
from attnlab.experiments.stats import SEEDS, aa_control, better_verdict, same_verdict


def test_a_control_that_reaches_the_fail_turns_it_inconclusive():
    """PASS or FAIL stands only where the control, through the same measurement, does not reach it."""
    fails = Result("m", False, "c", control=Control("an A/A run", "below 0 too", False, "FAIL", "A/A"))
    assert fails.own == "FAIL" and fails.status == "INCONCLUSIVE"
    assert "reaches the same FAIL" in fails.reason and "seed noise alone" in fails.reason
    # the A/A control undecided (its interval straddles 0): the claim's FAIL stands
    stands = Result("m", False, "c", control=Control("an A/A run", "straddles 0", False, "INCONCLUSIVE", "A/A"))
    assert stands.status == "FAIL" and "INCONCLUSIVE, not FAIL" in stands.reason
    # an A/A run that reaches the PASS takes it too
    assert Result("m", True, "c", control=Control("an A/A run", "above 0", True, None, "A/A")).status == "INCONCLUSIVE"
    # a must-fail control that clears the criterion takes the PASS; one that fails it leaves it
    assert Result("m", True, "c", control=Control("untrained", "as good", True)).status == "INCONCLUSIVE"
    assert Result("m", True, "c", control=Control("untrained", "worse", False)).status == "PASS"
    # a must-fail control failing, as it must, says nothing against the claim's FAIL
    must_fail = Result("m", False, "c", control=Control("untrained", "worse", False))
    assert must_fail.status == "FAIL" and "as it must" in must_fail.reason
    with pytest.raises(ValueError, match="kind"):
        Control("x", "y", False, kind="positive")
    # an undecided claim, or one that did not run, is what it is whatever the control says
    for own in ("INCONCLUSIVE", "SKIPPED", "ERROR", "WITHDRAWN"):
        assert decide(own, Control("x", "y", True))[0] == own
    assert decide("FAIL", None) == ("FAIL", "no control run")


def test_the_a_a_control_of_a_fail_by_noise_makes_it_inconclusive():
    """cka's case: seed noise alone gives intervals below 0; the A/A run reaches the FAIL too."""
    claim = better_verdict([-0.10, -0.06, -0.08], "d")
    noise = better_verdict([-0.09, -0.05, -0.07], "d")
    assert claim[1] == noise[1] == "FAIL" and aa_control(noise).kind == "A/A"
    r = Result("m", claim[0], "c", verdict=claim[1], control=aa_control(noise))
    assert r.status == "INCONCLUSIVE"
    quiet = better_verdict([0.02, -0.03, 0.01], "d")  # an A/A run as it should be: no difference
    assert Result("m", claim[0], "c", verdict=claim[1], control=aa_control(quiet)).status == "FAIL"


def test_an_equivalence_inside_the_margin_but_within_the_a_a_floor_is_not_pass():
    """Three seeds that happen to agree within ±0.002 lie inside a ±0.03 margin; the A/A run shows one
    configuration against itself spreading by 0.04, so the interval is widened to that and the
    equivalence is not shown."""
    agreeing = [0.001, -0.002, 0.0]
    assert same_verdict(agreeing, 0.03, "d", floor=0.0)[:2] == (True, None)
    passed, verdict, words = same_verdict(agreeing, 0.03, "d", floor=0.04)
    assert not passed and verdict == "INCONCLUSIVE" and "margin ±0.03" in words
    with pytest.raises(TypeError):  # the floor is never left out
        same_verdict(agreeing, 0.03, "d")  # type: ignore[call-arg]


def test_every_claim_has_one_design_with_every_field_and_the_same_seeds():
    """The file holds one table per registered claim, in the report's order, each with every field;
    every trained claim runs the same fixed number of seeds; every margin has a reason."""
    tables = designs()
    assert list(tables) == list(CLAIMS)
    for name, table in tables.items():
        assert set(table) == set(FIELDS), name
        assert all(table[k] for k in ("title", "statement", "measured", "criterion", "margin_reason")), name
        c = CLAIMS[name]
        assert (c.title, c.statement, c.why) == (table["title"], table["statement"], table["margin_reason"])
        if table["steps"]:  # trained
            assert table["seeds"] == SEEDS == 5, name
        else:
            assert table["seeds"] == 0, name
    # the claims the review named: their margins no longer rest on the noise
    for name in ("add-concat", "cls-gap", "image-positions", "length", "locality", "data-hunger"):
        reason = tables[name]["margin_reason"]
        assert "sampling error" not in reason and "seed to seed" not in reason, name


def test_a_bad_design_table_is_refused_with_its_name(tmp_path, monkeypatch):
    bad = tmp_path / "design.toml"
    bad.write_text('["x"]\ntitle = "t"\nseeds = "five"\n', encoding="utf-8")
    monkeypatch.setattr(design_module, "DESIGN_FILE", bad)
    design_module.designs.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"\[x\] has no statement.*the wrong type for seeds"):
            designs()
    finally:
        design_module.designs.cache_clear()


def test_a_full_size_the_design_does_not_name_is_refused():
    ctx = Context(out=None, work=None, size="full", claim="three-projections")  # type: ignore[arg-type]
    assert ctx.steps(20, 120, 1500) == 1500
    with pytest.raises(ValueError, match="runs 3000 steps at full size, which its design does not name"):
        ctx.steps(20, 120, 3000)
    assert Context(out=None, work=None, size="tiny").steps(20, 120, 3000) == 20  # type: ignore[arg-type]


def test_the_design_command_prints_each_table_and_its_hash(capsys):
    assert main(["reproduce", "--design", "cls-gap", "length"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('["cls-gap"]') and '\n["length"]' in out
    assert f"# design hash: {design_hash('cls-gap')}" in out and "seeds = 5" in out
    assert main(["reproduce", "--design"]) == 0
    assert capsys.readouterr().out.count("# design hash: ") == len(CLAIMS)
    assert main(["reproduce", "--design", "nonsense"]) == 2
    assert "unknown claim 'nonsense'" in capsys.readouterr().err


def test_a_result_records_its_design_and_a_changed_design_shows_the_earlier_result(tmp_path, monkeypatch):
    """Each saved result carries its design's hash; a run after the claim's design changed names the
    earlier result in the report, and --resume does not keep a result of another design."""
    out = tmp_path / "rep"
    ctx = Context(out=out, work=tmp_path / "w", size="tiny")
    first = run_claims(["worked-example"], ctx, log=lambda m: None)["worked-example"]
    saved = json.loads((out / "results.json").read_text())["claims"]["worked-example"]
    assert saved["design"] == first.design == design_hash("worked-example") and not first.earlier
    assert saved["machine"] == first.machine and "CPU cores" in first.machine and "torch" in first.machine
    assert run_claims(["worked-example"], ctx, log=lambda m: None)["worked-example"].earlier == ""

    changed = {**designs()["worked-example"], "criterion": "a changed criterion"}
    monkeypatch.setitem(designs(), "worked-example", changed)
    second = run_claims(["worked-example"], ctx, log=lambda m: None)["worked-example"]
    assert second.design != first.design
    assert second.earlier.startswith(f"PASS under design {first.design}: scaled scores 58.89")
    report = write_report({"worked-example": second}, ctx).read_text()
    assert "**Design changed after a result was seen**: the earlier result was PASS under design" in report
    assert f"**Design**: {second.design}" in report and f"**Machine**: {second.machine}" in report

    from attnlab.experiments.report import load_results

    assert "worked-example" in load_results(out, "tiny")  # (the design it ran is the current one)
    monkeypatch.setitem(designs(), "worked-example", {**changed, "criterion": "changed again"})
    assert load_results(out, "tiny") == {}  # another design: it runs again


def test_the_seeds_of_a_trained_claim_come_from_its_design():
    from attnlab.experiments.stats import seeds_for

    assert seeds_for(Context(out=None, work=None, size="full", claim="cls-gap")) == tuple(range(5))  # type: ignore[arg-type]
    assert seeds_for(Context(out=None, work=None, size="quick", claim="cls-gap")) == (0, 1)  # type: ignore[arg-type]
    assert np.array_equal(seeds_for(Context(out=None, work=None, size="tiny")), (0,))  # type: ignore[arg-type]
