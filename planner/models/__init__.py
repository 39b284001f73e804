"""The model zoo: real torch models, block by block, for measuring and for the runtime.

    from hetplan.models import resolve_model
    zoo = resolve_model({"family": "gpt", "config": {"layers": 2, "hidden": 64, "heads": 4, "seq": 16}})
    blocks = zoo.build_blocks(0, zoo.n_blocks, seed=0)      # each block built alone, deterministically
    x, y = zoo.sample_batch(8, seed=0, step=0)              # a learnable synthetic task
    for block in blocks:
        x = block(x)
    zoo.loss(x, y).backward()                               # the loss is a SUM over samples

Families ``gpt``, ``resnet``, ``vgg``, ``mlp`` (block names and order as the analytic families in
:mod:`hetplan.profile.analytic`), and user models from a ``module:function`` factory. Every bad
input raises :class:`~hetplan.errors.HetplanError` with a field. See docs/profiling.md.
"""

from hetplan.models.base import ZooModel, derive_seed
from hetplan.models.factory import FactoryModel
from hetplan.models.registry import ZOO, resolve_model

__all__ = ["ZOO", "FactoryModel", "ZooModel", "derive_seed", "resolve_model"]
