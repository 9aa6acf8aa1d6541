"""Sparse autoencoders from Python (the command line's ``attnlab sae``); the method and its
equations are in :mod:`attnlab.inspect.sae`::

    import attnlab
    model = attnlab.load("runs/shakespeare")
    run = attnlab.sae.train(model, hook="blocks.1.hook_resid_post", kind="topk", k=16, out="runs/sae")
    run.metrics            # L0, explained variance, dead latents, next-token loss spliced / clean / zero
    pages = attnlab.sae.features(model, run.sae)          # top contexts and logit effects per latent
    attnlab.sae.write_features(model, run.sae, "features.html")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import OptionError
from .options import OptionSpecs, checked_by, nonneg_float, nonneg_int, positive_float, positive_int
from .inspect.sae import SAEConfig, SAETraining, SparseAutoencoder, load_sae
from .inspect import sae as method

__all__ = ["train", "evaluate", "features", "write_features", "load", "SAERun", "SparseAutoencoder", "SAEConfig"]


# ---- the options of `attnlab sae train | eval | features`, and the keywords of train / evaluate / features -
def train_specs() -> OptionSpecs:
    st = OptionSpecs()
    st.add("--ckpt", required=True, help="run folder of a GPT")
    st.add("--hook", required=True, help="the hook point to read, e.g. blocks.1.hook_resid_post")
    st.add("--out", required=True, help="folder for sae.safetensors, sae.json and metrics.json")
    st.add("--kind", choices=["relu", "topk"], default="relu", help="relu: an L1 penalty; topk: k latents per token")
    st.add("--latents", type=positive_int, default=None, help="dictionary size (default: --expansion x the width)")
    st.add("--expansion", type=positive_int, default=8, help="latents per activation dimension (default 8)")
    st.add("--k", type=positive_int, default=32, help="topk: latents active per token (default 32)")
    st.add("--l1", dest="l1_coefficient", type=nonneg_float, default=2.0, help="relu: the L1 coefficient (default 2)")
    st.add("--steps", type=positive_int, default=2000, help="training steps (default 2000)")
    st.add("--batch-tokens", type=positive_int, default=1024, help="activations per step (default 1024)")
    st.add("--lr", type=positive_float, default=4e-4, help="Adam's learning rate (default 4e-4)")
    st.add("--resamples", type=nonneg_int, default=3, help="relu: times dead latents are resampled (default 3)")
    st.add("--grad-clip", type=nonneg_float, default=0.0,
           help="clip the gradient's norm at this every step (SAELens's SAETrainer: 1; default 0: no clipping)")  # fmt: skip
    st.add("--seed", type=nonneg_int, default=0, help="random seed (default 0)")
    st.add("--data", default=None, help="train on this text instead of the run's own")
    st.add_device()
    return st


def eval_specs() -> OptionSpecs:
    se = OptionSpecs()
    se.add("--sae", required=True, help="folder written by attnlab sae train")
    se.add("--ckpt", default=None, help="the GPT (default: the run the SAE was trained on)")
    se.add("--data", default=None, help="evaluate on this text instead of the run's validation text")
    se.add("--json", kind="flag", help="print the metrics as one JSON object")
    se.add_device()
    return se


def features_specs() -> OptionSpecs:
    sf = OptionSpecs()
    sf.add("--sae", required=True, help="folder written by attnlab sae train")
    sf.add("--out", required=True, help="HTML file to write")
    sf.add("--ckpt", default=None, help="the GPT (default: the run the SAE was trained on)")
    sf.add("--latents", default=None, help="which latents, comma-separated (default: the --count most frequent)")
    sf.add("--count", type=positive_int, default=24, help="latents shown without --latents (default 24)")
    sf.add("--data", default=None, help="read contexts from this text instead of the run's validation text")
    sf.add_device()
    return sf


@dataclass
class SAERun:
    """A trained SAE with its metrics (:func:`evaluate`), its training records, and its folder."""

    sae: SparseAutoencoder
    metrics: dict
    history: list[dict] = field(repr=False)
    out: Path | None = None


def _model(model_or_path: Any) -> Any:
    from .api import load as load_model

    model = load_model(model_or_path) if isinstance(model_or_path, (str, Path)) else model_or_path
    if not (hasattr(model, "corpus_ids") or _is_image_classifier(model)):
        raise OptionError(
            f"sparse autoencoders read a GPT or a ViT loaded with attnlab.load; got {type(model).__name__}"
        )
    return model


def _is_image_classifier(model: Any) -> bool:
    return getattr(model, "model_type", None) == "vit" and hasattr(model, "mean")


def _source(model: Any, split: str, data: str | None = None) -> Any:
    """What the SAE reads: a GPT's token ids (its run's text, or ``data``), or a ViT's images and
    labels (its run's images: train or test split), normalised as the model reads them."""
    if not _is_image_classifier(model):
        return model.corpus_ids(split, data)[1]
    return _images(model, split, data)[0]


def _images(model: Any, split: str, data: str | None = None) -> tuple[tuple[Any, Any], Any]:
    """((normalised images, labels), raw images in [0, 1]) of an image classifier's run."""
    from .data.images import load_images, normalize

    spec = data if data is not None else (model.run_meta.get("data_spec") or model.run_meta.get("data"))
    splits = load_images(spec)
    x, y = getattr(splits, "train" if split == "train" else "test")
    return (normalize(x, model.mean, model.std), y), x


@checked_by(train_specs)
def train(
    model_or_path: Any,
    hook: str,
    *,
    data: str | None = None,
    kind: str = "relu",
    latents: int | None = None,
    expansion: int = 8,
    k: int = 32,
    l1_coefficient: float = 2.0,
    steps: int = 2000,
    batch_tokens: int = 1024,
    lr: float = 4e-4,
    resamples: int = 3,
    grad_clip: float = 0.0,
    seed: int = 0,
    out: str | Path | None = None,
    progress: bool = True,
) -> SAERun:
    """Train a ``kind`` SAE ("relu": L1 penalty at ``l1_coefficient``; "topk": ``k`` latents per
    token) of ``latents`` (default ``expansion`` × the activation width) on the activations at
    ``hook`` of the GPT ``model_or_path``, over its run's training text (or ``data``); evaluate
    it on the validation text; save it to ``out`` (sae.safetensors, sae.json, metrics.json) when
    given."""
    model = _model(model_or_path)
    method.check_hook(model, hook)
    source = _source(model, "train", data)
    _, width = method.hook_shape(model, hook, source)
    try:
        config = SAEConfig(
            d_in=width, d_sae=latents or expansion * width, kind=kind, k=k, l1_coefficient=l1_coefficient, hook=hook
        )
    except ValueError as e:
        raise OptionError(str(e)) from None
    training = SAETraining(
        steps=steps,
        batch_tokens=batch_tokens,
        lr=lr,
        resamples=resamples,
        grad_clip=grad_clip,
        seed=seed,
        log=method.print_line if progress else None,
    )
    sae, history = method.train(model, hook, source, config=config, training=training, device=model.device)
    metrics = evaluate(model, sae, data=data)
    if out is not None:
        sae.save(out, metrics, {"model": str(model.checkpoint), "data": data, "history": history})
    return SAERun(sae, metrics, history, Path(out) if out is not None else None)


@checked_by(eval_specs, unchecked=("sae",))
def evaluate(model_or_path: Any, sae: SparseAutoencoder, *, data: str | None = None, batches: int = 8) -> dict:
    """:func:`attnlab.inspect.sae.evaluate` on the model's validation text (or ``data``)."""
    model = _model(model_or_path)
    return method.evaluate(model, sae.to(model.device), _source(model, "val", data), batches=batches)


@checked_by(features_specs, unchecked=("sae", "latents"))
def features(
    model_or_path: Any,
    sae: SparseAutoencoder,
    *,
    latents: list[int] | None = None,
    count: int = 24,
    data: str | None = None,
) -> list[dict]:
    """:func:`attnlab.inspect.sae.features` on the model's validation text (or ``data``); for a ViT,
    :func:`attnlab.inspect.sae.image_features` on its test images."""
    model = _model(model_or_path)
    if _is_image_classifier(model):
        (images, _), _ = _images(model, "test", data)
        return method.image_features(model, sae.to(model.device), images, model.labels, latents=latents, count=count)
    _, ids = model.corpus_ids("val", data)
    tok = model.tokenizer
    return method.features(model, sae.to(model.device), ids, lambda i: tok.decode([i]), latents=latents, count=count)


def write_features(model_or_path: Any, sae: SparseAutoencoder, path: str | Path, **kw: Any) -> Path:
    """The feature pages of :func:`features` as one offline HTML file."""
    from .outputs import atomic_write_text

    model = _model(model_or_path)
    pages = features(model, sae, **kw)
    title = f"SAE features at {sae.config.hook}"
    if _is_image_classifier(model):
        _, pictures = _images(model, "test", kw.get("data"))
        return atomic_write_text(path, method.image_features_page(pages, pictures, model.config.patch_size, title))
    return atomic_write_text(path, method.features_page(pages, title))


def load(folder: str | Path, device: str = "cpu") -> SparseAutoencoder:
    """An SAE saved by :func:`train` (or ``attnlab sae train``)."""
    return load_sae(folder, device)[0]
