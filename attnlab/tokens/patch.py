"""Any modality as a sequence of vectors: chop the input into chunks, project each chunk.

Images: (B, C, H, W) -> P×P patches -> flatten each (C·P·P) -> shared linear map E -> (B, N, D).
Signals: (B, C, L) -> chunks of length P -> flatten (C·P) -> shared linear map -> (B, L/P, D).
"""

from __future__ import annotations

from einops import rearrange
from torch import Tensor, nn


class PatchEmbed(nn.Module):
    """Image patch embedding. The weight is stored as a Conv2d kernel (D, C, P, P), which
    is the same linear map as flattening patches in (c, p1, p2) order and multiplying
    by a (C·P·P, D) matrix (tested), but runs as one strided convolution."""

    def __init__(self, patch_size: int, in_chans: int, dim: int, bias: bool = True) -> None:
        super().__init__()
        self.patch_size, self.in_chans, self.dim = patch_size, in_chans, dim
        self.proj = nn.Conv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size, bias=bias)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        p = self.patch_size
        if height % p or width % p:
            raise ValueError(
                f"image of size {height}x{width} is not divisible by patch size {p}; "
                f"resize or crop it to a multiple of {p} (e.g. {height // p * p}x{width // p * p})"
            )
        return height // p, width // p

    def forward(self, images: Tensor) -> Tensor:
        if images.dim() != 4 or images.shape[1] != self.in_chans:
            raise ValueError(f"expected images (B, {self.in_chans}, H, W), got {tuple(images.shape)}")
        self.grid(images.shape[2], images.shape[3])
        return rearrange(self.proj(images), "b d h w -> b (h w) d")  # (B, N, D)

    def flatten_patches(self, images: Tensor) -> Tensor:
        """The lecture's view: (B, C, H, W) -> (B, N, C·P·P) flattened patches, row-major."""
        self.grid(images.shape[2], images.shape[3])
        p = self.patch_size
        return rearrange(images, "b c (h p1) (w p2) -> b (h w) (c p1 p2)", p1=p, p2=p)


class ChunkEmbed1D(nn.Module):
    """1-D chunk-and-project embedding for any signal: (B, L) or (B, C, L) -> (B, L/P, D)."""

    def __init__(self, chunk_size: int, in_chans: int, dim: int, bias: bool = True) -> None:
        super().__init__()
        self.chunk_size, self.in_chans = chunk_size, in_chans
        self.proj = nn.Linear(in_chans * chunk_size, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 2 and self.in_chans == 1:
            x = x[:, None]
        if x.dim() != 3 or x.shape[1] != self.in_chans:
            raise ValueError(f"expected a signal (B, {self.in_chans}, L), got {tuple(x.shape)}")
        if x.shape[-1] % self.chunk_size:
            raise ValueError(
                f"signal length {x.shape[-1]} is not divisible by chunk size {self.chunk_size}; pad or trim it"
            )
        chunks = rearrange(x, "b c (n p) -> b n (c p)", p=self.chunk_size)
        return self.proj(chunks)
