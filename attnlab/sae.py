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
from typing import TYPE_CHECKING, Annotated, Any, Literal

from .errors import OptionError
from .options import Arg, checked, nonneg_float, nonneg_int, positive_float, positive_int

if TYPE_CHECKING:
    from .inspect.sae import SAEConfig, SparseAutoencoder

__all__ = ["train", "evaluate", "features", "write_features", "load", "SAERun", "SparseAutoencoder", "SAEConfig"]


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


Data = Annotated[str | None, Arg("read this text instead of the run's own")]


@checked
def train(
    model_or_path: Any,
    hook: Annotated[str, Arg("the hook point to read, e.g. blocks.1.hook_resid_post")],
    *,
    data: Data = None,
    kind: Annotated[Literal["relu", "topk"], Arg("relu: an L1 penalty; topk: k latents per token")] = "relu",
    latents: Annotated[int | None, Arg("dictionary size (default: --expansion x the width)", positive_int)] = None,
    expansion: Annotated[int, Arg("latents per activation dimension", positive_int)] = 8,
    k: Annotated[int, Arg("topk: latents active per token", positive_int)] = 32,
    l1_coefficient: Annotated[float, Arg("relu: the L1 coefficient", nonneg_float, flags=("--l1",))] = 2.0,
    steps: Annotated[int, Arg("training steps", positive_int)] = 2000,
    batch_tokens: Annotated[int, Arg("activations per step", positive_int)] = 1024,
    lr: Annotated[float, Arg("Adam's learning rate", positive_float)] = 4e-4,
    resamples: Annotated[int, Arg("relu: times dead latents are resampled", nonneg_int)] = 3,
    grad_clip: Annotated[
        float,
        Arg("clip the gradient's norm at this every step (SAELens's SAETrainer: 1; 0: no clipping)", nonneg_float),
    ] = 0.0,
    seed: Annotated[int, Arg("random seed", nonneg_int)] = 0,
    out: Annotated[str | Path | None, Arg("folder for sae.safetensors, sae.json and metrics.json")] = None,
    progress: bool = True,
) -> SAERun:
    """Train a ``kind`` SAE ("relu": L1 penalty at ``l1_coefficient``; "topk": ``k`` latents per
    token) of ``latents`` (default ``expansion`` × the activation width) on the activations at
    ``hook`` of the GPT ``model_or_path``, over its run's training text (or ``data``); evaluate
    it on the validation text; save it to ``out`` (sae.safetensors, sae.json, metrics.json) when
    given."""
    from .inspect import sae as method
    from .inspect.sae import SAEConfig, SAETraining

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


@checked
def evaluate(model_or_path: Any, sae: SparseAutoencoder, *, data: Data = None, batches: int = 8) -> dict:
    """:func:`attnlab.inspect.sae.evaluate` on the model's validation text (or ``data``)."""
    from .inspect import sae as method

    model = _model(model_or_path)
    return method.evaluate(model, sae.to(model.device), _source(model, "val", data), batches=batches)


@checked
def features(
    model_or_path: Any,
    sae: SparseAutoencoder,
    *,
    latents: list[int] | None = None,
    count: Annotated[int, Arg("latents shown without --latents", positive_int)] = 24,
    data: Data = None,
) -> list[dict]:
    """:func:`attnlab.inspect.sae.features` on the model's validation text (or ``data``); for a ViT,
    :func:`attnlab.inspect.sae.image_features` on its test images."""
    from .inspect import sae as method

    model = _model(model_or_path)
    if _is_image_classifier(model):
        (images, _), _ = _images(model, "test", data)
        return method.image_features(model, sae.to(model.device), images, model.labels, latents=latents, count=count)
    _, ids = model.corpus_ids("val", data)
    tok = model.tokenizer
    return method.features(model, sae.to(model.device), ids, lambda i: tok.decode([i]), latents=latents, count=count)


def write_features(model_or_path: Any, sae: SparseAutoencoder, path: str | Path, **kw: Any) -> Path:
    """The feature pages of :func:`features` as one offline HTML file."""
    from .inspect import sae as method
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
    from .inspect.sae import load_sae

    return load_sae(folder, device)[0]


def __getattr__(name: str) -> object:
    """``SparseAutoencoder`` and ``SAEConfig``, imported with torch when first used."""
    if name in ("SparseAutoencoder", "SAEConfig"):
        from .inspect import sae as method

        return getattr(method, name)
    raise AttributeError(f"module 'attnlab.sae' has no attribute {name!r}")
