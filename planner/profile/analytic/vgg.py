"""VGG-16/19 (configurations D and E of Simonyan & Zisserman 2015, torchvision layout, no BN).

    from hetplan.profile.analytic import FAMILIES
    costs = FAMILIES["vgg"].blocks({"depth": 16})
    sum(c.params for c in costs)                  # 138357544, as torchvision's vgg16

Blocks: each 3x3 convolution with its ReLU is one block ``convS_I`` (S = stage 1-5); the max-pool
that ends a stage is folded into the stage's last convolution block. Then ``fc6`` (the adaptive
average pool to 7x7, folded in, + linear + ReLU + dropout), ``fc7`` (linear + ReLU + dropout) and
``fc8`` (linear, returning the logits).
"""

from __future__ import annotations

from hetplan.families.vgg import CHANNELS, DEFAULTS, FC_WIDTH, HELP, LAYOUTS, POOL_SIDE, check
from hetplan.profile.analytic.base import BlockCost, dtype_bytes
from hetplan.profile.analytic.tally import Tally

__all__ = ["DEFAULTS", "HELP", "LAYOUTS", "blocks", "check", "input_bytes"]


def _conv_block(
    name: str, cin: int, cout: int, hw: tuple[int, int], pool: bool, d: int
) -> tuple[BlockCost, tuple[int, int]]:
    t = Tally(d)
    t.keep(cin * hw[0] * hw[1])  # block input, for the weight gradient
    conv_hw = t.conv(cin, cout, 3, 1, 1, hw, bias=True)
    elems = cout * conv_hw[0] * conv_hw[1]
    t.relu(elems, keep_output=pool)  # without a pool, the output is the next block's input
    out_hw = t.maxpool(cout, 2, 2, 0, conv_hw) if pool else conv_hw
    return t.block(name, "conv", output_elems=cout * out_hw[0] * out_hw[1], work_items=conv_hw[0] * conv_hw[1]), out_hw


def _fc(name: str, fin: int, fout: int, last: bool, d: int, pooled_from: float | None = None) -> BlockCost:
    t = Tally(d)
    if pooled_from is not None:
        t.avgpool(pooled_from, fin)
    t.linear(fin, fout, keep_input=True)
    if last:
        t.log_softmax(fout)
    else:
        t.relu(fout, keep_output=True)
        t.dropout(fout)
    return t.block(name, "head" if last else "linear", output_elems=fout, work_items=1)


def blocks(config: dict[str, int], dtype: str) -> list[BlockCost]:
    """The block list for a full, checked config."""
    d = dtype_bytes(dtype)
    size = config["image_size"]
    hw = (size, size)
    cin = 3
    out: list[BlockCost] = []
    for stage, (count, cout) in enumerate(zip(LAYOUTS[config["depth"]], CHANNELS, strict=True)):
        for i in range(count):
            block, hw = _conv_block(f"conv{stage + 1}_{i + 1}", cin, cout, hw, i == count - 1, d)
            out.append(block)
            cin = cout
    flat = CHANNELS[-1] * POOL_SIDE * POOL_SIDE
    out.append(_fc("fc6", flat, FC_WIDTH, False, d, pooled_from=cin * hw[0] * hw[1]))
    out.append(_fc("fc7", FC_WIDTH, FC_WIDTH, False, d))
    out.append(_fc("fc8", FC_WIDTH, config["classes"], True, d))
    return out


def input_bytes(config: dict[str, int], dtype: str) -> float:
    """Per sample: one 3-channel image at the compute dtype."""
    return float(3 * config["image_size"] ** 2 * dtype_bytes(dtype))
