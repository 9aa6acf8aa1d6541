"""A new model family is its model and its family, here both in this one file (issues 47, 64): a toy
sequence classifier registered for the duration of the test is trained, evaluated, asked to
predict, explored and served through the command line, the Python API and the server, with no edit
anywhere else."""

import inspect
import re
from dataclasses import dataclass
from typing import Annotated

import pytest
import torch
from torch import Tensor, nn

import attnlab
from attnlab.blocks import Encoder
from attnlab.config import Config
from attnlab.errors import OptionError
from attnlab.options import Arg, checked, fraction
from attnlab.hooks import HookedModule, HookPoint
from attnlab.losses import cross_entropy
from attnlab.recipes import ModelKind, Recipe, TrainingRun
from attnlab.training import TrainConfig
from attnlab.recipes.base import ExploreInput, ExplorerForm, TopK, TrainOptions, Verbs, top_labels

from helpers import PINNED_FLAGS


# ---- the model file --------------------------------------------------------------------------------
@dataclass
class RepeatConfig(Config):
    SIZES = ("vocab_size", "context", "dim", "heads", "layers")

    vocab_size: int = 8
    context: int = 6
    dim: int = 16
    heads: int = 2
    layers: int = 1


class RepeatClassifier(HookedModule):
    """Token ids (B, T) -> logits (B, 2): does the first token appear again later? One attention
    layer answers it (the first position attends to its equals). Hook points: ``hook_embed``
    (B, T, D) and the encoder's ``blocks.L.*``."""

    model_type = "repeat"
    config_class = RepeatConfig

    def __init__(self, c: RepeatConfig) -> None:
        super().__init__()
        self.config = c
        self.tok_emb = nn.Embedding(c.vocab_size, c.dim)
        self.pos_emb = nn.Parameter(torch.zeros(c.context, c.dim))
        self.hook_embed = HookPoint()
        self.encoder = Encoder(c.layers, c.dim, c.heads)
        self.head = nn.Linear(c.dim, 2)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.hook_embed(self.tok_emb(ids) + self.pos_emb[: ids.shape[1]])  # (B, T, D)
        return self.head(self.encoder(x)[:, 0])  # (B, 2), read at the first position


# ---- the family file ---------------------------------------------------------------------------
class RepeatTask:
    """Random sequences, half of them with their first token written again later."""

    static_shapes = True

    def __init__(self, c: RepeatConfig, batch_size: int, flip: float = 0.0) -> None:
        self.c, self.items_per_batch, self.flip = c, batch_size, flip

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        c = self.c
        ids = torch.randint(1, c.vocab_size, (batch_size, c.context), generator=generator)
        ids[:, 1:] = torch.where(ids[:, 1:] == ids[:, :1], (ids[:, 1:] % (c.vocab_size - 1)) + 1, ids[:, 1:])
        label = torch.randint(0, 2, (batch_size,), generator=generator)
        where = torch.randint(1, c.context, (batch_size,), generator=generator)
        ids[label.bool(), where[label.bool()]] = ids[label.bool(), 0]
        if split == "train" and self.flip:  # (label noise: a share of the training labels flipped)
            label = torch.where(torch.rand(batch_size, generator=generator) < self.flip, 1 - label, label)
        return ids, label

    def loss(self, model: nn.Module, batch) -> Tensor:
        ids, label = batch
        return cross_entropy(model(ids), label)

    def meta(self) -> dict:
        return {"data": "repeated first tokens"}


LABELS = ["once", "again"]


def digit_ids(model, digits: str) -> Tensor:
    """A text of digits as the model's token ids (1, T)."""
    return torch.tensor([[int(ch) % model.config.vocab_size for ch in digits[: model.config.context]]])


class RepeatVerbs(Verbs):
    """What a loaded toy classifier does besides its forward pass."""

    @checked
    def predict(self, texts: str | list[str], top_k: TopK = 3):
        """The (label, probability) pairs of each text of digits, most likely first."""
        many = isinstance(texts, list)
        with torch.no_grad():
            probs = torch.cat([self(digit_ids(self, t)).softmax(-1) for t in (texts if many else [texts])])
        out = top_labels(probs, LABELS, top_k)
        return out if many else out[0]


@dataclass(frozen=True)
class RepeatTrainOptions(TrainOptions):
    """The family's own options of `attnlab train repeat`: a new one is this one field (its type,
    bound, default and help), seen by --help, attnlab.train and train_args("repeat") alike."""

    flip: Annotated[float, Arg("share of the training labels flipped (label noise)", fraction)] = 0.0


class RepeatRecipe(Recipe):
    name = "repeat"
    help = "a toy classifier: does the first token come again?"
    description = "Train a one-layer attention classifier on random sequences (a test's own family)."
    models = {"repeat": ModelKind(RepeatConfig, RepeatClassifier, RepeatVerbs)}  # (loaded: the model with its verbs)
    # what the explorer reads, under a name no other family uses: `attnlab explore --digits`,
    # explore(digits=...) and the server's page and JSON field all come from this one declaration
    explore_form = ExplorerForm(
        "Type digits 0 to 7: the page shows their attention.",
        (ExploreInput("digits", "line", help="digits 0 to 7 to look at"),),
    )
    train_options = RepeatTrainOptions
    train_defaults = TrainConfig(max_iters=30, eval_interval=30, eval_iters=2, batch_size=32, lr=3e-3)
    tiny = dict(max_iters=4, eval_interval=4, eval_iters=1, batch_size=8, progress=False, device="cpu")

    def prepare(self, o, saved, model_over, tcfg, out):
        c = RepeatConfig.from_dict(saved["model"]) if saved else RepeatConfig(**model_over)
        task = RepeatTask(c, tcfg.batch_size, o.flip)
        return TrainingRun("repeat", c, task, {"data": "repeated first tokens"}, "repeat")

    def evaluate(self, model, on) -> tuple[dict, str]:
        ids, label = RepeatTask(model.config, 256).batch("val", 256, torch.Generator().manual_seed(0))
        with torch.no_grad():
            accuracy = (model(ids).argmax(-1) == label).float().mean().item()
        return {"accuracy": accuracy}, f"accuracy {accuracy:.3f} on 256 sequences"

    def predict(self, ckpt, inputs: list[str], *, top_k: int, device: str) -> int:
        """``attnlab predict``: each text of digits and its labels."""
        model = self.model_of(ckpt, device)
        for text, top in zip(inputs, model.predict(list(inputs), top_k=top_k)):
            print(f"{text}: " + ", ".join(f"{label} {p:.3f}" for label, p in top))
        return 0

    def explore(self, model, digits: str | None = None) -> dict:
        ids = digit_ids(model, digits or "0")
        with torch.no_grad():
            _, cache = model.run_with_cache(ids, names="encoder.blocks.*.attn.hook_pattern")
        return {
            "kind": "text",
            "tokens": [str(i) for i in ids[0].tolist()],
            "attention": torch.stack(cache.layers("attn.hook_pattern"))[:, 0].numpy(),  # (L, H, T, T)
        }


@pytest.fixture
def repeat_family(monkeypatch):
    """The family registered for this test only (the registry is left as it was)."""
    from attnlab import recipes as registry

    registry.recipes()  # (the package's own families first)
    monkeypatch.setitem(registry._REGISTRY, "repeat", RepeatRecipe())
    return RepeatRecipe


def test_a_family_in_one_file_through_the_cli_the_api_and_the_server(repeat_family, tmp_path, capsys):
    from attnlab.cli import main

    # the Python API: train, load, evaluate, explore
    run = attnlab.train("repeat", out=tmp_path / "py", **RepeatRecipe.tiny)
    model = attnlab.load(run.out)
    assert isinstance(model, RepeatClassifier) and run.step == 4
    assert 0 <= model.evaluate()["accuracy"] <= 1
    labels = model.predict(["1231", "1234"], top_k=1)  # its verbs, by its declaration (top_k checked)
    assert [len(t) for t in labels] == [1, 1] and {t[0][0] for t in labels} <= set(LABELS)
    with pytest.raises(OptionError, match=r"top_k=0 \(--top-k\)"):
        model.predict("1231", top_k=0)
    assert model.explore(digits="1231")["attention"].shape == (1, 2, 4, 4)
    with pytest.raises(OptionError, match=r"^text= is not read by repeat models; give digits=$"):
        model.explore(text="1231")
    assert attnlab.train_options("repeat")["heads"] == 2  # (the config's field, at its default)
    # the command line: its flags come from the config's fields and the trainer's
    out = tmp_path / "cli"
    assert main(["train", "repeat", "--out", str(out), "--max-iters", "30", "--layers", "1", "--no-progress",
                 *PINNED_FLAGS]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["eval", "--ckpt", str(out), "--json"]) == 0
    assert '"accuracy"' in capsys.readouterr().out
    assert main(["predict", "--ckpt", str(out), "1231", "5675", "--top-k", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[0] for line in lines] == ["1231", "5675"]
    assert all(line.split(": ")[1].split()[0] in LABELS for line in lines)
    assert main(["explore", "--ckpt", str(out), "--digits", "12341", "--out", str(tmp_path / "page.html")]) == 0
    assert (tmp_path / "page.html").read_text().lower().startswith("<!doctype html>")
    assert main(["explore", "--ckpt", str(out), "--text", "12", "--out", str(tmp_path / "page.html")]) == 2
    assert "--text is not read by repeat models; give --digits" in capsys.readouterr().err
    # the server (`attnlab serve`): the explorer's data for new input, over HTTP
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    import threading

    from attnlab.serve import serve

    started, box = threading.Event(), {}
    thread = threading.Thread(
        target=serve,
        args=(attnlab.load(out),),
        kwargs=dict(host="127.0.0.1", port=0, ready=lambda s: (box.update(s=s), started.set())),
        daemon=True,
    )
    thread.start()
    assert started.wait(20)
    try:
        url = f"http://127.0.0.1:{box['s'].server_address[1]}"
        page = httpx.get(url, timeout=30).text
        assert "Type digits 0 to 7" in page and '<input size="60" data-field="digits"' in page
        answer = httpx.post(f"{url}/explore", json={"digits": "3213"}, headers={"Origin": url}, timeout=30)
        assert answer.status_code == 200 and "explorerReady" in answer.text, answer.text
        refused = httpx.post(f"{url}/explore", json={"text": "x"}, headers={"Origin": url}, timeout=30)
        assert refused.status_code == 400 and refused.text.startswith("error:")  # (it reads digits only)
    finally:
        box["s"].shutdown()
        thread.join(10)


def test_a_new_train_option_is_one_field_seen_and_checked_by_every_surface(repeat_family, tmp_path, capsys):
    """`flip` is declared once, as a field of RepeatTrainOptions: --help lists it with its help and
    default, train_args("repeat") has it typed, a run uses it, and a value out of its bound is
    refused by the flag, the keyword and the typed options with the same reason."""
    from attnlab.cli import main

    assert main(["train", "repeat", "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "--flip FLOAT share of the training labels flipped (label noise)" in shown
    RepeatTrain = attnlab.train_args("repeat")
    param = inspect.signature(RepeatTrain).parameters["flip"]
    assert (param.annotation, param.default, param.kind) == (float, 0.0, param.KEYWORD_ONLY)
    assert attnlab.train_options("repeat")["flip"] == 0.0
    reason = "1.5 is out of range: must be in [0, 1]"
    assert main(["train", "repeat", "--flip", "1.5", "--out", str(tmp_path / "cli")]) == 2
    assert f"--flip: {reason}" in capsys.readouterr().err
    refusal = "^" + re.escape(f"flip=1.5 (--flip): {reason}") + "$"
    with pytest.raises(OptionError, match=refusal):
        attnlab.train("repeat", flip=1.5, out=tmp_path / "py")
    with pytest.raises(OptionError, match=refusal):
        RepeatTrain(flip=1.5)
    assert not (tmp_path / "cli").exists() and not (tmp_path / "py").exists()
    # the typed options train as the keywords do, and the run reads the value: the same seed's first
    # loss, on the same batch, differs when its labels are flipped
    tiny = {**RepeatRecipe.tiny, "log_interval": 1}
    plain = attnlab.train(RepeatTrain(**tiny), out=tmp_path / "plain")
    flipped = attnlab.train(RepeatTrain(flip=1.0, **tiny), out=tmp_path / "flipped")
    assert '"flip": 1.0' in (flipped.out / "options.json").read_text()
    assert plain.metrics[0]["loss"] != flipped.metrics[0]["loss"]
