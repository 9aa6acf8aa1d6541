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
