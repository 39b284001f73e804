"""A user's model: a ``module:function`` that returns an ``nn.Sequential``, a list of blocks, a
:class:`~hetplan.models.spec.ModelSpec` (blocks with their own loss and samples, any dtype), or a
plain ``nn.Module`` whose forward chains its children (a torchvision classifier), split into blocks
by :mod:`hetplan.models.chain`.

    zoo = resolve_model({"factory": "user_models:build", "config": {"width": 16}, "input_shape": [8]})
    zoo.block_names()           # the Sequential's child names, or block0, block1, ...
    zoo = resolve_model({"factory": "torchvision:resnet50", "config": {"num_classes": 10},
                         "input_shape": [3, 64, 64]})   # torchvision.models.resnet50, split at its stages

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
A ModelSpec with a loss brings its own task instead (:class:`SpecTask`): its ``sample`` gives the
input's shape and dtype (int64 token ids, for example) and the probe checks its loss is a scalar.

Blocks that share a parameter (one module in two blocks, an embedding tied to a head) are found by
identity when the factory is first called (:meth:`FactoryModel.tied_parameters`).
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
from hetplan.models.chain import is_plain_model, split_chain
from hetplan.models.partial_build import build_on_meta, build_partially
from hetplan.models.spec import ModelSpec, check_reduction, summed_loss

__all__ = ["FactoryModel", "RegressionTask", "SpecTask", "load_factory"]

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


#: Short module names on the command line: ``torchvision:resnet50`` is ``torchvision.models:resnet50``.
ALIASES = {"torchvision": "torchvision.models"}


def load_factory(path: str) -> Callable[..., Any]:
    """Import ``module:function`` (``torchvision:NAME`` meaning ``torchvision.models:NAME``); every
    failure is a HetplanError at ``factory``."""
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise HetplanError(f"expected a factory as 'package.module:function', got {path!r}", field="factory")
    module_name, attr = path.split(":")
    module_name = ALIASES.get(module_name, module_name)
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


def _tied_groups(blocks: list[nn.Module]) -> list[tuple[tuple[int, str], ...]]:
    """Parameters that more than one block holds (by identity), as ``(block, name)`` groups."""
    where: dict[int, list[tuple[int, str]]] = {}
    for i, block in enumerate(blocks):
        for name, p in block.named_parameters():
            where.setdefault(id(p), []).append((i, name))
    return [tuple(members) for members in where.values() if len({b for b, _ in members}) > 1]


def _items(built: Any, where: str) -> list[tuple[str, Any]]:
    """A factory's result as ``(child name, block)`` pairs: a Sequential's children, a list's items,
    or a plain module split at its chain of child calls (:mod:`hetplan.models.chain`; the names are
    then paths in the model, and the blocks' keys its own)."""
    if isinstance(built, ModelSpec):
        built = built.blocks
    if isinstance(built, nn.Sequential):
        return list(built._modules.items())  # named_children() would drop a module used twice
    if isinstance(built, (list, tuple, nn.ModuleList)):
        return [(str(i), b) for i, b in enumerate(built)]
    if is_plain_model(built):
        return split_chain(built, where=where)
    raise HetplanError(
        f"{where} returned a {type(built).__name__}; expected an nn.Module, an nn.Sequential, a list of "
        "nn.Module or a hetplan.models.spec.ModelSpec",
        field="factory",
    )


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


class SpecTask:
    """A :class:`~hetplan.models.spec.ModelSpec`'s own task: its ``sample`` drawn once per sample from
    a generator seeded by (seed, step, i), its loss made a SUM over samples."""

    def __init__(self, factory: str, spec: ModelSpec) -> None:
        self.factory = factory
        self.draw = spec.sample
        self.user_loss = spec.loss
        self.reduction = check_reduction(spec.reduction, where=factory)
        x, y = self.one(torch.Generator().manual_seed(0))
        self.shape, self.dtype = tuple(x.shape), x.dtype
        self.target_shape, self.target_dtype = tuple(y.shape), y.dtype

    def one(self, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            item = self.draw(g)
        except Exception as exc:  # user code
            raise HetplanError(f"{self.factory}: sample() failed ({_first_line(exc)})", field="factory") from exc
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise HetplanError(f"{self.factory}: sample() returned a {type(item).__name__}; expected an "
                               "(input, target) pair", field="factory")  # fmt: skip
        try:
            return torch.as_tensor(item[0]), torch.as_tensor(item[1])
        except Exception:  # anything not array-like
            raise HetplanError(f"{self.factory}: sample() returned something that is not a tensor",
                               field="factory") from None  # fmt: skip

    def sample_batch(self, batch_size: int, *, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        _check_batch_size(batch_size)
        pairs = [self.one(sample_generator(seed, step, i)) for i in range(batch_size)]
        return torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs])

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        assert self.user_loss is not None
        return summed_loss(self.user_loss, self.reduction, output, targets, where=self.factory)


class FactoryModel(TaskModel):
    """A user model from a factory; see the module docstring."""

    def __init__(self, factory: str, config: Mapping[str, Any] | None, input_shape: Any) -> None:
        if config is not None and not isinstance(config, Mapping):
            raise HetplanError(f"expected a mapping of keyword arguments, got {config!r}", field="config")
        self.factory = factory
        self.config = dict(config or {})
        self._fn = load_factory(factory)
        self.spec: ModelSpec | None = None
        #: why the factory had to be called in full for a partial build (None: it never had to)
        self.built_whole: str | None = None
        try:  # the structure on meta: no process holds the whole model to learn its shape
            blocks, names = self._call(seed=0, meta=True)
            on_meta = True
        except Exception:  # the real call says what is wrong, in the user's terms
            blocks, names = self._call(seed=0)
            on_meta = False
        spec = self.spec
        if spec is not None and (spec.loss is not None) != (spec.sample is not None):
            raise HetplanError(
                f"{factory}: a ModelSpec with a loss needs sample() too, and sample() a loss", field="factory"
            )
        self.task: ClassificationTask | RegressionTask | SpecTask | None = None
        if spec is not None and spec.loss is not None:
            self.task = SpecTask(factory, spec)
            if input_shape is not None and tuple(_check_shape(input_shape)) != self.task.shape:
                raise HetplanError(
                    f"--input-shape {list(input_shape)} differs from the shape sample() gives, {list(self.task.shape)}",
                    field="--input-shape",
                )
            self.shape = self.task.shape
        else:
            self.shape = _check_shape(input_shape)
        self._names = names
        self._kinds = [type(b).__name__.lower() for b in blocks]
        self._tied = _tied_groups(blocks)
        try:
            out_shape = self._probe(blocks, names, meta=on_meta)
        except Exception:  # a probe that fails on meta runs again on real blocks: its errors are the user's
            if not on_meta:
                raise
            blocks, names = self._call(seed=0)
            out_shape = self._probe(blocks, names)
        if self.task is not None:  # the spec's own loss and samples
            pass
        elif len(out_shape) == 1 and out_shape[0] >= 2:
            self.task = ClassificationTask(self.shape, out_shape[0])
        else:
            self.task = RegressionTask(self.shape, out_shape)
        model: dict[str, Any] = {"factory": factory, "config": dict(self.config), "input_shape": list(self.shape)}
        super().__init__(model)

    def input_dtype(self) -> torch.dtype:
        return self.task.dtype if isinstance(self.task, SpecTask) else torch.float32

    def tied_parameters(self) -> list[tuple[tuple[int, str], ...]]:
        """Parameters the factory's blocks share (by identity), found when it was first called."""
        return list(self._tied)

    def tp_plan(self, index: int) -> dict[str, str] | None:
        """The part of the ModelSpec's ``tp_plan`` under block ``index`` (paths relative to it)."""
        if self.spec is None or self.spec.tp_plan is None:
            return None
        prefix = self._names[index] + "."
        return {k[len(prefix) :]: v for k, v in self.spec.tp_plan.items() if k.startswith(prefix)}

    def state_dict_keys(self, index: int) -> dict[str, str]:
        """Block ``index``'s keys -> ``<child name>.<key>``: the key in the factory's own
        ``nn.Sequential`` (``<i>.<key>`` for a list), so a user's ``model.state_dict()`` loads."""
        self._check_index(index)
        if getattr(self, "_structure", None) is None:
            try:
                self._structure = self._call(0, meta=True)[0]
            except Exception:  # a factory that cannot run on meta: a real call
                self._structure = self._call(0)[0]
        prefix = self._child_keys[index]
        keys = self._structure[index].state_dict()
        return self._canonical_keys(index, {key: f"{prefix}.{key}" if prefix else key for key in keys})

    def _invoke(self, seed: int) -> Any:
        """The factory's result, called with torch's RNG seeded from ``seed`` alone."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed("factory", seed))
            try:
                return self._fn(**self.config)
            except TypeError as exc:
                raise HetplanError(f"calling {self.factory} failed ({_first_line(exc)})", field="config") from exc
            except Exception as exc:  # user code
                raise HetplanError(f"calling {self.factory} failed ({_first_line(exc)})", field="factory") from exc

    def _call(self, seed: int, *, keep: range | None = None, meta: bool = False) -> tuple[list[nn.Module], list[str]]:
        """The factory's blocks: all real; on meta (``meta``); or only the blocks in ``keep`` real, with
        the values a full call gives them (:mod:`hetplan.models.partial_build`; a factory that cannot be
        built so is called in full)."""
        if meta:
            built = build_on_meta(lambda: self._invoke(seed))
        elif keep is not None:
            try:
                built = build_partially(
                    lambda: self._invoke(seed),
                    lambda b: [m for _, m in _items(b, self.factory)][keep.start : keep.stop],
                )
            except Exception as exc:  # any failure: the full call (which says what is wrong)
                self.built_whole = _first_line(exc)
                built = self._invoke(seed)
        else:
            built = self._invoke(seed)
        if isinstance(built, ModelSpec):
            self.spec = built
            built = built.blocks
        items = _items(built, self.factory)
        self.split = is_plain_model(built)  # the blocks' keys are the model's own
        if not items:
            raise HetplanError(f"{self.factory} returned no blocks", field="factory")
        for i, (_, block) in enumerate(items):
            if not isinstance(block, nn.Module):
                raise HetplanError(
                    f"{self.factory}: block {i} is a {type(block).__name__}, not an nn.Module", field="factory"
                )
        # the factory's own names: its state_dict's prefixes (none for a split model: keys are its own)
        self._child_keys = ["" if self.split else key for key, _ in items]
        names = [f"block{i}" if key.isdigit() else key for i, (key, _) in enumerate(items)]
        if len(set(names)) != len(names):
            names = [f"block{i}" for i in range(len(items))]
        return [b.train() for _, b in items], names

    def _probe(self, blocks: list[nn.Module], names: list[str], *, meta: bool = False) -> tuple[int, ...]:
        spec_task = self.task if isinstance(self.task, SpecTask) else None
        if spec_task is not None:
            x, y = spec_task.sample_batch(_PROBE_BATCH, seed=0, step=0)
        else:
            x = torch.randn((_PROBE_BATCH, *self.shape), generator=torch.Generator().manual_seed(0))
        if meta:  # blocks built on meta: shapes only
            x = x.to("meta")
            y = y.to("meta") if spec_task is not None else None
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
            if spec_task is not None:
                spec_task.loss(x, y)  # a scalar, or one line naming the factory
        return tuple(x.shape[1:])

    def block_names(self) -> list[str]:
        return list(self._names)

    def block_kinds(self) -> list[str]:
        return list(self._kinds)

    def _new_block(self, index: int) -> nn.Module:  # pragma: no cover - build_block is overridden
        raise NotImplementedError

    def build_block(self, index: int, seed: int) -> nn.Module:
        """Block ``index`` of the factory's model built with the RNG seeded from ``seed`` (only it real)."""
        self._check_index(index)
        return self._call(seed, keep=range(index, index + 1))[0][index]

    def build_blocks(self, start: int, end: int, seed: int) -> list[nn.Module]:
        """Blocks ``[start, end)`` from one factory call (the same as :meth:`build_block` each)."""
        if not 0 <= start <= end <= self.n_blocks:
            raise HetplanError(f"expected 0 <= start <= end <= {self.n_blocks}, got [{start}, {end})", field="blocks")
        if torch.get_default_device().type == "meta":  # shapes only
            return self._call(seed, meta=True)[0][start:end]
        return self._call(seed, keep=range(start, end))[0][start:end]
