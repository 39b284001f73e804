"""A multi-layer perceptron as torch blocks: Linear + ReLU, the last Linear alone (the logits).

    zoo = MlpModel({"layers": 3, "width": 64, "input": 32, "classes": 10})
    zoo.block_names()           # ['layer0', 'layer1', 'layer2']

Blocks as :mod:`hetplan.profile.analytic.mlp` lists them; torch's default initialisation. The
synthetic task: random normal inputs, labels from a fixed random linear teacher, which an MLP
learns quickly (the tests check that a few SGD steps lower the loss).
"""

from __future__ import annotations

from torch import nn

from hetplan.models.base import ClassificationTask, TaskModel

__all__ = ["MlpModel"]


class MlpModel(TaskModel):
    """The zoo MLP for a full, checked config (keys as the analytic ``mlp`` family)."""

    def __init__(self, config: dict[str, int]) -> None:
        self.config = dict(config)
        self.task = ClassificationTask((config["input"],), config["classes"])
        super().__init__({"family": "mlp", "config": dict(config)})

    def block_names(self) -> list[str]:
        return [f"layer{i}" for i in range(self.config["layers"])]

    def block_kinds(self) -> list[str]:
        return ["linear"] * (self.config["layers"] - 1) + ["head"]

    def _new_block(self, index: int) -> nn.Module:
        c = self.config
        fin = c["input"] if index == 0 else c["width"]
        if index == self.n_blocks - 1:
            return nn.Sequential(nn.Linear(fin, c["classes"]))
        return nn.Sequential(nn.Linear(fin, c["width"]), nn.ReLU())
