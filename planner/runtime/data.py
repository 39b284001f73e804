"""Which samples of the global batch a rank computes, and where a step's samples come from.

    samples = open_samples(model, zoo, global_batch=64, seed=0, dataset="my_data:build")
    batch = samples.step(7)                          # once per step, on ranks that need data
    inputs, targets = batch.rows(lo, hi)             # global-batch positions [lo, hi)

A rank's positions are its pipeline's offset + the micro-batch's offset + its replica's offset
(:func:`pipeline_offsets`, :func:`micro_offsets`, the compiled program's ``offsets``). Every source is
deterministic in (seed, step, position), so every rank sees the same global batch and no data crosses
a process:

* the zoo's synthetic task or a text file (``--data``): the whole global batch is made (cheaply,
  sample by sample from seeded generators) and sliced, as before;
* a user's dataset (``--dataset``, :mod:`hetplan.runtime.dataset`): only the positions asked for are
  read, one ``__getitem__`` per sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch

from hetplan.contracts.plan import Plan
from hetplan.errors import HetplanError
from hetplan.models import ZooModel
from hetplan.runtime.dataset import FIELD, UserDataset
from hetplan.runtime.textdata import batches_for

__all__ = ["Samples", "StepRows", "micro_offsets", "open_samples", "pipeline_offsets"]


def pipeline_offsets(plan: Plan) -> list[int]:
    """Where each pipeline's share starts in the global batch."""
    out, total = [], 0
    for p in plan.pipelines:
        out.append(total)
        total += p.batch
    return out


def micro_offsets(micro_batches: tuple[int, ...]) -> list[int]:
    """Where each micro-batch starts inside its pipeline's share."""
    out, total = [], 0
    for m in micro_batches:
        out.append(total)
        total += m
    return out


class StepRows(Protocol):
    """One step's global batch, read by position."""

    def rows(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of global-batch positions ``[lo, hi)``, on the CPU."""
        ...


class Samples(Protocol):
    """Where a run's samples come from."""

    def step(self, step: int) -> StepRows:
        """Step ``step``'s global batch (held only while the step runs)."""
        ...


class _Sliced:
    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.inputs, self.targets = inputs, targets

    def rows(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[lo:hi], self.targets[lo:hi]


class _Generated:
    """The zoo's task or a text file: the global batch is made whole, then sliced."""

    def __init__(self, batches: Any, global_batch: int, seed: int) -> None:
        self.batches, self.global_batch, self.seed = batches, global_batch, seed

    def step(self, step: int) -> StepRows:
        return _Sliced(*self.batches.sample_batch(self.global_batch, seed=self.seed, step=step))


class _Read:
    """A user's dataset: each ``rows`` reads its positions only."""

    def __init__(self, dataset: UserDataset, step: int) -> None:
        self.dataset, self.index = dataset, step

    def rows(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.dataset.read(self.index, lo, hi)


class _Dataset:
    def __init__(self, dataset: UserDataset) -> None:
        self.dataset = dataset

    def step(self, step: int) -> StepRows:
        return _Read(self.dataset, step)


def open_samples(
    model: dict[str, Any],
    zoo: ZooModel,
    *,
    global_batch: int,
    seed: int,
    data: str | None = None,
    dataset: str | None = None,
    dataset_kwargs: Mapping[str, Any] | None = None,
) -> Samples:
    """The run's sample source: a user's dataset, a text file, or the zoo's synthetic task."""
    if dataset and data:
        raise HetplanError("give --data (a text file) or --dataset (a module), not both", field=FIELD)
    if dataset:
        return _Dataset(UserDataset(dataset, dataset_kwargs, zoo=zoo, global_batch=global_batch, seed=seed))
    return _Generated(batches_for(model, zoo, data), global_batch, seed)
