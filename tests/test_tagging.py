"""Token classification (`train encoder --task tag`): word-aligned labels, the embedded
synthetic-pos task against a tagger that sees each word alone, the commands and their errors."""

import json

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.data.tagged import IGNORE, TaggedTexts, encode_tagged, read_tagged, synthetic_pos, unigram_baseline
from attnlab.errors import DataError
from attnlab.tokens import WordPieceTokenizer
from helpers import PINNED_FLAGS

FAST = ["--eval-iters", "1", "--batch-size", "8", "--no-progress", *PINNED_FLAGS]
SMALL = ["--layers", "1", "--heads", "2", "--dim", "32", "--mlp-dim", "64", "--context", "32"]


def test_only_the_first_piece_of_each_word_carries_its_tag(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "un", "##believ", "##able"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab))
    tok = WordPieceTokenizer.from_vocab(tmp_path / "vocab.txt")
    words = ["the", "unbelievable", "cat"]
    ids, labels, firsts, cut = encode_tagged(tok, words, ["A", "B", "C"], {"A": 0, "B": 1, "C": 2}, 32)
    assert ids == [2, 5, 7, 8, 9, 6, 3] and not cut  # [CLS] the un ##believ ##able cat [SEP]
    assert labels == [IGNORE, 0, 1, IGNORE, IGNORE, 2, IGNORE]
    assert firsts == [1, 2, 5]
    # cut at the context: the last words lose their tags, [SEP] stays
    ids, labels, firsts, cut = encode_tagged(tok, words, ["A", "B", "C"], {"A": 0, "B": 1, "C": 2}, 4)
    assert cut and len(ids) == 4 and ids[-1] == tok.sep_id and labels == [IGNORE, 0, 1, IGNORE]


def test_unigram_baseline_by_hand():
    """Each word gets its most frequent training tag, an unseen word the most frequent tag overall."""
    train_words = [["fish", "swim"]] * 3 + [["we", "fish"]]
    train_tags = [["N", "V"]] * 3 + [["P", "V"]]
    test_words = [["we", "fish"], ["fish", "swim"], ["cats", "swim"]]
    test_tags = [["P", "V"], ["N", "V"], ["N", "V"]]
    data = TaggedTexts("t", {"train": train_words, "test": test_words}, {"train": train_tags, "test": test_tags},
                       ["N", "P", "V"])  # fmt: skip
    base = unigram_baseline(data, "test")
    # fish -> N (3 of 4), swim -> V, we -> P, cats (unseen) -> V (4 of the 8 training tags)
    # test: we/P ok, fish/V wrong, fish/N ok, swim/V ok, cats/N wrong, swim/V ok
    assert base["accuracy"] == pytest.approx(4 / 6)
    assert base["ambiguous"] == {"fish"} and base["ambiguous_words"] == 2
    assert base["ambiguous_accuracy"] == pytest.approx(1 / 2)


def test_the_embedded_task_needs_context():
    """synthetic-pos: the words that are nouns and verbs are tagged by context only, so tagging
    each word alone is near chance on them; the splits share no sentence."""
    data = synthetic_pos()
    base = unigram_baseline(data)
    assert base["ambiguous_words"] > 300 and base["ambiguous_accuracy"] < 0.7
    train = {tuple(w) for w in data.words["train"]}
    assert not any(tuple(w) in train for w in data.words["test"])
    assert all(len(w) == len(t) for w, t in zip(data.words["test"], data.tags["test"]))


def test_a_tagger_learns_what_one_word_cannot_tell(tmp_path, capsys):
    """The embedded task from the command line: the trained tagger is right on the ambiguous
    words where the word-alone baseline is not; eval and predict report it."""
    out = tmp_path / "tag"
    args = ["train", "encoder", "--task", "tag", "--out", str(out), *SMALL, *FAST]
    assert main([*args, "--max-iters", "250", "--eval-interval", "250", "--batch-size", "32", "--lr", "3e-3"]) == 0
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(out), "--json", "--device", "cpu", "--out", str(tmp_path / "cm.png")]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["words"] > 3000 and res["ambiguous_words"] > 300
    assert res["unigram_ambiguous_accuracy"] < 0.7  # the baseline that must fail
    assert res["ambiguous_accuracy"] > 0.9 and res["accuracy"] > 0.95
    assert main(["predict", "--ckpt", str(out), "the old man saw a duck .", "--device", "cpu"]) == 0
    tags = [p.rsplit("/", 1)[1] for p in capsys.readouterr().out.split()]
    assert tags == ["DET", "ADJ", "NOUN", "VERB", "DET", "NOUN", "PUNCT"]
    model = attnlab.load(out)
    words = model.predict("she saw the saw .")
    assert [(w, t) for w, t, _ in words][1:4] == [("saw", "VERB"), ("the", "DET"), ("saw", "NOUN")]
    assert all(0 < p <= 1 for _, _, p in words)
    ids = torch.tensor([model.tokenizer.encode("the cat")])
    assert model.tag(ids).shape == (1, ids.shape[1], len(model.config.labels))
    with pytest.raises(ValueError, match="no text classification head"):
        model.classify(ids)


def test_tagging_bad_input(tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("the cat sat\tDET NOUN\n" * 5)
    assert main(["train", "encoder", "--task", "tag", "--data", str(bad), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "not aligned" in err and "3 words but 2 tags" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()
    with pytest.raises(DataError, match="no tags"):
        (tmp_path / "untagged.tsv").write_text("just words\n")
        read_tagged(tmp_path / "untagged.tsv")
    good = tmp_path / "good.tsv"
    good.write_text("the cat sat\tDET NOUN VERB\n" * 12)
    run = tmp_path / "tagger"
    assert main(["train", "encoder", "--task", "tag", "--data", str(good), "--out", str(run), *SMALL, *FAST,
                 "--max-iters", "2", "--eval-interval", "2"]) == 0  # fmt: skip
    other = tmp_path / "other.tsv"
    other.write_text("a dog ran\tDET NOUN MOVE\n" * 12)
    assert main(["eval", "--ckpt", str(run), "--data", str(other)]) == 2
    assert "tags the model does not know" in capsys.readouterr().err
    assert main(["train", "encoder", "--label-smoothing", "0.1", "--out", str(tmp_path / "r3")]) == 2
    assert "--task classify or tag" in capsys.readouterr().err
