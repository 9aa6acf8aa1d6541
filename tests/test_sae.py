"""Sparse autoencoders: SAELens's loss terms and training on the same weights and batches
(tests/fixtures/sae_lens_reference.py made the reference), and the evaluation's splicing
against hand-built SAEs."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import attnlab
from attnlab.cli import main
from attnlab.inspect.sae import SAEConfig, SAETraining, SparseAutoencoder, evaluate, fit, resample
from helpers import PINNED_TRAINING

REF = load_file(Path(__file__).parent / "fixtures" / "sae_lens_reference.safetensors")
D_IN, D_SAE, K, L1, LR, STEPS, BATCH = 16, 64, 6, 0.3, 3e-3, 150, 64  # as the reference script


def sae_with(prefix: str, **config) -> SparseAutoencoder:
    sae = SparseAutoencoder(SAEConfig(d_in=D_IN, d_sae=D_SAE, unit_norm_decoder=False, **config))
    with torch.no_grad():
        for name in ("W_enc", "W_dec", "b_enc", "b_dec"):
            getattr(sae, name).copy_(REF[f"{prefix}{name}"])
    return sae


@pytest.mark.parametrize("kind", ["relu", "topk"])
def test_loss_terms_are_sae_lens_s(kind):
    x = REF["activations"][:256]
    if kind == "relu":
        sae = sae_with("weights.", kind="relu", l1_coefficient=L1)
        terms = sae.losses(x)
        pairs = {"mse_loss": "standard.mse_loss", "l1_loss": "standard.l1_loss"}
    else:
        sae = sae_with("weights.", kind="topk", k=K)
        terms = sae.losses(x, REF["dead"])
        pairs = {"mse_loss": "topk.mse_loss", "auxiliary_reconstruction_loss": "topk.auxiliary_reconstruction_loss"}
        assert int((terms["latents"] > 0).sum(-1).max()) <= K
    for ours, theirs in pairs.items():
        torch.testing.assert_close(terms[ours], REF[theirs], rtol=1e-5, atol=1e-6)
    assert float(terms["loss"].detach()) == pytest.approx(sum(float(REF[t]) for t in pairs.values()), rel=1e-5)


@pytest.mark.parametrize("kind", ["relu", "topk"])
def test_training_from_sae_lens_s_initialisation_matches_its_metrics(kind):
    prefix = "standard" if kind == "relu" else "topk"
    sae = sae_with(f"{prefix}.init.", kind=kind, k=K, l1_coefficient=L1)
    x = REF["activations"]
    batches = (x[(s * BATCH) % 1024 : (s * BATCH) % 1024 + BATCH] for s in range(STEPS))
    fit(sae, batches, SAETraining(steps=STEPS, lr=LR, warmup=0, decay=0, resamples=0, dead_after=10**9))
    with torch.no_grad():
        latents = sae.encode(x)
        out = sae.decode(latents)
    mse = (out - x).pow(2).sum(-1).mean()
    ev = 1 - (out - x).pow(2).sum() / (x - x.mean(0)).pow(2).sum()
    l0 = (latents > 0).sum(-1).float().mean()
    assert float(mse) == pytest.approx(float(REF[f"{prefix}.trained_mse"]), rel=1e-3)
    assert float(ev) == pytest.approx(float(REF[f"{prefix}.trained_explained_variance"]), abs=1e-3)
    assert float(l0) == pytest.approx(float(REF[f"{prefix}.trained_l0"]), abs=0.05)
    # and training did something: the reconstruction beats the mean
    assert float(ev) > 0.5


def test_unit_norm_decoder_and_resampling():
    torch.manual_seed(0)
    x = REF["activations"]
    sae = SparseAutoencoder(SAEConfig(d_in=D_IN, d_sae=D_SAE, kind="relu", l1_coefficient=L1))
    with torch.no_grad():
        sae.b_enc[:8] = -100.0  # eight latents that can never fire
    batches = (x[(s * BATCH) % 1024 : (s * BATCH) % 1024 + BATCH] for s in range(10**6))
    fit(sae, batches, SAETraining(steps=60, lr=LR, warmup=0, resamples=0, dead_after=256))
    torch.testing.assert_close(sae.decoder_norms(), torch.ones(D_SAE))  # kept at unit norm throughout
    assert not (sae.encode(x)[:, :8] > 0).any()
    optimizer = torch.optim.Adam(sae.parameters())
    dead = torch.zeros(D_SAE, dtype=torch.bool)
    dead[:8] = True
    assert resample(sae, optimizer, x[:256], dead) == 8
    assert (sae.b_enc[:8] == 0).all() and (sae.encode(x)[:, :8] > 0).any()  # they fire again
    torch.testing.assert_close(sae.decoder_norms()[:8], torch.ones(8))
    # a short run with resampling on: it resamples the dead latents by itself
    lines = []
    sae2 = SparseAutoencoder(SAEConfig(d_in=D_IN, d_sae=D_SAE, kind="relu", l1_coefficient=L1))
    with torch.no_grad():
        sae2.b_enc[:8] = -100.0
    fit(sae2, batches, SAETraining(steps=40, lr=LR, warmup=0, resamples=1, dead_after=256, log=lines.append))
    assert any("resampled" in line for line in lines), lines


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sae") / "gpt"
    corpus = out.parent / "c.txt"
    corpus.write_text("the cat sat on the mat. the dog sat on the log. " * 300)
    attnlab.train(
        "gpt",
        data=str(corpus),
        out=out,
        preset="nano",
        context=32,
        max_iters=60,
        eval_interval=60,
        eval_iters=1,
        sample_chars=0,
        progress=False,
        **PINNED_TRAINING,
    )
    return out


def test_evaluation_splices_the_sae_into_the_model(gpt_run):
    model = attnlab.load(gpt_run)
    _, ids = model.corpus_ids("val")
    d = model.config.dim
    hook = "blocks.1.hook_resid_mid"
    # a hand-built SAE that reconstructs exactly: relu(x) − relu(−x) = x
    exact = SparseAutoencoder(SAEConfig(d_in=d, d_sae=2 * d, hook=hook, apply_b_dec_to_input=False))
    with torch.no_grad():
        eye = torch.eye(d)
        exact.W_enc.copy_(torch.cat([eye, -eye], 1))
        exact.W_dec.copy_(torch.cat([eye, -eye], 0))
        exact.b_enc.zero_()
        exact.b_dec.zero_()
    m = evaluate(model, exact, ids, batches=2, batch_size=4)
    assert m["ce_with_sae"] == pytest.approx(m["ce_clean"], abs=1e-5)
    assert m["explained_variance"] == pytest.approx(1.0, abs=1e-6) and m["ce_loss_recovered"] == pytest.approx(1.0)
    assert m["ce_zero_ablated"] > m["ce_clean"] + 0.1
    # an SAE that outputs only its bias b_dec = 0 is zero-ablation
    zero = SparseAutoencoder(SAEConfig(d_in=d, d_sae=4, hook=hook))
    with torch.no_grad():
        zero.b_enc.fill_(-1e6)
        zero.b_dec.zero_()
    mz = evaluate(model, zero, ids, batches=2, batch_size=4)
    assert mz["ce_with_sae"] == pytest.approx(mz["ce_zero_ablated"], abs=1e-5) and mz["l0"] == 0
    assert mz["ce_loss_recovered"] == pytest.approx(0.0, abs=1e-5) and mz["dead_fraction"] == 1.0


def test_train_evaluate_features_from_python_and_the_command_line(gpt_run, tmp_path, capsys):
    model = attnlab.load(gpt_run)
    run = attnlab.sae.train(model, "blocks.1.hook_resid_post", kind="topk", k=8, steps=150, progress=False)
    assert run.sae.config.d_sae == 8 * model.config.dim and run.metrics["l0"] <= 8
    assert run.metrics["explained_variance"] > 0.5 and run.metrics["ce_with_sae"] < run.metrics["ce_zero_ablated"]
    pages = attnlab.sae.features(model, run.sae, count=3)
    assert len(pages) == 3 and all(p["contexts"] and len(p["promotes"]) == 6 for p in pages)
    hit = pages[0]["contexts"][0]
    assert (
        max(hit["activations"]) == hit["activations"][hit["at"]] == pytest.approx(pages[0]["max_activation"], abs=1e-3)
    )
    out = tmp_path / "sae"
    argv = ["sae", "train", "--ckpt", str(gpt_run), "--hook", "blocks.0.hook_resid_post", "--out", str(out)]
    assert main([*argv, "--steps", "100", "--latents", "128", "--device", "cpu"]) == 0
    assert "explained variance" in capsys.readouterr().out
    saved = json.loads((out / "sae.json").read_text())
    assert saved["config"]["d_sae"] == 128 and saved["model"] == str(gpt_run)
    assert main(["sae", "eval", "--sae", str(out), "--json", "--device", "cpu"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again == pytest.approx(json.loads((out / "metrics.json").read_text()))  # (the same windows)
    page = tmp_path / "f.html"
    assert main(["sae", "features", "--sae", str(out), "--out", str(page), "--count", "4", "--device", "cpu"]) == 0
    assert page.read_text().count("<section") == 4 and "http" not in page.read_text().split("<body>")[1]
    # the explorer lists the SAE's active latents at each position (the sae view of its side panel)
    view = model.explore(text="the cat sat", sae=out)
    sae = attnlab.sae.load(out)
    assert view["sae"]["hook"] == "blocks.0.hook_resid_post" and len(view["sae"]["latents"]) == len(view["tokens"])
    _, cache = model.run_with_cache(model.token_ids("the cat sat"))
    latents = sae.encode(cache["blocks.0.hook_resid_post"][0]).detach()
    for t, listed in enumerate(view["sae"]["latents"]):
        assert [i for i, _ in listed] == latents[t].topk(len(listed)).indices.tolist()
        assert all(float(latents[t, i]) == pytest.approx(v, abs=1e-3) for i, v in listed)
    html = tmp_path / "e.html"
    assert main(["explore", "--ckpt", str(gpt_run), "--text", "the cat", "--sae", str(out), "--out", str(html)]) == 0
    assert '"sae":{"hook":"blocks.0.hook_resid_post"' in html.read_text()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--hook", "blocks.7.hook_resid_post"], "is not a hook point of this model"),
        (["--hook", "blocks.0.hook_resid_post", "--kind", "topk", "--k", "100000"], "is more than the SAE's"),
    ],
)
def test_bad_sae_requests_get_one_line(gpt_run, tmp_path, capsys, argv, message):
    assert main(["sae", "train", "--ckpt", str(gpt_run), "--out", str(tmp_path / "s"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_an_sae_on_a_vit_with_image_feature_pages(tmp_path, capsys):
    pytest.importorskip("sklearn")
    opts = {**dict(next(r for r in attnlab.recipes.recipes() if r.name == "vit").tiny), **PINNED_TRAINING}
    opts.update(max_iters=30, eval_interval=30)
    run = attnlab.train("vit", out=tmp_path / "vit", **opts)
    vit = attnlab.load(run.out)
    hook = "encoder.blocks.0.hook_resid_post"
    sae_run = attnlab.sae.train(vit, hook, kind="topk", k=4, steps=120, progress=False)
    m = sae_run.metrics
    assert m["l0"] <= 4 and m["explained_variance"] > 0.3 and m["tokens"] > 0
    assert m["ce_clean"] < m["ce_zero_ablated"] and math.isfinite(m["ce_with_sae"])  # the classifier's loss, spliced
    pages = attnlab.sae.features(vit, sae_run.sae, count=3)
    assert len(pages) == 3 and pages[0]["contexts"] and {t for t, _ in pages[0]["promotes"]} <= set(vit.labels)
    hit = pages[0]["contexts"][0]
    assert hit["activation"] == pytest.approx(pages[0]["max_activation"], abs=1e-3)
    page = attnlab.sae.write_features(vit, sae_run.sae, tmp_path / "f.html", count=3)
    html = page.read_text()
    assert html.count("<section") == 3 and "data:image/png;base64," in html and 'class="box"' in html
    out = tmp_path / "sae"
    argv = ["sae", "train", "--ckpt", str(run.out), "--hook", hook, "--out", str(out), "--steps", "30"]
    assert main([*argv, "--kind", "topk", "--k", "4", "--device", "cpu"]) == 0
    assert (out / "sae.safetensors").is_file() and "explained variance" in capsys.readouterr().out


def test_gradient_clipping_as_sae_lens_s_trainer(monkeypatch):
    """grad_clip: the gradient reaching Adam has at most that norm at every step (SAELens's
    SAETrainer clips at 1.0); without it the same steps see larger ones."""
    x = REF["activations"]
    seen: list[float] = []
    step = torch.optim.Adam.step

    def recording(self, *args, **kwargs):
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        seen.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", recording)
    norms = {}
    for clip in (0.0, 0.05):
        seen.clear()
        sae = sae_with("standard.init.", kind="relu", l1_coefficient=L1)
        batches = (x[(s * BATCH) % 1024 : (s * BATCH) % 1024 + BATCH] for s in range(20))
        fit(sae, batches, SAETraining(steps=20, lr=LR, warmup=0, decay=0, resamples=0, grad_clip=clip))
        norms[clip] = list(seen)
    assert max(norms[0.05]) <= 0.05 + 1e-6 and min(norms[0.0]) > 0.05
