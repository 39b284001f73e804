"""A plain multi-layer perceptron: ``layers`` linear layers, ReLU between them.

    from hetplan.profile.analytic import FAMILIES
    costs = FAMILIES["mlp"].blocks({"layers": 3, "width": 512})
    [c.name for c in costs]                       # ['layer0', 'layer1', 'layer2']

Block ``layerI`` is linear + ReLU (input -> width, then width -> width); the last block is the
linear layer to ``classes`` alone, returning the logits. One row of work per sample, so small
micro-batches are bound by reading the weights (the GEMM part's memory roof) and fill few tiles
(:func:`hetplan.profile.efficiency.wave_saturation`).
"""

from __future__ import annotations

from hetplan.families.mlp import DEFAULTS, HELP, check
from hetplan.profile.analytic.base import BlockCost, dtype_bytes
from hetplan.profile.analytic.tally import Tally

__all__ = ["DEFAULTS", "HELP", "blocks", "check", "input_bytes"]


def blocks(config: dict[str, int], dtype: str) -> list[BlockCost]:
    """The block list for a full, checked config."""
    d = dtype_bytes(dtype)
    n = config["layers"]
    out: list[BlockCost] = []
    fin = config["input"]
    for i in range(n):
        last = i == n - 1
        fout = config["classes"] if last else config["width"]
        t = Tally(d)
        t.linear(fin, fout, keep_input=True)
        if last:
            t.log_softmax(fout)
        else:
            t.relu(fout, keep_output=False)  # its output is the next block's (kept) input
        out.append(t.block(f"layer{i}", "head" if last else "linear", output_elems=fout, work_items=1))
        fin = fout
    return out


def input_bytes(config: dict[str, int], dtype: str) -> float:
    """Per sample: ``input`` features at the compute dtype."""
    return float(config["input"] * dtype_bytes(dtype))
