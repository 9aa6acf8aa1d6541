"""export_hf keeps the tokenizer: HuggingFace's AutoTokenizer reads the exported folder to the
same ids as attnlab's tokenizer (char, BPE, WordPiece), and attnlab.load of the folder generates."""

import pytest

import attnlab
from attnlab.recipes import recipes

pytest.importorskip("transformers")
from transformers import AutoTokenizer  # noqa: E402

TEXT = "To be, or not to be: that is the question.\nWhether 'tis nobler in the mind to suffer"


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_a_gpt_export_carries_its_tokenizer(tokenizer, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT * 40)
    opts = dict(next(r for r in recipes() if r.name == "gpt").tiny)
    opts.update(tokenizer=tokenizer, **({"vocab_size": 300} if tokenizer == "bpe" else {}))
    run = attnlab.train("gpt", data=str(corpus), out=tmp_path / "run", **opts)
    model = attnlab.load(run.out)
    attnlab.export_hf(model, tmp_path / "hf")
    theirs = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    for text in (TEXT, "be or not\n\nthe", "  question  "):
        ids = model.tokenizer.encode(text)
        assert theirs.encode(text, add_special_tokens=False) == ids, text
        assert theirs.decode(ids) == model.tokenizer.decode(ids) == text
    again = attnlab.load(tmp_path / "hf")  # a HuggingFace folder: its tokenizer.json
    assert again.tokenizer.encode(TEXT) == model.tokenizer.encode(TEXT)
    assert again.generate("To be", 12, temperature=0) == model.generate("To be", 12, temperature=0)
    assert theirs.model_max_length == model.config.context


def test_a_bert_export_carries_its_wordpiece_tokenizer(tmp_path):
    opts = dict(next(r for r in recipes() if r.name == "encoder").tiny)
    run = attnlab.train("encoder", out=tmp_path / "run", **opts)
    model = attnlab.load(run.out)
    attnlab.export_hf(model, tmp_path / "hf")
    theirs = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    for text in ("The attention is all you need.", "unseenwordpieces here"):
        assert theirs(text)["input_ids"] == model.tokenizer.encode(text)  # [CLS] ... [SEP], the same pieces
    assert (theirs.cls_token, theirs.sep_token, theirs.mask_token, theirs.pad_token) == (
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "[PAD]",
    )


def test_attnlab_export_hf_writes_what_transformers_loads_to_the_same_logits(tiny_run, tmp_path, capsys):
    import torch
    from transformers import AutoModelForCausalLM

    from attnlab.cli import main

    run = tiny_run("gpt").out
    assert main(["export", str(run), str(tmp_path / "hf")]) == 2  # (the format named: --hf)
    assert "name the format to write: --hf" in capsys.readouterr().err
    assert main(["export", "--hf", str(run), str(tmp_path / "hf")]) == 0
    ours = attnlab.load(run)
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    ids = torch.tensor([ours.tokenizer.encode("to be or not")])
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, ours.eval()(ids), atol=1e-5, rtol=1e-5)
    again = attnlab.load(tmp_path / "hf")  # and back: the folder is read as it is
    assert again.generate("to", 8, temperature=0) == ours.generate("to", 8, temperature=0)
    assert main(["export", "--hf", str(run), str(tmp_path / "hf")]) == 2  # (nothing written over)
    assert "is not an empty folder" in capsys.readouterr().err
