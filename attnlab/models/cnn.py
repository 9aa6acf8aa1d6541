"""CNN baselines for comparisons with ViT (accuracy, CKA): plain stages of convolutions, or a
ResNet (He et al. 2016): ResNet-18's basic blocks, two per stage, on a 3x3 stem for small images."""

from __future__ import annotations


from torch import Tensor, nn

from ..errors import OptionError
from ..hooks import HookedModule, HookPoint

__all__ = ["CNNConfig", "CNN"]


from .configs import CNNConfig  # noqa: F401  (declared without torch)


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
