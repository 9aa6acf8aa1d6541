"""What every image classifier family shares (ViT, CNN): image data, augmentation, the
classification task, `eval` (accuracy + confusion matrix), `predict`, and CKA between models."""

from __future__ import annotations

from pathlib import Path
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Literal


from ..errors import CheckpointError, DataError, OptionError, a
from ..options import at_least, below_one, nonneg_int, number
from ..options import (
    ATTRIBUTION_METHOD,
    ATTRIBUTION_STEPS,
    Arg,
    AttributionMethod,
    AttributionSteps,
    PatchOver,
    checked,
)
from .base import (
    read_image,
    TINY_RUN,
    Attribution,
    TrainOptions,
    ImageInspection,
    TopK,
    Recipe,
    TrainingRun,
    Verbs,
    ConfusionPNG,
    Evaluation,
    confusion_figure,
    top_labels,
)
from ..outputs import output_file

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass(frozen=True)
class ImageTrainOptions(TrainOptions):
    """An image classifier family's own options of ``attnlab train``: its images, start and augmentation."""

    data: Annotated[str | None, Arg("digits (embedded, default) | mnist | cifar10 | FOLDER")] = None
    init: Annotated[
        str | None,
        Arg(
            "fine-tune: start from this classifier of the same family (an attnlab run, or a HuggingFace ViT "
            "folder), keeping its shape; a new head when the data's classes differ"
        ),
    ] = None
    freeze: Annotated[bool, Arg("with --init: train the classification head only, the body frozen")] = False
    label_smoothing: Annotated[
        float | None, Arg("label smoothing of the loss (default: 0, ViT on digits and mnist 0.1)", below_one)
    ] = None
    pad: Annotated[
        int | None, Arg("random-crop padding in pixels (default: image size / 8; 0 below 16 px)", nonneg_int)
    ] = None
    flip: Annotated[bool | None, Arg("random horizontal flips (default: on for cifar10, off for digits/mnist)")] = None
    rotate: Annotated[
        float | None,
        Arg(
            "random rotation of ± this many degrees, with ± rotate%% scaling (default: 10 for digits/mnist, 0 for "
            "cifar10)",
            number(float, 0.0, True, 180.0, what="from 0 to 180 degrees"),
        ),
    ] = None


@dataclass(frozen=True)
class ClassifierInspection(ImageInspection, Attribution):
    """The options of an image classifier's inspections."""

    target: Annotated[str | None, Arg("attribution: the class to explain (default: the predicted one)")] = None
    compare: Annotated[str | None, Arg("cka: a second run folder (e.g. the CNN baseline)")] = None
    kernel: Annotated[Literal["linear", "rbf"], Arg("cka kernel")] = "linear"
    n_images: Annotated[int, Arg("distance/cka: test images to use", at_least(4))] = 512
    batch_size: Annotated[int, Arg("cka: minibatch size", at_least(4))] = 128


class ImageClassifierVerbs(Verbs):
    """An image classifier loaded by :func:`attnlab.load`: ``labels``, ``mean``/``std`` and ``predict``."""

    def attach(self, meta: dict) -> None:
        c = self.config
        self.mean, self.std = meta.get("mean", [0.5] * c.in_chans), meta.get("std", [0.5] * c.in_chans)
        self.labels = class_labels(c)

    @checked
    def predict(self, images, top_k: TopK = 3):
        """The ``top_k`` (label, probability) pairs of each image (a file path, a list of them, or
        images in [0, 1] as a (C, H, W) or (N, C, H, W) tensor): a list per image, or one list for one image."""
        import torch

        from ..data.images import images_argument, normalize

        top_labels(torch.zeros(1, 1), [""], top_k)  # a bad top_k fails before any image is read
        x, single = images_argument(images, self.config.in_chans, self.config.image_size)
        with torch.no_grad():
            probs = self(normalize(x, self.mean, self.std).to(self.device)).float().softmax(-1).cpu()
        out = top_labels(probs, self.labels, top_k)
        return out[0] if single else out

    def label_index(self, label, what: str) -> int:
        """The class index of ``label`` (a label name, or an index as text), or a one-line error."""
        return class_index(self.labels, label, what)

    @checked
    def attribute(
        self,
        image,
        target=None,
        *,
        method: AttributionMethod = ATTRIBUTION_METHOD,
        steps: AttributionSteps = ATTRIBUTION_STEPS,
        baseline: str | None = None,
    ) -> dict:
        """Which pixels of ``image`` (a file, or a (C, H, W) tensor in [0, 1]) raise the logit of
        class ``target`` (a label; default: the predicted class), :mod:`attnlab.inspect.attribution`:
        {"target": label, "pixels": (H, W) summed over channels, "delta": completeness gap or None,
        "rollout": the class-specific gradient-weighted rollout (gh, gw) of a class-token ViT, else None}.
        ``baseline``: "zeros" or None (the dataset's mean image) or "blur" (the image blurred)."""
        return image_attribution(
            self, self.labels, self.mean, self.std, image, target, method=method, steps=steps, baseline=baseline
        )

    @checked
    def patch(self, clean, corrupt, answer, wrong=None, *, over: PatchOver = "resid_pre"):
        """Activation patching between two images (files or (C, H, W) tensors in [0, 1]): how much
        of the clean image's preference for class ``answer`` (over ``wrong``, or its
        log-probability) each layer x token (``over="resid_pre"``; token 0 is the class token) or
        layer x head restores in the corrupted image's run. Returns {"restored", "tokens", "over"}."""
        from ..data.images import images_argument, normalize
        from ..inspect.patching import by_position, logit_difference, patch_activations, patching_span

        if not hasattr(self, "encoder"):
            raise OptionError(f"{type(self).__name__} has no attention blocks to patch; patching reads ViTs")
        c = self.config
        images = [
            normalize(images_argument(x, c.in_chans, c.image_size)[0][:1], self.mean, self.std).to(self.device)
            for x in (clean, corrupt)
        ]
        metric = logit_difference(
            self.label_index(answer, "answer"), None if wrong is None else self.label_index(wrong, "wrong")
        )
        restored = patch_activations(self, (images[0],), (images[1],), metric, over=over)
        tokens = ["cls"] * self.n_prefix + [f"p{i}" for i in range(restored.shape[1] - self.n_prefix)]
        span = patching_span(self, (images[0],), (images[1],), metric)
        return {"restored": restored, "tokens": tokens if by_position(over) else None, "over": over, **span}


class ImageClassifierRecipe(Recipe):
    """Base of the image classifier recipes; a subclass says how to build its model config
    (:meth:`new_config`)."""

    ablatable = True

    train_options: type = ImageTrainOptions
    inspect_options: type = ClassifierInspection
    needs = "an image classifier (attnlab train vit or cnn, or a HuggingFace ViT folder)"
    tiny = dict(TINY_RUN)

    set_by_data = ("num_classes", "in_chans", "labels")
    follows_data = ("image_size",)
    train_defaults = replace(
        Recipe.train_defaults,
        batch_size=128,
        lr=1e-3,
        min_lr=1e-5,
        warmup_iters=100,
        max_iters=2000,
        weight_decay=0.05,
        beta2=0.999,
        eval_interval=250,
        eval_iters=5,
    )
    LABEL_SMOOTHING: dict[str, float] = {}  # the default per dataset, where it is not 0
    inspections = {
        "cka": "centred kernel alignment between every pair of layers (--compare another run)",
        "attribution": "which pixels of --image raise the logit of --target (--method; ViTs: gradient-weighted rollout)",
    }

    @property
    def description(self) -> str:
        return (
            f"Train {self.help} on digits (embedded, default), mnist, cifar10 or a folder with one sub-folder "
            "per class."
        )

    def new_config(self, o, splits, model_over: dict):
        raise NotImplementedError

    @classmethod
    def model_types(cls) -> tuple[str, ...]:
        """Every image classifier's (a run fine-tuned, or compared by CKA, may be of another family)."""
        from . import recipes

        return tuple(t for r in recipes() if isinstance(r, ImageClassifierRecipe) for t in r.models)

    def check_new(self, o, model_over) -> None:
        if o.freeze and not o.init:
            raise ValueError("--freeze keeps a pretrained body fixed; give the model to start from with --init")
        shape = sorted(k for k in model_over if k != "dropout")
        if o.init and shape:
            raise ValueError(
                f"--init fixes the model's shape; drop {', '.join('--' + k.replace('_', '-') for k in shape)}"
            )

    def run_options(self, o, saved):
        return {"data": (o.data, saved.get("data_spec"))}

    def init_from(self, o, splits, model_over):
        """(model type, config, weights to load) of a run fine-tuned from ``--init``: the pretrained
        shape, with this data's classes; the old head dropped when the classes differ."""
        pretrained = self.model_of(o.init, "cpu")
        mtype = pretrained.model_type
        if mtype not in self.models:
            raise ValueError(f"--init {o.init} holds {a(mtype)} model; fine-tune it with attnlab train {mtype}")
        base = pretrained.config
        c, h, _ = splits.shape
        if (base.in_chans, base.image_size) != (c, h):
            raise DataError(
                f"--init {o.init} reads {base.in_chans}x{base.image_size}x{base.image_size} images, "
                f"{splits.name} holds {c}x{h}x{h}: fine-tune on images of the pretrained size"
            )
        labels = list(splits.labels)
        cfg = type(base)(**{**base.to_dict(), **model_over, "num_classes": len(labels), "labels": labels})
        state = pretrained.state_dict()
        if list(base.labels or []) != labels:  # other classes: a new head, trained from zero
            state = {k: v for k, v in state.items() if not k.startswith("head.")}
        return mtype, cfg, state

    def prepare(self, o, saved, model_over, tcfg, out):
        from ..data.images import load_images

        spec = (saved.get("data_spec") if saved else o.data) or "digits"
        splits = load_images(spec, o.data_dir)
        c, h, w = splits.shape
        if h != w:
            raise DataError(f"images are {h}x{w}; attnlab's classifiers expect square images")
        init_state = None
        if saved:
            mtype = saved["model_type"]
            cfg = self.models[mtype].config_class.from_dict(saved["model"])
        elif o.init:
            mtype, cfg, init_state = self.init_from(o, splits, model_over)
        else:
            mtype, cfg = self.new_config(o, splits, model_over)
        if cfg.image_size != h:
            raise DataError(
                f"the images of {splits.name} are {h}x{w}, but the model takes {cfg.image_size}x"
                f"{cfg.image_size}; drop --image-size (it follows the data) or resize the images"
            )
        task = self.image_task(
            splits,
            tcfg.batch_size,
            pad=o.pad,
            flip=o.flip,
            rotate=o.rotate,
            label_smoothing=o.label_smoothing,
        )
        freeze = bool(saved.get("freeze", False)) if saved else bool(o.freeze)

        def setup(model) -> None:
            if init_state is not None:
                missing, unexpected = model.load_state_dict(init_state, strict=False)
                if unexpected or [k for k in missing if not k.startswith("head.")]:
                    raise CheckpointError(
                        f"--init {o.init} does not fit: missing {missing[:3]}, unexpected {unexpected[:3]}"
                    )
            if freeze:  # (a resumed run stays frozen: the flag is saved with it)
                for name, p in model.named_parameters():
                    p.requires_grad_(name.startswith("head."))

        meta = {"data_spec": spec, **({"init": str(o.init)} if init_state is not None else {})}
        if freeze:
            meta["freeze"] = True
        summary = f"{mtype.upper()} | data {splits.name} {c}x{h}x{w}" + (
            f" | from {o.init}" + (", body frozen" if freeze else "") if init_state is not None else ""
        )
        return TrainingRun(mtype, cfg, task, meta, summary, setup, [splits.note])

    def image_task(self, splits, batch_size: int, *, pad=None, flip=None, rotate=None, label_smoothing=None, like=None):
        """The classification task of ``splits`` with this family's augmentation and loss: an option
        left None takes the family's default for the data (``--pad``, ``--flip``, ``--rotate``,
        ``--label-smoothing``), or for the dataset named ``like``; `attnlab train` and the claims of
        `attnlab reproduce` build it here."""
        from ..training.tasks import ImageClassificationTask

        h, name = splits.shape[1], like or splits.name
        flip = flip if flip is not None else name == "cifar10"
        # on 8x8 digits a one-pixel shift is an eighth of the image: the ViT was a point more
        # accurate without it on each of three seeds (benchmarks/README.md, ViT)
        pad = pad if pad is not None else (0 if h < 16 else max(1, h // 8))
        rotate = rotate if rotate is not None else (0.0 if name == "cifar10" else 10.0)
        smoothing = label_smoothing if label_smoothing is not None else self.LABEL_SMOOTHING.get(name, 0.0)
        return ImageClassificationTask(
            splits, batch_size, pad=pad, flip=flip, label_smoothing=smoothing, rotate=rotate, scale=rotate / 100
        )

    def finish(self, o, run, trainer, result) -> list[str]:
        test = run.task.evaluate(trainer.model, "test", device=trainer.device)
        return [
            f"done: step {result['step']}, {result['seconds']:.0f}s, test accuracy of the last weights "
            f"{test['accuracy']:.4f} ({test['items']} images); {trainer.checkpoints_line()}; run folder {trainer.out}"
        ]

    # ---- eval, predict -------------------------------------------------------------------------
    def evaluate(
        self,
        model,
        on: Evaluation,
        *,
        out: ConfusionPNG = None,
    ) -> tuple[dict, str]:
        from ..data.images import load_images
        from ..training.tasks import ImageClassificationTask

        out_file = output_file(out, ".png") if out else None  # (refused before any work)
        meta = model.run_meta
        spec = on.data or meta.get("data_spec") or meta.get("data")
        splits = load_images(spec, on.data_dir)
        split = on.split or "test"
        c = model.config
        if splits.shape != (c.in_chans, c.image_size, c.image_size):
            raise DataError(
                f"{splits.name} holds {'x'.join(map(str, splits.shape))} images, but the model takes "
                f"{c.in_chans}x{c.image_size}x{c.image_size}; evaluate it on data like its training data"
            )
        labels = list(c.labels or range(c.num_classes))
        if [str(v) for v in splits.labels] != [str(v) for v in labels]:
            raise DataError(
                f"{splits.name} has classes {splits.labels[:10]}, but the model was trained on "
                f"{labels[:10]}; evaluate on data with the same classes, in the same order"
            )
        # (normalised by the run's own statistics, whatever data it is evaluated on)
        task = ImageClassificationTask(splits, on.batch_size, stats=(model.mean, model.std))
        with on.within(model):
            scores = task.evaluate(
                model, split, device=model.device, batch_size=on.batch_size, max_batches=on.max_batches
            )
        res = {"data": splits.name, "split": split, "images": scores["items"], "accuracy": scores["accuracy"]}
        res["macro_f1"], res["note"] = scores["macro_f1"], splits.note
        line = f"{splits.name} [{split}], {res['images']} images: accuracy {res['accuracy']:.4f}"
        return res, line + confusion_figure(scores, splits.labels, f"{splits.name} {split}", out_file, res)

    def predict(self, ckpt, inputs: list[str], *, top_k: int, device: str) -> int:
        return predict(ckpt, inputs, top_k=top_k, device=device)

    # ---- inspect -------------------------------------------------------------------------------
    def inspect(self, model, what: str, out: Path, o: ClassifierInspection) -> dict[str, np.ndarray]:
        """Draw ``what`` to ``out``; return the numbers behind it."""
        if what == "attribution":
            from ..inspect.plots import maps_png

            img, _ = one_image(o.image, what, model)
            labels = class_labels(model.config)
            res = image_attribution(
                model,
                labels,
                model.mean,
                model.std,
                img,
                o.target,
                method=o.method,
                steps=o.steps,
                baseline=o.baseline,
            )
            maps = {o.method.replace("_", " "): res["pixels"].abs()}
            if res["rollout"] is not None:
                maps["gradient-weighted rollout"] = res["rollout"]
            gap = "" if res["delta"] is None else f" (completeness gap {float(res['delta']):+.3f})"
            maps_png(img, maps, out, title=f"why class {res['target']!r}{gap}")
            return {k.replace(" ", "_"): v.numpy() for k, v in maps.items()}
        return cka(model, out, o)


def class_labels(config) -> list[str]:
    """A classifier's class names: its labels, or the class indices as text when it has none."""
    return list(config.labels or [str(i) for i in range(config.num_classes)])


def class_index(labels: list[str], label, what: str) -> int:
    """The index of ``label`` among ``labels``, or a one-line error naming the classes."""
    if str(label) not in labels:
        raise OptionError(f"{what} {label!r} is not a class of this model ({', '.join(labels[:12])})")
    return labels.index(str(label))


def image_attribution(
    model, labels, mean, std, image, target=None, *, method: str, steps: int, baseline: str | None
) -> dict:
    """What :meth:`ImageClassifierVerbs.attribute` returns, for any image classifier ``model``."""
    import torch

    from ..data.images import images_argument, normalize
    from ..inspect.attribution import gradient_rollout, image_attributions

    c = model.config
    x = normalize(images_argument(image, c.in_chans, c.image_size)[0][:1], mean, std)
    x = x.to(next(model.parameters()).device)
    if target is None:
        with torch.no_grad():
            index = int(model(x)[0].argmax())
    else:
        index = class_index(labels, target, "target")
    res = image_attributions(model, x, index, method=method, steps=steps, baseline=baseline or "zeros")
    rollout = None
    if getattr(model, "model_type", None) == "vit" and c.pool == "cls":
        rollout = gradient_rollout(model, x, index)[0].cpu()
    delta = None if res["delta"] is None else float(res["delta"][0])
    return {"target": labels[index], "pixels": res["pixels"][0].cpu(), "delta": delta, "rollout": rollout}


def one_image(image: str | None, what: str, model):
    """(the image in [0, 1], the normalised batch of one) from --image."""
    from ..data.images import normalize

    if not image:
        raise ValueError(f"inspect {what} needs --image FILE (the image to look at)")
    x = read_image(image, model.config.in_chans, model.config.image_size)
    return x, normalize(x[None], model.mean, model.std)


def test_images(model, n: int, data_dir: str | None = None) -> torch.Tensor:
    """The first ``n`` test images of ``model``'s run's data, normalised as in training."""
    from ..data.images import load_images, normalize

    meta = model.run_meta
    splits = load_images(meta.get("data_spec") or meta.get("data"), data_dir)
    return normalize(splits.test[0][:n], model.mean, model.std)


def predict(ckpt, inputs: list[str], *, top_k: int, device: str) -> int:
    """``attnlab predict``: the top-k classes of each image."""
    import torch

    from ..data.images import normalize

    model = ImageClassifierRecipe.model_of(ckpt, device)
    c, dev = model.config, model.device
    labels = class_labels(c)
    for path in inputs:
        x = read_image(path, c.in_chans, c.image_size)
        with torch.no_grad():
            probs = model(normalize(x[None], model.mean, model.std).to(dev)).softmax(-1)[0].cpu()
        top = probs.topk(min(top_k, len(probs)))
        shown = ", ".join(f"{labels[i]} {p:.3f}" for p, i in zip(top.values.tolist(), top.indices.tolist()))
        print(f"{path}: {shown}")
    return 0


def cka(model, out: Path, o: ClassifierInspection) -> dict[str, np.ndarray]:
    """CKA between every layer of ``model`` (and of ``--compare``), on test images."""
    import numpy as np
    import torch

    from ..data.images import denormalize, normalize
    from ..inspect import analysis as A
    from ..inspect import plots as P
    from ..inspect.capture import capture_features

    other = None
    if o.compare:
        other = ImageClassifierRecipe.model_of(o.compare, "cpu")
        if (other.config.image_size, other.config.in_chans) != (model.config.image_size, model.config.in_chans):
            raise ValueError("--compare model takes images of another size or channel count; CKA needs the same inputs")
    x = test_images(model, o.n_images, o.data_dir)
    names_a = names_b = None
    mb = None
    full_a, full_b = [], []
    for i in range(0, len(x), o.batch_size):
        xb = x[i : i + o.batch_size]
        if len(xb) < 4:
            break
        with capture_features(model) as fa, torch.no_grad():
            model(xb)
        fb = fa
        if other is not None:  # the same images, normalised as the other model was trained
            xb_b = normalize(denormalize(xb, model.mean, model.std), other.mean, other.std)
            with capture_features(other) as fb, torch.no_grad():
                other(xb_b)
        names_a, names_b = list(fa), list(fb)
        if o.kernel == "linear":
            mb = mb or A.MinibatchCKA(len(names_a), len(names_b))
            mb.update([fa[n] for n in names_a], [fb[n] for n in names_b])
        else:
            full_a.append([fa[n] for n in names_a])
            full_b.append([fb[n] for n in names_b])
    if o.kernel == "linear":
        m = mb.compute().numpy()
    else:  # RBF CKA on all collected features at once
        fa = [torch.cat([b[j] for b in full_a]) for j in range(len(names_a))]
        fb = [torch.cat([b[j] for b in full_b]) for j in range(len(names_b))]
        m = np.array([[A.rbf_cka(a, b) for b in fb] for a in fa])
    name_a = f"{model.model_type.upper()} ({Path(model.checkpoint).name})"
    name_b = f"{other.model_type.upper()} ({Path(o.compare).name})" if other is not None else name_a
    P.cka_png(m, out, xlabel=f"{name_b} layer", ylabel=f"{name_a} layer", title=f"{o.kernel} CKA")
    return {"cka": m}
