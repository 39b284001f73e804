"""ResNet-18/34/50/101/152 (torchvision layout, v1.5) as torch blocks, written here (no torchvision).

    zoo = ResnetModel({"depth": 18, "image_size": 32, "classes": 10})
    zoo.block_names()           # ['stem', 'layer1.0', 'layer1.1', ..., 'layer4.1', 'head']

Blocks as :mod:`hetplan.profile.analytic.resnet` lists them: ``stem`` (conv 7x7/2, BatchNorm,
ReLU, max-pool 3x3/2), residual blocks ``layerI.J`` (basic for depth 18/34, bottleneck with the
stride on its 3x3 convolution for 50/101/152, with a 1x1 convolution + BatchNorm downsample where
the shape changes), ``head`` (global average pool, fully connected layer, returning logits).
Initialisation as torchvision (Kaiming normal, fan-out, for convolutions; BatchNorm 1 and 0).

**BatchNorm** normalises with the statistics of the batch it sees. A pipeline runs each block on
micro-batches, and a data-parallel rank on its share, so their statistics (and the outputs) differ
from a single process on the whole batch: bit-for-bit equality with a single-process reference
holds only when the micro-batch is the same. BatchNorm is kept anyway because it is what the
published ResNets (and the analytic family's parameter and FLOP counts) use; GroupNorm would avoid
the batch dependence but is a different model.

The synthetic task: random normal images, labels from a fixed random linear teacher
(:class:`hetplan.models.base.ClassificationTask`).
"""

from __future__ import annotations

import torch
from torch import nn

from hetplan.families.resnet import EXPANSION, LAYOUTS, WIDTHS
from hetplan.models.base import ClassificationTask, TaskModel, uninitialised

__all__ = ["Basic", "Bottleneck", "ResnetHead", "ResnetModel", "Stem"]


def _conv(cin: int, cout: int, kernel: int, stride: int) -> nn.Conv2d:
    conv = uninitialised(nn.Conv2d, cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False)
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    return conv


class Stem(nn.Module):
    """conv 7x7/2 + BatchNorm + ReLU + max-pool 3x3/2."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = _conv(3, 64, 7, 2)
        self.bn = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.relu(self.bn(self.conv(x))))


class _Residual(nn.Module):
    def _downsample(self, cin: int, cout: int, stride: int) -> None:
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(_conv(cin, cout, 1, stride), nn.BatchNorm2d(cout))

    def _shortcut(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.downsample is None else self.downsample(x)


class Basic(_Residual):
    """Two 3x3 convolutions with BatchNorm; ReLU after the residual add."""

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        self.conv1 = _conv(cin, width, 3, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv(width, width, 3, 1)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self._downsample(cin, width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self._shortcut(x))


class Bottleneck(_Residual):
    """1x1 (reduce), 3x3 (stride here: v1.5), 1x1 (expand x4), each with BatchNorm."""

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * EXPANSION
        self.conv1 = _conv(cin, width, 1, 1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv(width, width, 3, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv(width, cout, 1, 1)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self._downsample(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self._shortcut(x))


class ResnetHead(nn.Module):
    """Global average pool + fully connected layer -> logits ``[B, classes]``."""

    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(x), 1))


class ResnetModel(TaskModel):
    """The zoo ResNet for a full, checked config (keys as the analytic ``resnet`` family)."""

    def __init__(self, config: dict[str, int]) -> None:
        self.config = dict(config)
        bottleneck, counts = LAYOUTS[config["depth"]]
        self.bottleneck = bottleneck
        # (name, cin, width, stride) of every residual block
        self.layout: list[tuple[str, int, int, int]] = []
        channels = 64
        for stage, (width, count) in enumerate(zip(WIDTHS, counts, strict=True)):
            for j in range(count):
                stride = 2 if stage > 0 and j == 0 else 1
                self.layout.append((f"layer{stage + 1}.{j}", channels, width, stride))
                channels = width * EXPANSION if bottleneck else width
        self.channels = channels
        self.task = ClassificationTask((3, config["image_size"], config["image_size"]), config["classes"])
        super().__init__({"family": "resnet", "config": dict(config)})

    def block_names(self) -> list[str]:
        return ["stem", *(name for name, *_ in self.layout), "head"]

    def block_kinds(self) -> list[str]:
        return ["stem"] + ["bottleneck" if self.bottleneck else "basic"] * len(self.layout) + ["head"]

    def _new_block(self, index: int) -> nn.Module:
        if index == 0:
            return Stem()
        if index == self.n_blocks - 1:
            return ResnetHead(self.channels, self.config["classes"])
        _, cin, width, stride = self.layout[index - 1]
        return (Bottleneck if self.bottleneck else Basic)(cin, width, stride)
