"""A user's model: a ``module:function`` that returns an ``nn.Sequential`` or a list of blocks.

    zoo = resolve_model({"factory": "user_models:build", "config": {"width": 16}, "input_shape": [8]})
    zoo.block_names()           # the Sequential's child names, or block0, block1, ...

The factory is imported (from ``sys.path`` or the current directory) and called with ``**config``
under a seeded RNG, once for a probe: the blocks are run in order on a batch of two random inputs
of ``input_shape``, so a shape that does not fit, a block that returns a tuple, or blocks that do
not chain fail here, with one line naming the block, rather than deep inside a measurement or a
pipeline.

Determinism: a factory builds all its blocks in one go, so block ``i`` cannot be built alone. The
factory is called with torch's RNG seeded from ``seed`` alone (not ``(seed, index)``) and block ``i``
taken from its result: every rank that builds block ``i`` calls the factory the same way and gets the
same parameters, and the user's own initialisation is kept. The cost is that every rank constructs
the whole model once (on the CPU) and keeps only its blocks.

The synthetic task follows the probe's output: a ``[B, C]`` output (C >= 2) is a classification
with labels from a fixed random linear teacher; any other output is a regression to
``tanh(z(x)) · T``, ``T`` a fixed random tensor of the output's shape and ``z`` a fixed linear
function of the input, with the per-sample mean squared error as the loss. Inputs are fp32.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import torch
from torch import nn

from hetplan.errors import HetplanError
from hetplan.models.base import (
    ClassificationTask,
    TaskModel,
    _check_batch_size,
    derive_seed,
    sample_generator,
)

__all__ = ["FactoryModel", "RegressionTask", "load_factory"]

_PROBE_BATCH = 2  # two samples, so BatchNorm in training mode has statistics to compute


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _import(module_name: str) -> ModuleType:
    """Import ``module_name``, also from the current directory: a console script such as
    ``hetplan`` does not put it on ``sys.path`` the way ``python -m`` does."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        if exc.name != module_name.split(".")[0] or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError:
            sys.path.remove(cwd)
            raise


def load_factory(path: str) -> Callable[..., Any]:
    """Import ``module:function``; every failure is a HetplanError at ``factory``."""
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise HetplanError(f"expected a factory as 'package.module:function', got {path!r}", field="factory")
    module_name, attr = path.split(":")
    try:
        module = _import(module_name)
    except Exception as exc:  # a user's module may fail to import in any way
        raise HetplanError(f"cannot import module {module_name!r} ({_first_line(exc)})", field="factory") from exc
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise HetplanError(f"module {module_name!r} has no attribute {attr!r}", field="factory")
        fn = getattr(fn, part)
    if not callable(fn):
        raise HetplanError(f"{path!r} is not callable (it is a {type(fn).__name__})", field="factory")
    return fn


def _check_shape(shape: Any) -> tuple[int, ...]:
    if shape is None:
        raise HetplanError(
            "a factory model needs input_shape, the shape of one sample (for example 3,224,224)", field="--input-shape"
        )
    if not isinstance(shape, (list, tuple)) or not shape:
        raise HetplanError(f"expected a non-empty list of positive integers, got {shape!r}", field="--input-shape")
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise HetplanError(f"expected positive integers in the input shape, got {n!r}", field="--input-shape")
    return tuple(shape)


class RegressionTask:
    """Targets ``tanh(z(x)) · T``: ``z`` the input's sum over sqrt(its size) (about N(0, 1) for normal
    inputs), ``T`` a fixed random tensor of the output's per-sample shape. Loss: per-sample MSE, summed."""

    def __init__(self, shape: tuple[int, ...], out_shape: tuple[int, ...]) -> None:
        self.shape = shape
        self.out_shape = out_shape
        self._patterns: dict[int, torch.Tensor] = {}

    def pattern(self, seed: int) -> torch.Tensor:
        if seed not in self._patterns:
            g = torch.Generator().manual_seed(derive_seed("teacher", seed))
            self._patterns[seed] = torch.randn(self.out_shape, generator=g)
        return self._patterns[seed]

    def sample_batch(self, batch_size: int, *, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        _check_batch_size(batch_size)
        pattern = self.pattern(seed)
        xs, ys = [], []
        for i in range(batch_size):
            x = torch.randn(self.shape, generator=sample_generator(seed, step, i))
            xs.append(x)
            ys.append(torch.tanh(x.sum() / math.sqrt(x.numel())) * pattern)
        return torch.stack(xs), torch.stack(ys)

    @staticmethod
    def loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        diff = output.float() - targets.float()
        return (diff * diff).reshape(diff.shape[0], -1).mean(dim=1).sum()


class FactoryModel(TaskModel):
    """A user model from a factory; see the module docstring."""

    def __init__(self, factory: str, config: Mapping[str, Any] | None, input_shape: Any) -> None:
        if config is not None and not isinstance(config, Mapping):
            raise HetplanError(f"expected a mapping of keyword arguments, got {config!r}", field="config")
        self.factory = factory
        self.config = dict(config or {})
        self.shape = _check_shape(input_shape)
        self._fn = load_factory(factory)
        blocks, names = self._call(seed=0)
        self._names = names
        self._kinds = [type(b).__name__.lower() for b in blocks]
        out_shape = self._probe(blocks, names)
        if len(out_shape) == 1 and out_shape[0] >= 2:
            self.task: ClassificationTask | RegressionTask = ClassificationTask(self.shape, out_shape[0])
        else:
            self.task = RegressionTask(self.shape, out_shape)
        super().__init__({"factory": factory, "config": dict(self.config), "input_shape": list(self.shape)})

    def _call(self, seed: int) -> tuple[list[nn.Module], list[str]]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed("factory", seed))
            try:
                built = self._fn(**self.config)
            except TypeError as exc:
                raise HetplanError(f"calling {self.factory} failed ({_first_line(exc)})", field="config") from exc
            except Exception as exc:  # user code
                raise HetplanError(f"calling {self.factory} failed ({_first_line(exc)})", field="factory") from exc
        if isinstance(built, nn.Sequential):
            items = list(built.named_children())
        elif isinstance(built, (list, tuple, nn.ModuleList)):
            items = [(str(i), b) for i, b in enumerate(built)]
        else:
            raise HetplanError(
                f"{self.factory} returned a {type(built).__name__}; expected an nn.Sequential or a list of nn.Module",
                field="factory",
            )
        if not items:
            raise HetplanError(f"{self.factory} returned no blocks", field="factory")
        for i, (_, block) in enumerate(items):
            if not isinstance(block, nn.Module):
                raise HetplanError(
                    f"{self.factory}: block {i} is a {type(block).__name__}, not an nn.Module", field="factory"
                )
        names = [f"block{i}" if key.isdigit() else key for i, (key, _) in enumerate(items)]
        if len(set(names)) != len(names):
            names = [f"block{i}" for i in range(len(items))]
        return [b.train() for _, b in items], names

    def _probe(self, blocks: list[nn.Module], names: list[str]) -> tuple[int, ...]:
        x = torch.randn((_PROBE_BATCH, *self.shape), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            for i, (block, name) in enumerate(zip(blocks, names, strict=True)):
                shape = list(x.shape)
                try:
                    out = block(x)
                except Exception as exc:  # user code: report one line
                    field = "--input-shape" if i == 0 else "factory"
                    what = "the input shape does not fit the model" if i == 0 else "blocks do not chain"
                    raise HetplanError(
                        f"{what}: block {i} ({name}) failed on an input of shape {shape} ({_first_line(exc)})",
                        field=field,
                    ) from exc
                if not isinstance(out, torch.Tensor):
                    raise HetplanError(
                        f"block {i} ({name}) returned a {type(out).__name__}; every block must return one tensor",
                        field="factory",
                    )
                if out.dim() == 0 or out.shape[0] != _PROBE_BATCH:
                    raise HetplanError(
                        f"block {i} ({name}) returned shape {list(out.shape)}; the first dimension must stay the batch",
                        field="factory",
                    )
                x = out
        return tuple(x.shape[1:])

    def block_names(self) -> list[str]:
        return list(self._names)

    def block_kinds(self) -> list[str]:
        return list(self._kinds)

    def _new_block(self, index: int) -> nn.Module:  # pragma: no cover - build_block is overridden
        raise NotImplementedError

    def build_block(self, index: int, seed: int) -> nn.Module:
        """Block ``index`` of the factory's model built with the RNG seeded from ``seed``."""
        self._check_index(index)
        return self._call(seed)[0][index]

    def build_blocks(self, start: int, end: int, seed: int) -> list[nn.Module]:
        """Blocks ``[start, end)`` from one factory call (the same as :meth:`build_block` each)."""
        if not 0 <= start <= end <= self.n_blocks:
            raise HetplanError(f"expected 0 <= start <= end <= {self.n_blocks}, got [{start}, {end})", field="blocks")
        return self._call(seed)[0][start:end]
