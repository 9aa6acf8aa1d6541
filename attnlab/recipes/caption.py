"""Image captioning: `attnlab train caption`, `attnlab caption`, `eval` (generated captions: BLEU,
exact captions, the pointing game on scenes) and `inspect caption` (the per-word attention figure)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any


from ..errors import DataError, OptionError
from ..models.configs import MAX_OBJECTS, CaptionConfig
from ..options import (
    ATTRIBUTION_METHOD,
    ATTRIBUTION_STEPS,
    Arg,
    AttributionMethod,
    AttributionSteps,
    Beam,
    Command,
    Device,
    LengthPenalty,
    checked,
    at_least,
    below_one,
    number,
)
from . import register
from .base import (
    ModelKind,
    TINY_RUN,
    Attribution,
    Evaluation,
    ImageInspection,
    Recipe,
    TrainingRun,
    TrainOptions,
    Verbs,
    read_image,
)


class CaptionerVerbs(Verbs):
    """A captioner loaded by :func:`attnlab.load`: ``vocab``, ``mean``/``std`` and ``caption``."""

    def attach(self, meta: dict) -> None:
        from ..data.parallel import Vocab

        self.vocab, self.mean, self.std = Vocab.from_dict(meta["vocab"]), meta["mean"], meta["std"]

    @checked
    def caption(
        self,
        images,
        *,
        beam: Beam = 3,
        alpha: LengthPenalty = 1.0,
    ):
        """The caption of each image (a file path, a list of them, or images in [0, 1] as a (3, H, W)
        or (N, 3, H, W) tensor): a string for one image, else a list; ``beam``: the beam size (1:
        greedy), ``alpha``: its length penalty exponent (`attnlab caption`'s options)."""
        from ..data.images import images_argument

        x, single = images_argument(images, self.config.in_chans, self.config.image_size)
        out = caption_images(
            self, self.vocab, x, {"mean": self.mean, "std": self.std}, self.device, beam=beam, alpha=alpha
        )
        return out[0] if single else out

    @checked
    def attribute(
        self, image, *, method: AttributionMethod = ATTRIBUTION_METHOD, steps: AttributionSteps = ATTRIBUTION_STEPS
    ):
        """Which pixels of ``image`` (a file path or a (3, H, W) tensor in [0, 1]) raised the logit
        of each word of its greedy caption: [(word, (H, W) attribution summed over channels), ...]
        (:func:`attnlab.inspect.attribution.caption_attributions`)."""
        from ..data.images import images_argument

        x, _ = images_argument(image, self.config.in_chans, self.config.image_size)
        words, pixels = word_attributions(self, self.vocab, {"mean": self.mean, "std": self.std}, x[:1], method, steps)
        return list(zip(words, pixels))


SCENE_OPTS = dict(n_train=8000, max_objects=3)


@dataclass(frozen=True)
class CaptionTrainOptions(TrainOptions):
    """The captioner's own options of ``attnlab train caption``: its images and captions."""

    data: Annotated[
        str | None,
        Arg(
            "scenes (embedded, generated; default) | coco-mini | COCO folder or captions JSON | image<TAB>caption file"
        ),
    ] = None
    train_scenes: Annotated[
        int | None, Arg(f"scenes: training images to generate (default {SCENE_OPTS['n_train']})", at_least(10))
    ] = None
    max_objects: Annotated[
        int | None,
        Arg(
            f"scenes: at most this many objects per image, 1 to {MAX_OBJECTS} (default 3; more than 3 need "
            "--image-size at least 8 pixels per object)",
            number(int, 1, True, MAX_OBJECTS, what=f"1 to {MAX_OBJECTS}"),
        ),
    ] = None
    label_smoothing: Annotated[float, Arg("label smoothing", below_one)] = 0.0


@dataclass(frozen=True)
class CaptionInspection(ImageInspection, Attribution):
    """The options of a captioner's inspections: the image, and how to attribute its words."""


@register
class CaptionRecipe(Recipe):
    train_options = CaptionTrainOptions
    inspect_options = CaptionInspection
    tiny = dict(
        TINY_RUN,
        train_scenes=40,
        image_size=32,
        dim=32,
        emb_dim=16,
        attention_dim=16,
    )
    name = "caption"
    help = "an image captioner: CNN or ViT encoder; RNN without or with attention, or Transformer decoder"
    description = (
        "Train an image captioner with teacher forcing. With no --data it learns synthetic scenes of "
        "coloured shapes generated from a seed (no download); --arch rnn has no attention (the "
        "bottleneck), rnn-attention is Show, Attend and Tell, transformer decodes with cross-attention."
    )
    models = {"captioner": ModelKind(CaptionConfig, "attnlab.models.caption:Captioner", CaptionerVerbs)}
    needs = "a captioner (trained with `attnlab train caption`)"
    set_by_data = ("vocab_size", "in_chans", "pad_id", "bos_id", "eos_id")
    follows_data = ("context",)  # the longest caption, <bos> and <eos> included
    train_defaults = replace(
        Recipe.train_defaults,
        batch_size=32,
        lr=2e-3,
        min_lr=1e-4,
        warmup_iters=50,
        max_iters=1200,
        weight_decay=0.0,
        beta2=0.99,
        grad_clip=2.0,
        eval_interval=200,
        eval_iters=4,
    )
    default_seconds = 155
    inspections = {
        "attention": "the image once per generated word with that word's attention (--image)",
        "caption": "the same as attention (its older name)",
        "attribution": "the image once per generated word with the pixels that raised its logit (--image, --method)",
    }

    def data_options(self, o) -> dict:
        return {"n_train": o.train_scenes, "max_objects": o.max_objects}

    def run_options(self, o, saved):
        opts = saved.get("data_opts", {})
        return {
            "data": (o.data, saved.get("data_spec")),
            **{k: (v, opts.get(k, SCENE_OPTS[k])) for k, v in self.data_options(o).items()},
        }

    # model options that only some decoders or image encoders read: given to another, they would do
    # nothing, which a user would not expect
    ONLY_FOR_ARCH = {
        "attention_dim": ("rnn-attention",),
        "alpha_c": ("rnn-attention",),
        "init_from_image": ("rnn-attention",),
        "image_vector": ("rnn", "rnn-attention"),
        "emb_dim": ("rnn", "rnn-attention"),
        "layers": ("transformer",),
        "mlp_dim": ("transformer",),
    }
    ONLY_FOR_ENCODER = {"patch_size": "vit", "enc_layers": "vit"}

    def check_new(self, o, model_over) -> None:
        arch = model_over.get("arch", CaptionConfig.arch)
        encoder = model_over.get("encoder", CaptionConfig.encoder)
        for name, archs in self.ONLY_FOR_ARCH.items():
            if name in model_over and arch not in archs:
                raise ValueError(
                    f"--{name.replace('_', '-')} applies to --arch {' or '.join(archs)}, not {arch}; drop it"
                )
        for name, needs in self.ONLY_FOR_ENCODER.items():
            if name in model_over and encoder != needs:
                raise ValueError(f"--{name.replace('_', '-')} applies to --encoder {needs}, not {encoder}; drop it")
        if "heads" in model_over and arch != "transformer" and encoder != "vit":
            raise ValueError(f"--heads applies to --arch transformer or --encoder vit, not {arch} with {encoder}")

    def prepare(self, o, saved, model_over, tcfg, out):
        from ..data.captions import load_captions
        from ..training.tasks import CaptionTask

        if saved:
            cfg = CaptionConfig.from_dict(saved["model"])
            spec, opts = saved.get("data_spec"), saved.get("data_opts", SCENE_OPTS)
            data = load_captions(spec, image_size=cfg.image_size, vocab=saved["vocab"], **opts)
        else:
            spec = o.data or "scenes"
            opts = {**SCENE_OPTS, **{k: v for k, v in self.data_options(o).items() if v is not None}}
            image_size = model_over.get("image_size", CaptionConfig.image_size)
            data = load_captions(spec, image_size=image_size, **opts)
            cfg = CaptionConfig(
                **{
                    "context": data.max_len + 2,
                    **model_over,
                    "vocab_size": data.vocab.size,
                    "in_chans": 3,
                    **data.vocab.special_ids(),
                }
            )
        if data.max_len + 1 > cfg.context:
            raise DataError(
                f"the longest caption of {data.name} has {data.max_len} tokens, more than the model's "
                f"context of {cfg.context} allows; give --context {data.max_len + 2} or more"
            )
        task = CaptionTask(data, tcfg.batch_size, o.label_smoothing)
        summary = (
            f"captioner {cfg.encoder} + {cfg.arch} | data {data.name}, vocabulary {data.vocab.size} words, "
            f"grid {'x'.join(map(str, cfg.grid))}"
        )
        return TrainingRun("captioner", cfg, task, {"data_spec": spec, "data_opts": opts}, summary, notes=[data.note])

    def finish(self, o, run, trainer, result) -> list[str]:
        lines = super().finish(o, run, trainer, result)
        data = run.task.data
        model = trainer.model.eval()
        images = data.images["test"][:3]
        hyps = caption_images(model, data.vocab, images, {"mean": data.mean, "std": data.std}, device=trainer.device)
        for h, refs in zip(hyps, data.captions["test"][:3]):
            lines.append(f"  test image: {h!r}  (reference: {refs[0]!r})")
        return lines

    # ---- caption, eval, inspect ---------------------------------------------------------------------
    def commands(self) -> list[Command]:
        return [
            Command(
                "caption",
                "caption image files with a trained captioner",
                "Prints one caption per image: `path: caption`.",
                caption_command,
                verbs=(CaptionerVerbs.caption,),
            )
        ]

    def evaluate(
        self,
        model,
        on: Evaluation,
        *,
        beam: Beam = 1,
        alpha: LengthPenalty = 1.0,
    ) -> tuple[dict, str]:
        res = evaluate_captioner(
            model,
            split=on.split or "test",
            beam=beam,
            alpha=alpha,
            data=on.data,
            batch_size=max(on.batch_size, 64),
            max_images=on.max_batches * on.batch_size if on.max_batches else None,
        )
        b = res["bleu"]
        line = (
            f"{res['data']} [{res['split']}], {res['images']} images: BLEU-1..4 "
            f"{b[0]:.1f} / {b[1]:.1f} / {b[2]:.1f} / {b[3]:.1f} ({res['bleu_signature']}), exact captions "
            f"{res['exact']:.3f}, word perplexity {res['perplexity']:.2f}"
        )
        if res.get("pointing") is not None:
            by = res["pointing_by_word"]
            line += (
                f", pointing game {res['pointing']:.3f} over the words naming {res['pointing_objects']} "
                f"objects (size {by['size']:.3f}, colour {by['colour']:.3f}, shape {by['shape']:.3f})"
            )
        return res, line

    def inspect(self, model, what: str, out: Path, o: CaptionInspection) -> dict:
        import numpy as np

        from ..inspect.plots import caption_attention_png

        if not o.image:
            raise ValueError(f"inspect {what} needs --image FILE (the image to caption)")
        vocab, meta, dev = model.vocab, model.run_meta, model.device
        if model.config.arch == "rnn" and what in ("caption", "attention"):
            raise ValueError(
                "this captioner has no attention (--arch rnn): it reads the image once, through h0, so "
                "there is no per-word attention to draw; train --arch rnn-attention or transformer (or inspect "
                "attribution: which pixels each word came from)"
            )
        img = read_image(o.image, 3, model.config.image_size)
        if what == "attribution":
            if o.baseline not in (None, "zeros"):
                raise OptionError("a captioner's attributions start from the mean image: drop --baseline")
            words, pixels = word_attributions(model, vocab, meta, img[None], o.method, o.steps)
            maps = pixels.abs()
            maps = maps / maps.flatten(1).amax(1).clamp_min(1e-12)[:, None, None]  # each word on its own scale
            title = f"{' '.join(words)}  ({o.method.replace('_', ' ')}, |attribution| per word)"
            caption_attention_png(img, words, maps.numpy(), out, title=title)
            return {"words": np.array(words), "attribution": pixels.numpy()}
        ids = caption_ids(model, img[None], meta, dev)[0]
        words = [vocab.tokenizer.id_to_token(i) for i in ids] + ["<eos>"]
        att, per_head = word_attention(model, img[None], meta, [ids])
        caption_attention_png(img, words, att[0][: len(words)].numpy(), out, title=" ".join(words[:-1]))
        raw = {"words": np.array(words), "attention": att[0][: len(words)].numpy()}
        if per_head is not None:
            raw["attention_per_head"] = per_head[0][:, : len(words)].numpy()
        return raw


# ---- the pieces, usable from Python ------------------------------------------------------------------
def caption_ids(
    model, images, meta, device="cpu", *, beam: int = 1, alpha: float = 1.0, batch_size: int = 64
) -> list[list[int]]:
    """Word ids of the generated caption of each image ((N, 3, H, W) in [0, 1]), without specials."""
    from ..data.images import normalize
    from ..generate.beam import decode

    out = []
    max_len = model.config.context - 1
    for i in range(0, len(images), batch_size):
        x = normalize(images[i : i + batch_size], meta["mean"], meta["std"]).to(device)
        out += decode(model, x, None, beam=beam, max_len=max_len, alpha=alpha)
    return out


def caption_images(model, vocab, images, meta, device="cpu", **kw) -> list[str]:
    return [vocab.decode(ids) for ids in caption_ids(model, images, meta, device, **kw)]


def word_attributions(model, vocab, meta, image, method: str, steps: int):
    """(the words of the greedy caption of ``image`` (1, 3, H, W) in [0, 1], their pixel
    attributions (n_words, H, W)); an empty caption is refused (no word to explain)."""
    from ..data.images import normalize
    from ..inspect.attribution import caption_attributions

    device = next(model.parameters()).device
    ids = caption_ids(model, image, meta, device)[0]
    if not ids:
        raise ValueError("the model writes an empty caption for this image: no word to explain")
    x = normalize(image, meta["mean"], meta["std"]).to(device)
    res = caption_attributions(model, x, ids, method=method, steps=steps)
    return [vocab.tokenizer.id_to_token(i) for i in ids], res["pixels"].cpu()


def word_attention(model, images, meta, captions: list[list[int]]):
    """Each caption's attention over the image grid while it is written: (B, T, h, w) with row t
    for the step that writes word t (the last row writes <eos>), and for the Transformer the last
    layer's cross-attention per head (B, H, T, h, w), else None. Captions are word ids without specials."""
    import torch

    from ..data.images import normalize
    from ..data.parallel import pad_batch

    x = normalize(images, meta["mean"], meta["std"]).to(next(model.parameters()).device)
    tgt_in, _ = pad_batch([[model.config.bos_id] + c for c in captions], model.config.pad_id)
    tgt_in = tgt_in.to(x.device)
    h, w = model.grid
    if model.config.arch == "rnn":
        raise ValueError("this captioner has no attention (arch rnn)")
    # the decoder's attention over the grid: the RNN's per step (B, 1, T, N), or each Transformer
    # block's cross-attention (B, H, T, N), of which the last block's is shown
    names = "decoder.blocks.*.cross_attn.hook_pattern" if model.config.arch == "transformer" else "attn.hook_pattern"
    with torch.no_grad():
        _, cache = model.run_with_cache(x, tgt_in, names=names)
    last = cache[list(cache)[-1]]
    per_head = last.reshape(*last.shape[:3], h, w).cpu()
    return per_head.mean(1), (per_head if model.config.arch == "transformer" else None)


def evaluate_captioner(
    model,
    *,
    split: str = "test",
    beam: int = 1,
    alpha: float = 1.0,
    data: str | None = None,
    batch_size: int = 64,
    max_images: int | None = None,
) -> dict:
    """Generated (not teacher-forced) captions of a split (its first ``max_images``), scored against every reference:
    corpus BLEU-1…4 (sacreBLEU, 0–100), the share of captions equal to a reference, the word
    perplexity under teacher forcing, and on scenes the pointing game and the scores by the
    number of objects."""
    import math

    import sacrebleu

    from ..data.captions import load_captions

    vocab, meta, dev = model.vocab, model.run_meta, model.device
    spec = data or meta.get("data_spec")
    ds = load_captions(
        spec,
        image_size=model.config.image_size,
        vocab=meta["vocab"],
        **(meta.get("data_opts", SCENE_OPTS) if spec in (None, "scenes") else {}),
    )
    if split not in ds.images:
        raise ValueError(f"{ds.name} has no {split} split; use train, val or test")
    images, refs = ds.images[split][:max_images], ds.captions[split][:max_images]
    ids = caption_ids(model, images, meta, dev, beam=beam, alpha=alpha, batch_size=batch_size)
    hyps = [vocab.decode(i) for i in ids]
    norm_refs = [[" ".join(vocab.tokenizer.tokens(r)) for r in rs] for rs in refs]  # as the model writes them
    streams = [[rs[k] if k < len(rs) else None for rs in norm_refs] for k in range(max(map(len, norm_refs)))]
    bleus = [sacrebleu.BLEU(max_ngram_order=n) for n in (1, 2, 3, 4)]
    exact = [h in rs for h, rs in zip(hyps, norm_refs)]
    loss = _teacher_forced_loss(model, images, ds.encoded[split], meta, dev, batch_size)
    res = {
        "data": ds.name,
        "split": split,
        "images": len(hyps),
        "beam": beam,
        "bleu": [b.corpus_score(hyps, streams).score for b in bleus],
        "bleu_signature": str(bleus[3].get_signature()),
        "exact": sum(exact) / len(exact),
        "loss": loss,
        "perplexity": math.exp(loss),
        "examples": list(zip(hyps[:5], refs[:5])),
    }
    objects = (ds.objects.get(split) or [])[: len(images)]
    if objects:
        by_count = {}
        # per caption, for intervals over the test images (two captioners scored on the same images pair up)
        sentence = sacrebleu.BLEU(max_ngram_order=4, effective_order=True)
        named = [objects_named(h, o) for h, o in zip(hyps, objects)]
        for k in sorted({len(o) for o in objects}):
            sel = [i for i, o in enumerate(objects) if len(o) == k]
            by_count[k] = {
                "images": len(sel),
                "exact": sum(exact[i] for i in sel) / len(sel),
                "bleu4": bleus[3].corpus_score([hyps[i] for i in sel], [[s[i] for i in sel] for s in streams]).score,
                "sentence_bleu4": [sentence.sentence_score(hyps[i], norm_refs[i]).score for i in sel],
                "objects_named": [named[i] for i in sel],
            }
        res["by_objects"] = by_count
        res["pointing"], res["pointing_by_word"], res["pointing_objects"] = None, None, 0
        res["pointing_chance_by_word"] = None
        res["pointing_random_object_by_word"] = res["pointing_leads_by_word"] = None
        if model.config.arch != "rnn":
            res.update(_pointing_game(model, vocab, images, ids, objects, meta, batch_size))
    return res


def _teacher_forced_loss(model, images, encoded, meta: dict, dev, batch_size: int) -> float:
    """The mean cross-entropy per word under teacher forcing, over every reference caption of
    every image (``encoded``: each image's references as token ids)."""
    import torch

    from ..data.images import normalize
    from ..data.parallel import pad_batch
    from ..losses import cross_entropy

    c = model.config
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(images), batch_size):
            pairs = [(j, e) for j in range(i, min(i + batch_size, len(images))) for e in encoded[j]]
            x = normalize(images[[j for j, _ in pairs]], meta["mean"], meta["std"]).to(dev)
            tin, _ = pad_batch([[c.bos_id] + e[: c.context - 1] for _, e in pairs], c.pad_id)
            tout, _ = pad_batch([e[: c.context - 1] + [c.eos_id] for _, e in pairs], c.pad_id)
            total += cross_entropy(model(x, tin.to(dev)), tout.to(dev), ignore_index=c.pad_id, reduction="sum").item()
            count += int((tout != c.pad_id).sum())
    return total / count


def _pointing_game(model, vocab, images, ids, objects, meta: dict, batch_size: int) -> dict:
    """The pointing game on scenes: for every word of a caption that names an object (its size,
    colour, shape), whether the attention's peak while writing it falls in that object's box;
    against a random cell's and a random object's hit rates on the same words."""
    from ..inspect.analysis import pointing_chance, pointing_hit, shuffled_pointing_hits

    size = model.config.image_size
    hits: dict[str, list[bool]] = {"size": [], "colour": [], "shape": []}
    chance: dict[str, list[float]] = {k: [] for k in hits}
    random_object: dict[str, list[float]] = {k: [] for k in hits}  # one of the scene's objects at random
    grids: dict[str, list] = {k: [] for k in hits}  # each word's attention map, and its object's box
    boxes: dict[str, list] = {k: [] for k in hits}
    for i in range(0, len(images), batch_size):
        att, _ = word_attention(model, images[i : i + batch_size], meta, ids[i : i + batch_size])
        for j, cap in enumerate(ids[i : i + batch_size]):
            for kind, step, obj in object_words(vocab, cap, objects[i + j]):
                grid = att[j][step]
                hits[kind].append(pointing_hit(grid, obj.box, size))
                chance[kind].append(pointing_chance(tuple(grid.shape), obj.box, size))
                random_object[kind].append(1 / len(objects[i + j]))
                grids[kind].append(grid)
                boxes[kind].append(obj.box)
    if not hits["shape"]:
        return {}
    # the same captioner's attention shuffled: each word scored with another word's map (of the same
    # kind, drawn by a fixed permutation, nearly always another image's): a pointer with the model's own
    # habits (where in the frame it tends to look) but not looking at this image
    shuffled = {kind: shuffled_pointing_hits(maps, boxes[kind], size) for kind, maps in grids.items()}
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    every = hits["size"] + hits["colour"] + hits["shape"]
    return {
        "pointing": mean(every),  # over every word that names an object
        "pointing_by_word": {k: mean(v) for k, v in hits.items()},
        # a random cell's hit rate on the same words: what the pointing is measured against
        "pointing_chance_by_word": {k: mean(v) for k, v in chance.items() if v},
        "pointing_random_object_by_word": {k: mean(v) for k, v in random_object.items() if v},
        # per word, the pointing's lead over the random-object pointer and the random cell's (for
        # intervals over the words: reproduce's alignment claim)
        "pointing_leads_by_word": {
            k: {
                "attention": [float(h) - r for h, r in zip(hits[k], random_object[k])],
                "random_cell": [c - r for c, r in zip(chance[k], random_object[k])],
                "shuffled": [float(h) - r for h, r in zip(shuffled[k], random_object[k])],
            }
            for k in hits
            if hits[k]
        },
        "pointing_objects": len(hits["shape"]),
    }


def objects_named(caption: str, objects) -> float:
    """The share of a scene's ``objects`` that a generated ``caption`` names whole ("a small red
    circle": size, colour and shape together), in any order: what a caption gets right object by
    object, where BLEU also rewards the grammar's words ("a", ",", "and", "to the left of"), which
    every caption of that many objects shares."""
    words = f" {caption} "
    return sum(f" {o.phrase} " in words for o in objects) / len(objects)


def object_words(vocab, ids: list[int], objects) -> list[tuple[str, int, object]]:
    """The words of one generated caption that name an object, for the pointing game: (kind, step,
    the object) for the size, colour and shape word of each "a small red circle" whose object the
    scene holds (scenes never repeat both colour and shape; a named object that is not there has
    nothing to point at and is left out)."""
    from ..data.captions import COLORS, SHAPES, SIZES

    words = [vocab.tokenizer.id_to_token(i) for i in ids]
    out = []
    for t, word in enumerate(words):
        if word not in SHAPES or t < 2 or words[t - 1] not in COLORS or words[t - 2] not in SIZES:
            continue
        obj = next((o for o in objects if o.shape == word and o.color == words[t - 1]), None)
        if obj is not None:
            out += [("size", t - 2, obj), ("colour", t - 1, obj), ("shape", t, obj)]
    return out


def caption_command(
    ckpt: Annotated[str, Arg("run folder of a captioner")],
    images: Annotated[
        list[str], Arg("image files (PNG, JPEG, ...) or folders of them", flags=("images",), nargs="+", metavar="IMAGE")
    ],
    *,
    device: Device = "auto",
    **options: Any,
) -> int:
    """``attnlab caption``: one caption per image (``options``: :meth:`CaptionerVerbs.caption`'s)."""
    from ..data.captions import image_files

    model = CaptionRecipe.model_of(ckpt, device)
    for path in image_files(images):
        print(f"{path}: {model.caption(read_image(path, 3, model.config.image_size), **options)}", flush=True)
    return 0
