"""CNN baselines for comparisons with ViT (accuracy, CKA): plain stages of convolutions, or a
ResNet (He et al. 2016): ResNet-18's basic blocks, two per stage, on a 3x3 stem for small images."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from ..config import Config
from ..errors import OptionError
from ..hooks import HookedModule, HookPoint

__all__ = ["CNNConfig", "CNN"]


@dataclass
class CNNConfig(Config):
    in_chans: int = 1
    num_classes: int = 10  # 0: no head (an image encoder: see ``features``)
    widths: tuple = (32, 64, 128)  # channels of each stage; each stage after the first halves H and W
    image_size: int = 28
    labels: list | None = None
    arch: str = field(
        default="plain",
        metadata={
            "help": "plain: (conv, BN, ReLU) x2 per stage; resnet: two residual basic blocks per stage "
            "(ResNet-18's, scaled to small images)"
        },
    )

    SIZES = ("in_chans", "image_size")
    CHOICES = {"arch": ("plain", "resnet")}

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.num_classes <= 1 << 24:
            raise ValueError(f"num_classes must be 0 (no head) or more, got {self.num_classes}")
        if not self.widths or not all(isinstance(w, int) and 1 <= w <= 4096 for w in self.widths):
            raise ValueError(f"widths must be a list of channel counts from 1 to 4096, got {self.widths!r}")
        self.widths = tuple(self.widths)  # JSON gives a list back

    @property
    def grid(self) -> tuple[int, int]:
        """The (h, w) of the last stage's feature map: each stage after the first halves H and W."""
        g = self.image_size
        for _ in self.widths[1:]:
            g = (g + 1) // 2
        return g, g


class BasicBlock(nn.Module):
    """ResNet's basic block: y = ReLU(F(x) + shortcut(x)) with F = conv3x3-BN-ReLU-conv3x3-BN; the
    shortcut is the identity, or a strided 1x1 convolution with BN where the shape changes."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.residual = nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
        )
        self.shortcut = (
            nn.Identity()
            if stride == 1 and c_in == c_out
            else nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))
        )

    def forward(self, x: Tensor) -> Tensor:
        return (self.residual(x) + self.shortcut(x)).relu()


class CNN(HookedModule):
    """Stages of (conv3x3 -> BatchNorm -> ReLU) x2 (``arch="resnet"``: two :class:`BasicBlock`),
    stride 2 between stages, global average pooling, linear head.

    Hook points: ``hook_stage.i`` (B, widths[i], h_i, w_i) each stage's output (the layers
    CKA compares), ``hook_pooled`` (B, widths[-1]) what the head reads."""

    model_type = "cnn"
    config_class = CNNConfig
    representation_hooks = "hook_stage.*"  # the successive representations (CKA)

    def __init__(self, config: CNNConfig) -> None:
        super().__init__()
        self.config = c = config
        stages, prev = [], c.in_chans
        for i, w in enumerate(c.widths):
            stride = 1 if i == 0 else 2
            if c.arch == "resnet":
                stages.append(nn.Sequential(BasicBlock(prev, w, stride), BasicBlock(w, w)))
                prev = w
                continue
            stages.append(
                nn.Sequential(
                    nn.Conv2d(prev, w, 3, stride=stride, padding=1, bias=False),
                    nn.BatchNorm2d(w),
                    nn.ReLU(inplace=True),
                    nn.Conv2d(w, w, 3, padding=1, bias=False),
                    nn.BatchNorm2d(w),
                    nn.ReLU(inplace=True),
                )
            )
            prev = w
        self.stages = nn.ModuleList(stages)
        self.hook_stage = nn.ModuleList(HookPoint() for _ in stages)
        self.hook_pooled = HookPoint()
        self.head = nn.Linear(prev, c.num_classes) if c.num_classes > 0 else nn.Identity()

    @property
    def grid(self) -> tuple[int, int]:
        return self.config.grid

    def features(self, images: Tensor) -> Tensor:
        """Images (B, C, H, W) -> the last stage's feature map (B, widths[-1], h, w)."""
        if images.dim() != 4 or images.shape[1] != self.config.in_chans:
            raise OptionError(f"CNN expects images (B, {self.config.in_chans}, H, W), got {tuple(images.shape)}")
        x = images
        for stage, hook in zip(self.stages, self.hook_stage):
            x = hook(stage(x))
        return x

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.hook_pooled(self.features(images).mean(dim=(2, 3))))
