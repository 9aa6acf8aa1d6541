"""ViT: an image is worth 16×16 words.

patches = PatchEmbed(image)                  (B, N, D): flatten P×P patches, project with E
x = [cls; patches] + pos                     (B, 1+N, D) with a class token, or (B, N, D) without
x = Encoder(x)                               pre-LN blocks, final LayerNorm
logits = head(x[:, 0])  or  head(mean(x))    class token or global average pooling
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor, nn

from ..attention import grid_local_mask
from ..errors import OptionError
from ..hooks import HookedModule, HookPoint
from ..blocks import Encoder, HeadWeights
from ..position import PEG, FourierPosition, LearnedPosition, RelativePosition, SinCos2DPosition
from ..tokens import PatchEmbed

__all__ = ["ViTConfig", "ViT", "VIT_PRESETS"]


from .configs import VIT_POSITIONS, ViTConfig, VIT_PRESETS  # noqa: F401  (declared without torch)


class ViT(HeadWeights, HookedModule):
    """Calling the model on images (B, C, H, W) returns logits (B, num_classes).

    Hook points: ``hook_embed`` (B, n_prefix + N, D) the tokens entering block 0 (patches, class
    token, positions), ``encoder.blocks.L.*`` (:mod:`attnlab.blocks`), ``encoder.hook_final``
    (B, n_prefix + N, D) after the final LayerNorm, ``hook_pooled`` (B, D) what the head reads."""

    model_type = "vit"
    config_class = ViTConfig
    representation_hooks = "encoder.blocks.*.hook_resid_post"  # the successive representations (CKA)

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.n_prefix = 1 if c.pool == "cls" else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim)) if c.pool == "cls" else None
        # learned, or fixed 2-D sin-cos (the class token gets a zero position vector); made before
        # patch_embed so that the parameter order (and the optimizer state of older runs) is kept
        self.pos = self._absolute_positions(c.grid)
        # relative: 2-D Shaw tables inside attention, one set shared by every block (as T5 shares them)
        self.rel_pos = (
            RelativePosition(c.dim // c.heads, c.rel_distance, grid=c.grid, n_prefix=self.n_prefix)
            if c.pos == "relative"
            else None
        )
        self.patch_embed = PatchEmbed(c.patch_size, c.in_chans, c.dim)
        self.drop = nn.Dropout(c.dropout)
        self.encoder = Encoder(
            c.layers,
            c.dim,
            c.heads,
            mlp_hidden=round(c.dim * c.mlp_ratio),
            activation="gelu",
            dropout=c.dropout,
            norm_eps=c.norm_eps,
            bias=True,
            qkv_bias=c.qkv_bias,
            position_bias=self.rel_pos,
        )
        self.peg = PEG(c.dim) if c.peg else None
        self.hook_embed, self.hook_pooled = HookPoint(), HookPoint()
        self.head = nn.Linear(c.dim, c.num_classes) if c.num_classes > 0 else nn.Identity()
        self._init()

    def _init(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=0.02)
        if isinstance(self.head, nn.Linear):
            nn.init.zeros_(self.head.weight)

    def _absolute_positions(self, grid: tuple[int, int]) -> nn.Module | None:
        """The table added to the tokens (None for relative positions, which act inside attention,
        and for none)."""
        c, n = self.config, grid[0] * grid[1]
        if c.pos == "learned":
            return LearnedPosition(c.dim, self.n_prefix + n)
        if c.pos == "sincos":
            return SinCos2DPosition(c.dim, grid, self.n_prefix)
        if c.pos == "fourier":
            return FourierPosition(c.dim, grid, self.n_prefix)
        return None

    @property
    def grid(self) -> tuple[int, int]:
        return self.config.grid

    @property
    def pos_embed(self) -> Tensor:
        """The position table as timm names and shapes it: (1, n_prefix + N, D)."""
        if self.pos is None:
            raise ValueError(
                f"this ViT has no position table (--pos {self.config.pos}; relative positions act inside "
                "attention: see its attention maps instead)"
            )
        return self.pos.weight[None]

    def no_weight_decay(self) -> set[str]:
        """Parameters AdamW must not decay (timm / DeiT): the class token and learned positions."""
        return {n for n in ("cls_token", "pos.weight") if n in dict(self.named_parameters())}

    # checkpoints written before attnlab 0.2 kept the table as a (1, T, D) tensor `pos_embed`
    RENAMED_WEIGHTS = {"pos_embed": ("pos.weight", lambda t: t[0])}

    def tokens(self, images: Tensor) -> Tensor:
        """Images (B, C, H, W) -> encoded tokens (B, n_prefix + N, D) after the final LayerNorm."""
        c = self.config
        if images.dim() != 4 or images.shape[1] != c.in_chans:
            raise OptionError(f"ViT expects images (B, {c.in_chans}, H, W), got {tuple(images.shape)}")
        if images.shape[-2:] != (c.image_size, c.image_size):
            raise ValueError(
                f"ViT was built for {c.image_size}x{c.image_size} images, got {images.shape[-2]}x{images.shape[-1]}; "
                "resize the images or call resize_pos_embed() for the new size"
            )
        x = self.patch_embed(images)  # (B, N, D)
        if self.cls_token is not None:
            x = torch.cat([repeat(self.cls_token, "1 1 d -> b 1 d", b=x.shape[0]), x], dim=1)
        if self.pos is not None:
            x = self.pos(x)
        x = self.hook_embed(self.drop(x))
        peg = (lambda t: self.peg(t, self.grid, self.n_prefix)) if self.peg is not None else None
        mask = None
        if c.window is not None:  # a (2r + 1)² neighbourhood of patches (the class token sees and is seen by all)
            mask = grid_local_mask(self.grid, c.window, self.n_prefix, device=x.device)
        return self.encoder(x, mask=mask, after_first=peg)

    def forward_features(self, images: Tensor) -> Tensor:
        x = self.tokens(images)
        return self.hook_pooled(x[:, 0] if self.config.pool == "cls" else x.mean(dim=1))  # (B, D)

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.forward_features(images))

    def attention_blocks(self) -> list:
        """The encoder's blocks: what ``W_Q`` … ``b_O`` stack (:class:`attnlab.blocks.HeadWeights`)."""
        return list(self.encoder.blocks)

    @torch.no_grad()
    def resize_pos_embed(self, image_size: int) -> None:
        """Adapt to a new image size: bicubic interpolation of the learned position grid
        (or a fresh sin-cos grid). The class token's position is kept."""
        c = self.config
        if image_size % c.patch_size:
            raise ValueError(f"image size {image_size} is not divisible by patch size {c.patch_size}")
        g_new = image_size // c.patch_size
        device = self.patch_embed.proj.weight.device
        if c.pos == "relative":  # the tables hold offsets, which mean the same on any grid
            self.rel_pos.grid = (g_new, g_new)
        elif c.pos == "fourier":  # continuous coordinates: the same features on a finer grid
            self.pos.grid = (g_new, g_new)
        elif c.pos == "learned":
            table = self.pos.weight
            prefix, grid = table[: self.n_prefix], table[self.n_prefix :]
            img = rearrange(grid, "(h w) d -> 1 d h w", h=c.grid[0])
            img = F.interpolate(img, size=(g_new, g_new), mode="bicubic", align_corners=False)
            self.pos = LearnedPosition(c.dim, self.n_prefix + g_new * g_new).to(device)
            self.pos.weight.copy_(torch.cat([prefix, rearrange(img, "1 d h w -> (h w) d")]))
        elif c.pos == "sincos":
            self.pos = SinCos2DPosition(c.dim, (g_new, g_new), self.n_prefix).to(device)
        self.config = ViTConfig(**{**c.to_dict(), "image_size": image_size})
