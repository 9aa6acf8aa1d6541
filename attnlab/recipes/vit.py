"""Vision Transformers: `attnlab train vit` and the ViT inspections (attention, rollout, patch
embeddings, position similarity, mean attention distance; CKA comes from the classifier base)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal


from ..errors import a
from ..models.configs import VIT_PRESETS, ViTConfig
from .base import ModelKind
from ..options import Arg, below_one, nonneg_int
from . import register
from .base import read_image
from .classifier import (
    ClassifierInspection,
    ImageClassifierRecipe,
    ImageClassifierVerbs,
    ImageTrainOptions,
    class_labels,
    one_image,
    test_images,
)

if TYPE_CHECKING:
    import numpy as np
    import torch


def preset_for(shape) -> str:
    """The preset that suits images of ``shape`` (C, H, W)."""
    c, h, _ = shape
    if h <= 8:
        return "digits"
    return "mnist" if c == 1 else "cifar"


@dataclass(frozen=True)
class ViTTrainOptions(ImageTrainOptions):
    preset: Annotated[
        Literal[tuple(sorted(VIT_PRESETS))] | None,  # type: ignore[valid-type]
        Arg("model shape (default: picked from the data: digits, mnist or cifar)"),
    ] = None


@dataclass(frozen=True)
class ViTInspection(ClassifierInspection):
    """A ViT's inspections read those of every image classifier, and which attention to draw."""

    token: Annotated[int, Arg("attention: query token to show (0 = class token)", nonneg_int)] = 0
    head_fusion: Annotated[Literal["mean", "max", "min"], Arg("rollout: how to fuse heads")] = "mean"
    discard_ratio: Annotated[float, Arg("rollout: drop this fraction of the weakest weights", below_one)] = 0.0


@register
class ViTRecipe(ImageClassifierRecipe):
    name = "vit"
    help = "a Vision Transformer image classifier"
    models = {"vit": ModelKind(ViTConfig, "attnlab.models.vit:ViT", ImageClassifierVerbs)}
    presets = VIT_PRESETS
    explore_kind = "image"
    train_options = ViTTrainOptions
    inspect_options = ViTInspection
    tiny = dict(ImageClassifierRecipe.tiny, dim=16, layers=1, heads=2)
    # Per-dataset recipes (benchmarks/README.md, ViT): on digits 1,000 steps of 64 at lr 2e-3
    # (no random shift, see ImageClassifierRecipe.prepare) reach 98.4 % over five seeds in ~30 s,
    # where 2,000 of 128 at 1e-3 took 86 s for 97.8 %; on MNIST (8,000 training images) 3,000
    # steps of 64 reach 98.4-98.5 % in 4.5-5 minutes (2,500 of 128: 98.4 % in 9). Both with label
    # smoothing 0.1.
    DATA_TRAIN = {
        "digits": dict(batch_size=64, lr=2e-3, max_iters=1000),
        "mnist": dict(batch_size=64, lr=2e-3, max_iters=3000, eval_interval=500),
    }
    LABEL_SMOOTHING = {"digits": 0.1, "mnist": 0.1}
    default_seconds = (45, 53)  # benchmarks/first_hour.py, 2026-12-07
    inspections = {
        "attention": "attention of one query token, per layer and head (--image)",
        "rollout": "attention rollout from the class token (--image)",
        "embeddings": "principal components of the patch-embedding filters",
        "positions": "cosine similarity of the position embeddings",
        "distance": "mean attention distance per head against depth",
        "lens": "the class lens: the class each block's output would predict, and how sure (--image)",
        **ImageClassifierRecipe.inspections,
    }

    def train_defaults_for(self, o):
        return replace(self.train_defaults, **self.DATA_TRAIN.get(o.data or "digits", {}))

    def preset_fields(self, o, shape=None) -> dict:
        """--preset's fields, or those of the preset that suits images of ``shape`` (C, H, W);
        without a shape, the default data's (digits)."""
        return dict(VIT_PRESETS[o.preset or (preset_for(shape) if shape else "digits")])

    def check_new(self, o, model_over) -> None:
        super().check_new(o, model_over)
        if o.preset and o.init:
            raise ValueError("--init fixes the model's shape; drop --preset")
        if o.preset:
            ViTConfig(**{**VIT_PRESETS[o.preset], **model_over})

    def new_config(self, o, splits, model_over):
        c, h, _ = splits.shape
        return "vit", ViTConfig(
            **{
                **self.preset_fields(o, splits.shape),
                "image_size": h,
                **model_over,
                "in_chans": c,
                "num_classes": len(splits.labels),
                "labels": splits.labels,
            }
        )

    def inspect(self, model, what: str, out: Path, o: ViTInspection) -> dict[str, np.ndarray]:
        import numpy as np
        import torch

        from ..inspect import analysis as A
        from ..inspect import plots as P

        if what in ImageClassifierRecipe.inspections:
            return super().inspect(model, what, out, o)
        if what in ("attention", "rollout"):
            img, x = one_image(o.image, what, model)
            maps = attention_maps(model, x)  # L x (1, H, T, T)
            g, npre = model.grid, model.n_prefix
            if what == "attention":
                if not 0 <= o.token < maps[0].shape[-1]:
                    raise ValueError(f"--token must be in 0..{maps[0].shape[-1] - 1}")
                rows = torch.stack([m[0, :, o.token, npre:] for m in maps])  # (L, H, N)
                P.attention_grid_png(
                    img, rows.reshape(*rows.shape[:2], *g).numpy(), out, title=f"attention from token {o.token}"
                )
                return {"attention": torch.stack([m[0] for m in maps]).numpy()}
            r = A.rollout(maps, o.head_fusion, o.discard_ratio, n_prefix=npre)[0]  # (T, T)
            src = r[0, npre:] if npre else r.mean(0)
            P.overlay_png(
                img,
                (src / src.max()).reshape(*g).numpy(),
                out,
                title=f"attention rollout ({o.head_fusion}, discard {o.discard_ratio})",
            )
            return {"rollout": r.numpy()}
        if what == "lens":
            from ..inspect.lens import class_lens

            img, x = one_image(o.image, what, model)
            probs = class_lens(model, x)[:, 0].float().softmax(-1)  # (L, classes)
            labels = class_labels(model.config)
            shown = probs[-1].topk(min(10, probs.shape[-1])).indices.tolist()  # the final top classes
            P.class_lens_png(img, probs[:, shown].numpy(), [labels[i] for i in shown], out)
            return {"probs": probs.numpy(), "labels": np.array(labels)}
        if what == "embeddings":
            comps, var = A.embedding_components(model.patch_embed.proj.weight.detach(), 28)
            P.components_png(comps.numpy(), var.numpy(), out)
            return {"components": comps.numpy(), "explained_variance": var.numpy()}
        if what == "positions":
            sim = A.position_similarity(model.pos_embed.detach()[0, model.n_prefix :])
            P.position_similarity_png(sim.numpy(), model.grid, out)
            return {"similarity": sim.numpy()}
        # distance
        maps = attention_maps(model, test_images(model, o.n_images, o.data_dir))
        dist = torch.stack(
            [A.mean_attention_distance(m, model.grid, model.config.patch_size, model.n_prefix) for m in maps]
        )  # (L, H)
        P.attention_distance_png(dist.numpy(), out, image_size=model.config.image_size)
        return {"distance": dist.numpy()}

    def explore(self, model, image: str | None = None) -> dict:
        from ..inspect.explorer import image_attention

        if not image:
            raise ValueError("explore a ViT with --image FILE")
        if model.model_type != "vit":
            raise ValueError(f"{model.checkpoint} holds {a(model.model_type)} model, which has no attention to explore")
        img = read_image(image, model.config.in_chans, model.config.image_size)
        return image_attention(model, img, model.mean, model.std)


def attention_maps(model, x) -> list[torch.Tensor]:
    """Every layer's attention (B, H, T, T) for images ``x``, in depth order."""
    import torch

    from ..inspect import capture_attention

    with capture_attention(model) as rec, torch.no_grad():
        model(x)
    return rec.layers()
