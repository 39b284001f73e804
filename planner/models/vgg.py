"""VGG-16/19 (torchvision layout, no BatchNorm, no dropout) as torch blocks.

    zoo = VggModel({"depth": 16, "image_size": 32, "classes": 10})
    zoo.block_names()           # ['conv1_1', 'conv1_2', 'conv2_1', ..., 'fc6', 'fc7', 'fc8']

Blocks as :mod:`hetplan.profile.analytic.vgg` groups them: each 3x3 convolution (with bias) and its
ReLU is one block ``convS_I``, the 2x2 max-pool that ends a stage folded into the stage's last
convolution block; ``fc6`` (adaptive average pool to 7x7, flatten, Linear 25088->4096, ReLU),
``fc7`` (Linear 4096->4096, ReLU), ``fc8`` (Linear 4096->classes, the logits). torchvision's two
dropout layers are left out (a pipeline must reproduce a single process bit for bit), so the
analytic family's dropout masks are not kept here. Initialisation as torchvision.

The synthetic task: random normal images, labels from a fixed random linear teacher.
"""

from __future__ import annotations

import torch
from torch import nn

from hetplan.families.vgg import CHANNELS, FC_WIDTH, LAYOUTS, POOL_SIDE
from hetplan.models.base import ClassificationTask, TaskModel, uninitialised

__all__ = ["ConvBlock", "FcBlock", "VggModel"]


class ConvBlock(nn.Module):
    """3x3 convolution + ReLU (+ 2x2 max-pool when it ends a stage)."""

    def __init__(self, cin: int, cout: int, pool: bool) -> None:
        super().__init__()
        self.conv = uninitialised(nn.Conv2d, cin, cout, 3, padding=1)
        nn.init.kaiming_normal_(self.conv.weight, mode="fan_out", nonlinearity="relu")
        nn.init.zeros_(self.conv.bias)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2, stride=2) if pool else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv(x))
        return x if self.pool is None else self.pool(x)


class FcBlock(nn.Module):
    """(Adaptive average pool + flatten) + Linear (+ ReLU)."""

    def __init__(self, fin: int, fout: int, *, pool: bool, relu: bool) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(POOL_SIDE) if pool else None
        self.fc = uninitialised(nn.Linear, fin, fout)  # initialised once, below (fc6 has 103M weights)
        nn.init.normal_(self.fc.weight, 0.0, 0.01)
        nn.init.zeros_(self.fc.bias)
        self.relu = nn.ReLU() if relu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pool is not None:
            x = torch.flatten(self.pool(x), 1)
        x = self.fc(x)
        return x if self.relu is None else self.relu(x)


class VggModel(TaskModel):
    """The zoo VGG for a full, checked config (keys as the analytic ``vgg`` family)."""

    def __init__(self, config: dict[str, int]) -> None:
        self.config = dict(config)
        # (name, cin, cout, pool) of every convolution block
        self.convs: list[tuple[str, int, int, bool]] = []
        cin = 3
        for stage, (count, cout) in enumerate(zip(LAYOUTS[config["depth"]], CHANNELS, strict=True)):
            for i in range(count):
                self.convs.append((f"conv{stage + 1}_{i + 1}", cin, cout, i == count - 1))
                cin = cout
        self.task = ClassificationTask((3, config["image_size"], config["image_size"]), config["classes"])
        super().__init__({"family": "vgg", "config": dict(config)})

    def block_names(self) -> list[str]:
        return [name for name, *_ in self.convs] + ["fc6", "fc7", "fc8"]

    def block_kinds(self) -> list[str]:
        return ["conv"] * len(self.convs) + ["linear", "linear", "head"]

    def _new_block(self, index: int) -> nn.Module:
        if index < len(self.convs):
            _, cin, cout, pool = self.convs[index]
            return ConvBlock(cin, cout, pool)
        fc = index - len(self.convs)
        if fc == 0:
            return FcBlock(CHANNELS[-1] * POOL_SIDE * POOL_SIDE, FC_WIDTH, pool=True, relu=True)
        if fc == 1:
            return FcBlock(FC_WIDTH, FC_WIDTH, pool=False, relu=True)
        return FcBlock(FC_WIDTH, self.config["classes"], pool=False, relu=False)
