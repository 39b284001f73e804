"""ResNet (torchvision layout, v1.5: the stride sits on the 3x3 convolution of a bottleneck).

    from hetplan.profile.analytic import FAMILIES
    costs = FAMILIES["resnet"].blocks({"depth": 50})
    sum(c.params for c in costs)                  # 25557032, as torchvision's resnet50
    sum(c.flops_fwd for c in costs) / 2           # ~4.1e9 multiply-adds

Blocks: ``stem`` (conv 7x7/2 + BN + ReLU + max-pool 3x3/2), each residual block ``layerI.J``
(basic for depth 18/34, bottleneck for 50/101/152, downsample branch included), ``head``
(global average pool + fully connected layer, returning the logits). FLOPs are counted exactly
from the shapes (2 per multiply-add, convolutions and the FC layer only).
"""

from __future__ import annotations

from hetplan.families.resnet import DEFAULTS, EXPANSION, HELP, LAYOUTS, WIDTHS, check
from hetplan.profile.analytic.base import BlockCost, dtype_bytes
from hetplan.profile.analytic.tally import Tally

__all__ = ["DEFAULTS", "HELP", "LAYOUTS", "blocks", "check", "input_bytes"]


def _stem(size: int, d: int) -> tuple[BlockCost, tuple[int, int]]:
    t = Tally(d)
    t.keep(3 * size * size)  # the image, for conv1's weight gradient
    hw = t.conv(3, 64, 7, 2, 3, (size, size))
    t.batchnorm(64, hw, keep_input=True)
    t.relu(64 * hw[0] * hw[1], keep_output=True)  # max-pool input
    conv_hw = hw
    hw = t.maxpool(64, 3, 2, 1, hw)
    return t.block("stem", "stem", output_elems=64 * hw[0] * hw[1], work_items=conv_hw[0] * conv_hw[1]), hw


def _residual(
    name: str, cin: int, width: int, stride: int, hw: tuple[int, int], bottleneck: bool, d: int
) -> tuple[BlockCost, int, tuple[int, int]]:
    t = Tally(d)
    t.keep(cin * hw[0] * hw[1])  # block input: first conv and downsample need it
    if bottleneck:
        cout = width * EXPANSION
        h1 = t.conv(cin, width, 1, 1, 0, hw)
        t.batchnorm(width, h1, keep_input=True)
        t.relu(width * h1[0] * h1[1], keep_output=True)
        h2 = t.conv(width, width, 3, stride, 1, h1)
        t.batchnorm(width, h2, keep_input=True)
        t.relu(width * h2[0] * h2[1], keep_output=True)
        out_hw = t.conv(width, cout, 1, 1, 0, h2)
        t.batchnorm(cout, out_hw, keep_input=True)
    else:
        cout = width
        h1 = t.conv(cin, width, 3, stride, 1, hw)
        t.batchnorm(width, h1, keep_input=True)
        t.relu(width * h1[0] * h1[1], keep_output=True)
        out_hw = t.conv(width, cout, 3, 1, 1, h1)
        t.batchnorm(cout, out_hw, keep_input=True)
    if stride != 1 or cin != cout:
        ds_hw = t.conv(cin, cout, 1, stride, 0, hw)
        t.batchnorm(cout, ds_hw, keep_input=True)
    elems = cout * out_hw[0] * out_hw[1]
    t.add(elems)
    t.relu(elems, keep_output=False)  # the block output: the next block keeps it
    kind = "bottleneck" if bottleneck else "basic"
    return t.block(name, kind, output_elems=elems, work_items=out_hw[0] * out_hw[1]), cout, out_hw


def _head(channels: int, hw: tuple[int, int], classes: int, d: int) -> BlockCost:
    t = Tally(d)
    t.keep(channels * hw[0] * hw[1])  # block input (the last ReLU's saved output)
    t.avgpool(channels * hw[0] * hw[1], channels)
    t.linear(channels, classes, keep_input=True)
    t.log_softmax(classes)
    return t.block("head", "head", output_elems=classes, work_items=1)


def blocks(config: dict[str, int], dtype: str) -> list[BlockCost]:
    """The block list for a full, checked config."""
    d = dtype_bytes(dtype)
    bottleneck, counts = LAYOUTS[config["depth"]]
    stem, hw = _stem(config["image_size"], d)
    out = [stem]
    channels = 64
    for stage, (width, count) in enumerate(zip(WIDTHS, counts, strict=True)):
        for j in range(count):
            stride = 2 if stage > 0 and j == 0 else 1
            block, channels, hw = _residual(f"layer{stage + 1}.{j}", channels, width, stride, hw, bottleneck, d)
            out.append(block)
    out.append(_head(channels, hw, config["classes"], d))
    return out


def input_bytes(config: dict[str, int], dtype: str) -> float:
    """Per sample: one 3-channel image at the compute dtype."""
    return float(3 * config["image_size"] ** 2 * dtype_bytes(dtype))
