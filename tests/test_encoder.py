"""The BERT-style text encoder: masking, pooling, HuggingFace BERT and ViT both ways, the commands."""

import json

import numpy as np
import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.models.encoder import TextEncoder, TextEncoderConfig, mean_pool
from attnlab.training.tasks import bert_mask
from helpers import tiny_run_flags

transformers = pytest.importorskip("transformers")

FAST = tiny_run_flags(max_iters=3, eval_interval=3)
SMALL = ["--layers", "1", "--heads", "2", "--dim", "16", "--mlp-dim", "32", "--context", "32", "--vocab-size", "200"]


def test_bert_masking_proportions_and_specials():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (200, 100))
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True
    inputs, targets = bert_mask(ids, special, mask_id=4, vocab_size=1000, generator=g)
    chosen = targets != -100
    assert not chosen[special].any()  # [CLS]/[SEP]/[PAD] are never chosen
    assert abs(chosen.float().mean().item() - 0.15 * 98 / 100) < 0.01
    assert torch.equal(targets[chosen], ids[chosen])
    masked = (inputs == 4)[chosen].float().mean().item()
    same = (inputs == ids)[chosen].float().mean().item()
    assert abs(masked - 0.8) < 0.02 and abs(same - 0.1) < 0.02  # the rest (~10 %) is random
    assert torch.equal(inputs[~chosen], ids[~chosen])


def test_bert_random_replacement_never_draws_a_special_token():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 8, (400, 50))  # a vocabulary of 8, five of them special: chance would draw them often
    inputs, targets = bert_mask(ids, torch.zeros_like(ids, dtype=torch.bool), 4, 8, g, never=(0, 1, 2, 3, 4))
    replaced = (targets != -100) & (inputs != ids) & (inputs != 4)
    assert replaced.sum() > 50 and not torch.isin(inputs[replaced], torch.tensor([0, 1, 2, 3])).any()


def test_mean_pool_by_hand():
    h = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    assert torch.allclose(mean_pool(h, torch.tensor([[1, 1, 0]])), torch.tensor([[2.0, 3.0]]))


def _hf_bert(kind, **extra):
    cfg = transformers.BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        type_vocab_size=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **extra,
    )
    torch.manual_seed(0)
    return getattr(transformers, kind)(cfg).eval()


def _batch():
    ids = torch.tensor([[2, 7, 8, 9, 10, 3], [2, 11, 12, 3, 0, 0]])
    return ids, (ids != 0).long(), torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0]])


@pytest.mark.parametrize(
    "kind", ["BertModel", "BertForMaskedLM", "BertForSequenceClassification", "BertForTokenClassification"]
)
def test_huggingface_bert_both_ways(kind, tmp_path):
    hf = _hf_bert(kind, num_labels=3)
    hf.save_pretrained(tmp_path / "hf")
    ours = attnlab.load(tmp_path / "hf")
    ids, mask, types = _batch()
    real = mask.bool()
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        hidden = ours(input_ids=ids, attention_mask=mask, token_type_ids=types)
        assert torch.allclose(hidden[real], out.hidden_states[-1][real], atol=1e-4)
        if kind == "BertForMaskedLM":
            assert torch.allclose(ours.mlm_logits(ids, mask, types)[real], out.logits[real], atol=1e-4)
        if kind == "BertForSequenceClassification":
            assert torch.allclose(ours.classify(ids, mask, types), out.logits, atol=1e-4)
        if kind == "BertForTokenClassification":
            assert ours.config.per_token and ours.tag(ids, mask, types).shape == (2, 6, 3)
            assert torch.allclose(ours.tag(ids, mask, types)[real], out.logits[real], atol=1e-4)
    # and back: attnlab -> HuggingFace -> the same numbers
    attnlab.export_hf(ours, tmp_path / "back")
    again = getattr(transformers, kind).from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        out2 = again(input_ids=ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
    assert torch.allclose(out2.hidden_states[-1][real], out.hidden_states[-1][real], atol=1e-4)
    if kind != "BertModel":
        per_token = kind in ("BertForMaskedLM", "BertForTokenClassification")
        assert torch.allclose(
            out2.logits[real] if per_token else out2.logits, out.logits[real] if per_token else out.logits, atol=1e-4
        )


def test_our_encoder_to_huggingface_and_embeddings(tmp_path):
    torch.manual_seed(1)
    ours = TextEncoder(
        TextEncoderConfig(vocab_size=60, context=16, layers=2, heads=2, dim=16, mlp_dim=32, dropout=0.0)
    ).eval()
    attnlab.export_hf(ours, tmp_path / "hf")
    hf = transformers.BertForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    ids, mask, _ = _batch()
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        assert torch.allclose(ours.mlm_logits(ids, mask)[mask.bool()], ref[mask.bool()], atol=1e-4)
        hidden = ours(ids, mask)
        by_hand = torch.stack([hidden[i, mask[i].bool()].mean(0) for i in range(2)])
        assert torch.allclose(ours.embed(ids, mask), by_hand, atol=1e-6)


def test_our_tagger_to_huggingface(tmp_path):
    """A per-token classifier exports as BertForTokenClassification (no pooler) with its tag names."""
    torch.manual_seed(2)
    cfg = TextEncoderConfig(
        vocab_size=60, context=16, layers=1, heads=2, dim=16, mlp_dim=32, dropout=0.0, mlm_head=False,
        num_classes=3, labels=["DET", "NOUN", "VERB"], per_token=True,
    )  # fmt: skip
    ours = TextEncoder(cfg).eval()
    attnlab.export_hf(ours, tmp_path / "hf")
    hf = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "BertForTokenClassification" and hf.config.id2label[2] == "VERB"
    ids, mask, _ = _batch()
    with torch.no_grad():
        assert torch.allclose(hf(input_ids=ids, attention_mask=mask).logits, ours.tag(ids, mask), atol=1e-4)


def test_vit_export_round_trip(tmp_path):
    from attnlab.models import ViT, ViTConfig

    torch.manual_seed(0)
    ours = ViT(
        ViTConfig(
            image_size=16, patch_size=4, in_chans=3, num_classes=5, dim=32, layers=2, heads=4, labels=list("abcde")
        )
    ).eval()
    attnlab.export_hf(ours, tmp_path / "vit")
    hf = transformers.ViTForImageClassification.from_pretrained(tmp_path / "vit").eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(hf(pixel_values=x).logits, ours(x), atol=1e-4)
        assert torch.allclose(attnlab.load(tmp_path / "vit")(x), ours(x), atol=1e-5)
    assert hf.config.id2label[2] == "c"
    with pytest.raises(attnlab.errors.CheckpointError, match="class token"):
        attnlab.export_hf(ViT(ViTConfig(image_size=16, patch_size=4, pool="mean", dim=32, heads=4)), tmp_path / "x")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("enc")
    tsv = root / "labels.tsv"
    rows = [f"the {w} sat on the mat\tanimal" for w in ("cat", "dog", "cow", "hen")] * 6
    rows += [f"a {w} drove down the road\tvehicle" for w in ("car", "bus", "van", "cab")] * 6
    tsv.write_text("\n".join(rows) + "\n")
    assert main(["train", "encoder", "--out", str(root / "mlm"), *SMALL, *FAST]) == 0
    assert (
        main(
            [
                "train",
                "encoder",
                "--task",
                "classify",
                "--data",
                str(tsv),
                "--init",
                str(root / "mlm"),
                "--out",
                str(root / "cls"),
                *FAST,
            ]
        )
        == 0
    )
    return root, tsv


def test_pretrain_then_classify_then_use(runs, capsys, tmp_path):
    root, tsv = runs
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(root / "mlm"), "--json", "--device", "cpu"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["masked_tokens"] > 0 and 0 <= res["accuracy_masked"] <= 1
    assert (
        main(
            [
                "eval",
                "--ckpt",
                str(root / "cls"),
                "--data",
                str(tsv),
                "--json",
                "--device",
                "cpu",
                "--out",
                str(tmp_path / "cm.png"),
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert 0 <= res["accuracy"] <= 1 and 0 <= res["macro_f1"] <= 1 and (tmp_path / "cm.png").stat().st_size > 0
    assert main(["predict", "--ckpt", str(root / "cls"), "the cat sat on the mat", "--device", "cpu"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.split("\t")[0] in ("animal", "vehicle")
    assert (
        main(
            [
                "embed",
                "--ckpt",
                str(root / "cls"),
                "one text",
                "two texts",
                "--out",
                str(tmp_path / "e.npy"),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert np.load(tmp_path / "e.npy").shape == (2, 16)


def test_encoder_bad_input(runs, capsys, tmp_path):
    root, tsv = runs
    capsys.readouterr()
    unlabelled = tmp_path / "u.tsv"
    unlabelled.write_text("just text without a label\n")
    assert (
        main(["train", "encoder", "--task", "classify", "--data", str(unlabelled), "--out", str(tmp_path / "r")]) == 2
    )
    assert "no label" in capsys.readouterr().err and not (tmp_path / "r").exists()
    other = tmp_path / "other.tsv"
    other.write_text("a plane flew\taircraft\n" * 12)
    assert main(["eval", "--ckpt", str(root / "cls"), "--data", str(other)]) == 2
    assert "labels the model does not know" in capsys.readouterr().err
    assert main(["embed", "--ckpt", str(root / "cls"), ""]) == 2
    assert "non-empty" in capsys.readouterr().err
    assert main(["predict", "--ckpt", str(root / "mlm"), "some text"]) == 2
    assert "without a classifier" in capsys.readouterr().err
    assert main(["train", "encoder", "--init", str(root / "mlm"), "--out", str(tmp_path / "r2")]) == 2
    assert "--task classify" in capsys.readouterr().err
    long_text = " ".join(["word"] * 100)
    assert main(["predict", "--ckpt", str(root / "cls"), long_text, "--device", "cpu"]) == 0
    assert "truncated" in capsys.readouterr().err


def test_restricted_attention_in_the_text_encoder():
    """--window r in the encoder: each token sees the r tokens on either side (and never padding);
    export to BERT refuses it."""
    from attnlab.errors import CheckpointError
    from attnlab.interop.bert import export_bert

    torch.manual_seed(0)
    enc = TextEncoder(TextEncoderConfig(vocab_size=30, context=16, layers=1, heads=2, dim=16, mlp_dim=32, window=1))
    ids = torch.randint(5, 30, (1, 6))
    mask = torch.tensor([[True] * 5 + [False]])
    _, cache = enc.eval().run_with_cache(ids, mask, names="encoder.blocks.0.attn.hook_pattern")
    seen = cache["encoder.blocks.0.attn.hook_pattern"][0, 0] > 0
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    assert torch.equal(seen, ((i - j).abs() <= 1) & (j < 5))
    with pytest.raises(CheckpointError, match="restricted attention"):
        export_bert(enc)
    with pytest.raises(ValueError, match=r"\(--window\): 0 is out of range: must be at least 1"):
        TextEncoderConfig(window=0)
