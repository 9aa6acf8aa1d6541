"""ViT: an image is worth 16×16 words.

    patches = PatchEmbed(image)                  (B, N, D): flatten P×P patches, project with E
    x = [cls; patches] + pos                     (B, 1+N, D) with a class token, or (B, N, D) without
    x = Encoder(x)                               pre-LN blocks, final LayerNorm
    logits = head(x[:, 0])  or  head(mean(x))    class token or global average pooling
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor, nn

from ..config import Config
from ..blocks import Encoder
from ..position import PEG, sincos_2d_encoding
from ..tokens import PatchEmbed

__all__ = ["ViTConfig", "ViT", "VIT_PRESETS"]


@dataclass
class ViTConfig(Config):
    image_size: int = 32
    patch_size: int = 4
    in_chans: int = 3
    num_classes: int = 10  # 0: no head, the model returns the pooled features
    dim: int = 192
    depth: int = 6
    heads: int = 3
    mlp_ratio: float = 4.0
    pool: str = "cls"  # cls | mean
    pos: str = "learned"  # learned | sincos
    dropout: float = 0.0
    norm_eps: float = 1e-6
    qkv_bias: bool = True
    peg: bool = False  # conditional position encoding (CPVT): a depthwise conv after the first block
    labels: list | None = None  # class names, in index order

    SIZES = ("image_size", "patch_size", "in_chans", "dim", "depth", "heads")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be 0 (no head) or more, got {self.num_classes}")
        if self.pool not in ("cls", "mean"):
            raise ValueError(f"pool must be 'cls' or 'mean', got {self.pool!r}")
        if self.pos not in ("learned", "sincos"):
            raise ValueError(f"pos must be 'learned' or 'sincos', got {self.pos!r}")
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image size {self.image_size} is not divisible by patch size {self.patch_size}; "
                "pick a patch size that divides it"
            )
        if self.dim % self.heads:
            raise ValueError(f"dim={self.dim} is not divisible by heads={self.heads}")

    @property
    def grid(self) -> tuple[int, int]:
        g = self.image_size // self.patch_size
        return g, g


VIT_PRESETS: dict[str, dict] = {
    # 8×8 digits: 2×2 patches -> a 4×4 grid of 16 tokens
    # (with a PEG: on 1,259 training images the convolution's locality is worth ~1.5 points)
    "digits": dict(image_size=8, patch_size=2, in_chans=1, dim=64, depth=4, heads=4, mlp_ratio=2.0, peg=True),
    # 28×28 MNIST: 4×4 patches -> 7×7 grid
    "mnist": dict(image_size=28, patch_size=4, in_chans=1, dim=64, depth=6, heads=4, mlp_ratio=2.0, peg=True),
    # 32×32 CIFAR-10: 4×4 patches -> 8×8 grid
    "cifar": dict(image_size=32, patch_size=4, in_chans=3, dim=192, depth=6, heads=3, mlp_ratio=2.0),
}


class ViT(nn.Module):
    """Calling the model on images (B, C, H, W) returns logits (B, num_classes)."""

    model_type = "vit"
    config_class = ViTConfig

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.patch_embed = PatchEmbed(c.patch_size, c.in_chans, c.dim)
        n = c.grid[0] * c.grid[1]
        self.n_prefix = 1 if c.pool == "cls" else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.dim)) if c.pool == "cls" else None
        if c.pos == "learned":
            self.pos_embed = nn.Parameter(torch.randn(1, self.n_prefix + n, c.dim) * 0.02)
        else:  # fixed 2-D sin-cos; the class token gets a zero position vector
            pe = torch.cat([torch.zeros(self.n_prefix, c.dim), sincos_2d_encoding(*c.grid, c.dim)])
            self.register_buffer("pos_embed", pe[None], persistent=False)
        self.drop = nn.Dropout(c.dropout)
        self.encoder = Encoder(
            c.depth, c.dim, c.heads, mlp_hidden=round(c.dim * c.mlp_ratio), activation="gelu",
            dropout=c.dropout, norm_eps=c.norm_eps, bias=True,
        )
        if not c.qkv_bias:
            for blk in self.encoder.blocks:
                blk.attn.qkv.bias = None
        self.peg = PEG(c.dim) if c.peg else None
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

    @property
    def grid(self) -> tuple[int, int]:
        return self.config.grid

    def no_weight_decay(self) -> set[str]:
        """Parameters AdamW must not decay (timm / DeiT): the class token and learned positions."""
        return {n for n in ("cls_token", "pos_embed") if isinstance(getattr(self, n), nn.Parameter)}

    def tokens(self, images: Tensor) -> Tensor:
        """Images (B, C, H, W) -> encoded tokens (B, n_prefix + N, D) after the final LayerNorm."""
        c = self.config
        if images.dim() != 4 or images.shape[1] != c.in_chans:
            raise ValueError(f"ViT expects images (B, {c.in_chans}, H, W), got {tuple(images.shape)}")
        if images.shape[-2:] != (c.image_size, c.image_size):
            raise ValueError(
                f"ViT was built for {c.image_size}x{c.image_size} images, got {images.shape[-2]}x{images.shape[-1]}; "
                "resize the images or call resize_pos_embed() for the new size"
            )
        x = self.patch_embed(images)  # (B, N, D)
        if self.cls_token is not None:
            x = torch.cat([repeat(self.cls_token, "1 1 d -> b 1 d", b=x.shape[0]), x], dim=1)
        x = self.drop(x + self.pos_embed.to(x.dtype))
        for i, block in enumerate(self.encoder.blocks):
            x = block(x)
            if i == 0 and self.peg is not None:
                x = self.peg(x, self.grid, self.n_prefix)
        return self.encoder.ln_f(x)

    def forward_features(self, images: Tensor) -> Tensor:
        x = self.tokens(images)
        return x[:, 0] if self.config.pool == "cls" else x.mean(dim=1)  # (B, D)

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.forward_features(images))

    @torch.no_grad()
    def resize_pos_embed(self, image_size: int) -> None:
        """Adapt to a new image size: bicubic interpolation of the learned position grid
        (or a fresh sin-cos grid). The class token's position is kept."""
        c = self.config
        if image_size % c.patch_size:
            raise ValueError(f"image size {image_size} is not divisible by patch size {c.patch_size}")
        g_new = image_size // c.patch_size
        if c.pos == "learned":
            prefix, grid = self.pos_embed[:, : self.n_prefix], self.pos_embed[:, self.n_prefix :]
            img = rearrange(grid, "1 (h w) d -> 1 d h w", h=c.grid[0])
            img = F.interpolate(img, size=(g_new, g_new), mode="bicubic", align_corners=False)
            new = torch.cat([prefix, rearrange(img, "1 d h w -> 1 (h w) d")], dim=1)
            self.pos_embed = nn.Parameter(new)
        else:
            pe = torch.cat([torch.zeros(self.n_prefix, c.dim), sincos_2d_encoding(g_new, g_new, c.dim)])
            self.pos_embed = pe[None].to(self.pos_embed.device)
        self.config = ViTConfig(**{**c.to_dict(), "image_size": image_size})
