"""A user's dataset (``hetplan launch --dataset pkg.mod:build``): read by global-batch position.

    data = UserDataset("my_data:build", {"root": "data/"}, zoo=zoo, global_batch=64, seed=0)
    inputs, targets = data.read(step=7, lo=16, hi=24)     # samples 16..23 of step 7's global batch

``pkg.mod:build`` is imported like a factory model (``sys.path``, then the working directory) and
called with the keyword arguments; it returns a map-style dataset (``__len__``, ``__getitem__``
giving an ``(input, target)`` pair of tensors), such as a ``torch.utils.data.Dataset``.

Which sample is where: the steps walk epochs of ``len // global_batch`` steps (the remainder of an
epoch is dropped, as a ``DataLoader`` with ``drop_last``); epoch ``e`` is a permutation of the
dataset drawn from a generator seeded by (seed, e), and step ``k``'s global batch is the next
``global_batch`` entries of it. Position ``i`` of the global batch therefore names one dataset index,
the same on every rank, and a rank reads only the positions of its own samples (pipeline, micro-batch
and replica offsets, :mod:`hetplan.runtime.data`): no data crosses a process, and a rank that needs
none (a middle stage) reads nothing. The single-process reference reads positions ``[0, B)``.

Every sample read is checked against what the model takes (the zoo's own task says: the input's
shape and kind, integer ids or floats; the target's shape and kind; ids inside the vocabulary or
the class count), so a wrong dataset fails with one line naming the sample, not deep in a forward.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hetplan.errors import HetplanError
from hetplan.models import ZooModel, derive_seed
from hetplan.models.base import ClassificationTask
from hetplan.models.factory import load_factory

__all__ = ["FIELD", "SampleSpec", "UserDataset", "check_dataset"]

#: Where a dataset's errors are located (the CLI option that names it).
FIELD = "--dataset"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _shape(t: torch.Tensor | tuple[int, ...]) -> list[int]:
    return list(t.shape if isinstance(t, torch.Tensor) else t)


@dataclass(frozen=True)
class SampleSpec:
    """What one sample must look like for a model: shapes, kinds (integer or float) and id bounds."""

    input_shape: tuple[int, ...]
    input_dtype: torch.dtype
    input_bound: int | None  # integer inputs lie in [0, bound) (a vocabulary), or None
    target_shape: tuple[int, ...]
    target_dtype: torch.dtype
    target_bound: int | None  # integer targets lie in [0, bound) (classes or vocabulary), or None
    ignore_index: int | None = None  # a target id the loss skips (-100 for transformers' labels)

    @classmethod
    def of(cls, zoo: ZooModel, seed: int) -> SampleSpec:
        """The spec the model's own synthetic task meets (one sample of it is made to see); a model
        with ``id_bounds()`` (a transformers LM) states its id ranges itself."""
        _, target = zoo.sample_batch(1, seed=seed, step=0)
        config = zoo.model.get("config") or {}
        vocab = config.get("vocab") if isinstance(config, Mapping) else None
        task = getattr(zoo, "task", None)
        classes = task.classes if isinstance(task, ClassificationTask) else vocab
        ignore = None
        if hasattr(zoo, "id_bounds"):
            vocab, classes, ignore = zoo.id_bounds()
        in_dtype = zoo.input_dtype()
        return cls(
            input_shape=tuple(zoo.sample_shape()),
            input_dtype=in_dtype,
            input_bound=None if in_dtype.is_floating_point else vocab,
            target_shape=tuple(target.shape[1:]),
            target_dtype=target.dtype,
            target_bound=None if target.dtype.is_floating_point else classes,
            ignore_index=ignore,
        )

    def check(self, value: Any, what: str, where: str) -> torch.Tensor:
        """``value`` (the input or the target of one sample) as a tensor of the model's dtype."""
        shape, dtype, bound = (
            (self.input_shape, self.input_dtype, self.input_bound)
            if what == "input"
            else (self.target_shape, self.target_dtype, self.target_bound)
        )
        if not isinstance(value, torch.Tensor):
            try:
                value = torch.as_tensor(value)
            except Exception:  # anything that is not array-like
                raise HetplanError(
                    f"{where}: the {what} is a {type(value).__name__}, not a tensor", field=FIELD
                ) from None
        if tuple(value.shape) != shape:
            raise HetplanError(
                f"{where}: the {what} has shape {_shape(value)}; the model takes {_shape(shape)}", field=FIELD
            )
        given = value.dtype
        integer = not (given.is_floating_point or given.is_complex or given == torch.bool)
        if not (given.is_floating_point if dtype.is_floating_point else integer):
            kind = "floating-point values" if dtype.is_floating_point else "integer ids"
            raise HetplanError(f"{where}: the {what} is {given}; the model takes {kind}", field=FIELD)
        counted = value
        if what == "target" and self.ignore_index is not None and value.numel():
            counted = value[value != self.ignore_index]
        if bound is not None and counted.numel():
            low, high = int(counted.min()), int(counted.max())
            if low < 0 or high >= bound:
                bad = low if low < 0 else high
                raise HetplanError(
                    f"{where}: the {what} holds id {bad}; the model takes ids in [0, {bound})", field=FIELD
                )
        return value.detach().to(dtype)


class UserDataset:
    """A map-style dataset from ``module:function``, read by (step, global-batch position)."""

    def __init__(
        self,
        spec: str,
        kwargs: Mapping[str, Any] | None,
        *,
        zoo: ZooModel,
        global_batch: int,
        seed: int,
    ) -> None:
        if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
            raise HetplanError(f"expected a dataset as 'package.module:function', got {spec!r}", field=FIELD)
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise HetplanError(f"expected a mapping of keyword arguments, got {kwargs!r}", field=FIELD)
        try:
            build = load_factory(spec)
        except HetplanError as exc:
            raise HetplanError(exc.reason, field=FIELD) from None
        try:
            dataset = build(**dict(kwargs or {}))
        except Exception as exc:  # user code
            raise HetplanError(f"calling {spec} failed ({_first_line(exc)})", field=FIELD) from None
        kind = type(dataset)
        if (
            isinstance(dataset, torch.utils.data.IterableDataset)
            or not hasattr(kind, "__len__")
            or not hasattr(kind, "__getitem__")
        ):
            raise HetplanError(
                f"{spec} returned a {kind.__name__}; expected a map-style dataset (__len__ and __getitem__, "
                "such as a torch.utils.data.Dataset)",
                field=FIELD,
            )
        try:
            size = len(dataset)
        except Exception as exc:  # user code
            raise HetplanError(f"len() of {spec}'s dataset failed ({_first_line(exc)})", field=FIELD) from None
        if size < global_batch:
            raise HetplanError(f"{spec} has {size} samples; a step needs a global batch of {global_batch}", field=FIELD)
        self.spec = spec
        self.dataset = dataset
        self.size = size
        self.global_batch = global_batch
        self.seed = seed
        self.steps_per_epoch = size // global_batch
        self.sample_spec = SampleSpec.of(zoo, seed)
        self._epoch: tuple[int, torch.Tensor] | None = None

    def permutation(self, epoch: int) -> torch.Tensor:
        """Epoch ``epoch``'s order of the dataset (the last epoch's is kept: steps go forward)."""
        if self._epoch is None or self._epoch[0] != epoch:
            g = torch.Generator().manual_seed(derive_seed("dataset", self.seed, epoch))
            self._epoch = (epoch, torch.randperm(self.size, generator=g))
        return self._epoch[1]

    def indices(self, step: int, lo: int, hi: int) -> list[int]:
        """The dataset indices of positions ``[lo, hi)`` of step ``step``'s global batch."""
        epoch, k = divmod(step, self.steps_per_epoch)
        start = k * self.global_batch
        return self.permutation(epoch)[start + lo : start + hi].tolist()

    def read(self, step: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of positions ``[lo, hi)`` of step ``step``, checked, on the CPU."""
        inputs, targets = [], []
        for index in self.indices(step, lo, hi):
            where = f"{self.spec}: sample {index} (step {step})"
            try:
                item = self.dataset[index]
            except Exception as exc:  # user code
                raise HetplanError(f"{where}: reading it failed ({_first_line(exc)})", field=FIELD) from None
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                got = f"a {type(item).__name__}" + (f" of {len(item)}" if isinstance(item, (tuple, list)) else "")
                raise HetplanError(f"{where}: is {got}; expected an (input, target) pair", field=FIELD)
            inputs.append(self.sample_spec.check(item[0], "input", where))
            targets.append(self.sample_spec.check(item[1], "target", where))
        return torch.stack(inputs), torch.stack(targets)


def check_dataset(
    model: Mapping[str, Any], spec: str, kwargs: Mapping[str, Any] | None, *, global_batch: int, seed: int
) -> UserDataset:
    """Open the dataset and read step 0's first sample: what ``hetplan launch`` runs before it spawns
    any rank, so that a wrong dataset is one line from the command rather than one from every rank."""
    from hetplan.models import resolve_model

    dataset = UserDataset(spec, kwargs, zoo=resolve_model(model), global_batch=global_batch, seed=seed)
    dataset.read(0, 0, 1)
    return dataset
