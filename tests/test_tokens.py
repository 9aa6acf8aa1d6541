import pytest
import torch

from attnlab.errors import UnknownTokenError
from attnlab.tokens import BPETokenizer, CharTokenizer, ChunkEmbed1D, PatchEmbed, load_tokenizer

CORPUS = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 20


def test_char_tokenizer_roundtrip_and_save(tmp_path):
    tok = CharTokenizer.from_corpus(CORPUS)
    assert tok.decode(tok.encode("to be")) == "to be"
    assert tok.vocab_size == len(set(CORPUS))
    tok.save(tmp_path / "t.json")
    again = load_tokenizer(tmp_path / "t.json")
    assert again.encode("question") == tok.encode("question")


def test_char_tokenizer_unknown():
    tok = CharTokenizer.from_corpus("abc")
    with pytest.raises(UnknownTokenError, match=r"'z' \(U\+007A\)"):
        tok.encode("abz")
    tok = CharTokenizer.from_corpus("abc", unk="<unk>")
    assert tok.encode("az") == [0, 3]
    assert tok.decode([0, 3]) == "a<unk>"


@pytest.mark.parametrize("kind", ["char", "bpe", "word"])
def test_every_tokenizer_refuses_ids_outside_its_vocabulary_in_one_line(kind):
    """One check for every kind: the last id decodes, one past it and -1 are refused by name (a list
    index would wrap -1 to the last token; ``tokenizers`` would skip both silently)."""
    from attnlab.tokens import WordTokenizer

    tok = {"char": lambda: CharTokenizer.from_corpus(CORPUS), "bpe": lambda: BPETokenizer.train(CORPUS, 300),
           "word": lambda: WordTokenizer.train([CORPUS], ["<unk>"])}[kind]()  # fmt: skip
    last = tok.vocab_size - 1
    assert tok.decode([last]) != ""
    for bad in (tok.vocab_size, -1):
        with pytest.raises(UnknownTokenError, match=rf"^token id {bad} is outside the vocabulary \(0\.\.{last}\)$"):
            tok.decode([0, bad])


@pytest.mark.parametrize(
    "text",
    ["hello world", "  leading and trailing  \n\n", "Grüße, 東京! 🚀 emoji\ttab", "\x00\x7f ünïcödé", ""],
)
def test_bpe_roundtrip_any_utf8(text, tmp_path):
    tok = BPETokenizer.train(CORPUS, vocab_size=300)
    assert 256 < tok.vocab_size <= 300
    assert tok.decode(tok.encode(text)) == text
    tok.save(tmp_path / "bpe.json")
    again = load_tokenizer(tmp_path / "bpe.json")
    assert again.encode(text) == tok.encode(text)


def test_bpe_learns_merges():
    tok = BPETokenizer.train(CORPUS, vocab_size=320)
    assert len(tok.encode("the question")) < len("the question".encode())
    with pytest.raises(ValueError, match="smaller than the 256 byte tokens"):
        BPETokenizer.train(CORPUS, vocab_size=100)


def test_patch_embed_is_flatten_then_shared_linear():
    pe = PatchEmbed(patch_size=4, in_chans=3, dim=10)
    img = torch.randn(2, 3, 8, 12)
    out = pe(img)
    assert out.shape == (2, 6, 10)
    flat = pe.flatten_patches(img)  # (B, N, C*P*P)
    w = pe.proj.weight.reshape(10, -1)  # E
    assert torch.allclose(out, flat @ w.T + pe.proj.bias, atol=1e-5)
    # patch n is the n-th P×P block in row-major order
    assert torch.equal(flat[0, 4].reshape(3, 4, 4), img[0, :, 4:8, 4:8])


def test_patch_embed_not_divisible():
    with pytest.raises(ValueError, match="30x32 is not divisible by patch size 4"):
        PatchEmbed(4, 3, 8)(torch.randn(1, 3, 30, 32))


def test_chunk_embed_1d():
    ce = ChunkEmbed1D(5, 2, 6)
    x = torch.randn(3, 2, 20)
    out = ce(x)
    assert out.shape == (3, 4, 6)
    chunk = x[0, :, 5:10].reshape(-1)
    assert torch.allclose(out[0, 1], ce.proj(chunk), atol=1e-6)
    with pytest.raises(ValueError, match="not divisible by chunk size 5"):
        ce(torch.randn(1, 2, 21))
