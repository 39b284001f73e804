"""What every zoo model promises the profiler and the runtime: blocks, a synthetic task, a loss.

    zoo = resolve_model({"family": "mlp", "config": {"layers": 3, "width": 64}})
    blocks = zoo.build_blocks(0, zoo.n_blocks, seed=0)     # == [zoo.build_block(i, 0) for i in ...]
    x, y = zoo.sample_batch(8, seed=0, step=0)             # x[:4] == zoo.sample_batch(4, ...)[0]
    loss = zoo.loss(run(blocks, x), y)                     # a SUM over the samples

Determinism is the point of this module. A block is built with torch's global RNG forked and seeded
from ``(seed, index)`` alone (:func:`derive_seed`), so a rank that builds only blocks 9..17 gets the
very parameters a single process building all of them gets. A batch is made sample by sample, each
from a generator seeded from ``(seed, step, i)``, so sample ``i`` does not depend on the batch size
and a data-parallel rank can make just its slice. Every seed goes through SHA-256, so nearby seeds
give unrelated streams and the numbers are the same on every machine and every torch version that
keeps its CPU generator (the generators run on the CPU; tensors are moved afterwards).
"""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from hetplan.errors import HetplanError

__all__ = [
    "FEATURES",
    "ClassificationTask",
    "ZooModel",
    "derive_seed",
    "sample_generator",
    "share_tied",
    "uninitialised",
]

#: The classification teacher looks at this many averaged input features (a fixed linear map).
FEATURES = 256


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts (ints, strings): SHA-256 of their text, stable everywhere."""
    text = ":".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") & ((1 << 63) - 1)


def sample_generator(seed: int, step: int, index: int, stream: str = "sample") -> torch.Generator:
    """A CPU generator for sample ``index`` of step ``step`` (independent of the batch size)."""
    return torch.Generator().manual_seed(derive_seed(stream, seed, step, index))


def uninitialised(module_cls: type[nn.Module], *args: Any, **kwargs: Any) -> nn.Module:
    """``module_cls(*args, **kwargs)`` with its parameters left uninitialised, for a layer whose
    weights the caller draws itself (once, instead of twice: fc6 of VGG has 103M of them).

    Like ``torch.nn.utils.skip_init``, but made on the current default device, so that building
    under ``with torch.device("meta")`` (shape inference without memory) stays on meta.
    """
    return module_cls(*args, device="meta", **kwargs).to_empty(device=torch.get_default_device())


class ZooModel(ABC):
    """A model as an ordered list of blocks, each built alone and deterministically.

    Attributes:
        model: the normalised ``model`` section of a profile (full config, defaults included).
        n_blocks: how many blocks.

    Subclasses implement :meth:`block_names`, :meth:`block_kinds`, :meth:`_new_block`,
    :meth:`sample_batch`, :meth:`loss`, :meth:`input_dtype` and :meth:`sample_shape`.
    """

    model: dict[str, Any]
    n_blocks: int

    def __init__(self, model: dict[str, Any]) -> None:
        self.model = model
        self.n_blocks = len(self.block_names())

    @abstractmethod
    def block_names(self) -> list[str]:
        """Block names in order (the analytic family's names for zoo families)."""

    @abstractmethod
    def block_kinds(self) -> list[str]:
        """Block kinds in order (``attention``, ``mlp``, ``conv``, ...), as the analytic family's."""

    @abstractmethod
    def _new_block(self, index: int) -> nn.Module:
        """Construct block ``index``; called with the global RNG already seeded."""

    def _check_index(self, index: int) -> None:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.n_blocks:
            raise HetplanError(f"expected a block index in [0, {self.n_blocks}), got {index!r}", field="blocks")

    def build_block(self, index: int, seed: int) -> nn.Module:
        """Block ``index`` on the CPU in fp32 and training mode, its parameters fixed by ``(seed, index)``.

        The global RNG is forked, so building a block leaves the caller's random state as it was.
        """
        self._check_index(index)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed("block", seed, index))
            block = self._new_block(index)
        self._copy_tied(index, block, seed)
        return block.train()

    def build_blocks(self, start: int, end: int, seed: int) -> list[nn.Module]:
        """Blocks ``[start, end)``; bit for bit the same as building each with :meth:`build_block`,
        and a tied parameter held by two of them is one ``Parameter`` (shared, as in the model)."""
        if not 0 <= start <= end <= self.n_blocks:
            raise HetplanError(f"expected 0 <= start <= end <= {self.n_blocks}, got [{start}, {end})", field="blocks")
        blocks = [self.build_block(i, seed) for i in range(start, end)]
        share_tied(self.tied_parameters(), dict(zip(range(start, end), blocks, strict=True)))
        return blocks

    # -- tied parameters and the model's own names (the zoo has none tied; HF and factory models may) ---
    def tied_parameters(self) -> list[tuple[tuple[int, str], ...]]:
        """Parameters shared between blocks: groups of ``(block index, parameter name)``, each group
        in block order, its first member the canonical one (the one a profile counts and a state
        dict names). A rank holding several members of a group holds one ``Parameter``; ranks
        holding members of one group sum their gradients (:mod:`hetplan.runtime.parallel.tied`)."""
        return []

    def _copy_tied(self, index: int, block: nn.Module, seed: int) -> None:
        """Give block ``index``'s non-canonical tied parameters the canonical member's values, so a
        rank building the head alone holds the embedding's weights (building the owner block once)."""
        for group in self.tied_parameters():
            owner_block, owner_name = group[0]
            if owner_block == index:
                continue
            mine = [name for b, name in group[1:] if b == index]
            if not mine:
                continue
            source = self.build_block(owner_block, seed).get_parameter(owner_name)
            with torch.no_grad():
                for name in mine:
                    block.get_parameter(name).copy_(source)

    def state_dict_keys(self, index: int) -> dict[str, str]:
        """Each key of block ``index``'s ``state_dict()`` -> its key in the model's own full state
        dict (a tied key -> the canonical member's key). The zoo's default: ``<block name>.<key>``."""
        self._check_index(index)
        with torch.device("meta"):
            block = self._new_block(index)
        name = self.block_names()[index]
        out = {key: f"{name}.{key}" for key in block.state_dict()}
        return self._canonical_keys(index, out)

    def _canonical_keys(self, index: int, keys: dict[str, str]) -> dict[str, str]:
        """``keys`` with every tied member's parameter renamed to its group's canonical key."""
        own = dict(keys)
        for group in self.tied_parameters():
            owner_block, owner_name = group[0]
            for b, name in group:
                if b == index and (b, name) != group[0] and name in keys:
                    owner = own if owner_block == index else self.state_dict_keys(owner_block)
                    keys[name] = owner[owner_name]
        return keys

    def hf_config(self) -> Any:
        """The ``transformers`` config of a Hugging Face model; None for every other model."""
        return None

    def tp_plan(self, index: int) -> dict[str, str] | None:
        """Block ``index``'s tensor-parallel plan for user models (``{module path: "colwise" |
        "rowwise"}``, empty for a replicated block), or None where the model declares none."""
        return None

    @abstractmethod
    def sample_batch(self, batch_size: int, *, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)`` of the synthetic task, on the CPU; sample ``i`` independent of the size."""

    @abstractmethod
    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The SUM over samples of the per-sample loss (computed in fp32)."""

    @abstractmethod
    def input_dtype(self) -> torch.dtype:
        """dtype of the batch input as :meth:`sample_batch` makes it (floats are fp32; cast as needed)."""

    @abstractmethod
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one sample of the input."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r})"


def share_tied(groups: list[tuple[tuple[int, str], ...]], blocks: dict[int, nn.Module]) -> None:
    """Make the members of each tied group present in ``blocks`` (index -> block) one Parameter:
    the first present member's, set on the others' modules."""
    for group in groups:
        present = [(b, name) for b, name in group if b in blocks]
        if len(present) < 2:
            continue
        first = blocks[present[0][0]].get_parameter(present[0][1])
        for b, name in present[1:]:
            owner_path, _, attr = name.rpartition(".")
            owner = blocks[b].get_submodule(owner_path) if owner_path else blocks[b]
            setattr(owner, attr, first)


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise HetplanError(f"expected a positive batch size, got {batch_size!r}", field="batch_size")


def teacher_features(x: torch.Tensor) -> torch.Tensor:
    """One sample's input reduced to at most :data:`FEATURES` numbers: averages of adjacent runs of
    its flattened values (a fixed linear map of the input)."""
    flat = x.reshape(1, 1, -1).float()
    if flat.shape[-1] <= FEATURES:
        return flat.reshape(-1)
    return F.adaptive_avg_pool1d(flat, FEATURES).reshape(-1)


class ClassificationTask:
    """Random normal inputs, labels from a fixed random linear teacher: ``argmax(W · features(x))``.

    The teacher's ``W`` is fixed by the seed; labels are computed one sample at a time, so a sample's
    label cannot depend on the batch it is in. A network with a linear path from its input (every
    MLP, every CNN) can learn it, so the loss falls from ``log(classes)``.
    """

    def __init__(self, shape: tuple[int, ...], classes: int) -> None:
        self.shape = shape
        self.classes = classes
        self._teachers: dict[int, torch.Tensor] = {}

    def teacher(self, seed: int) -> torch.Tensor:
        if seed not in self._teachers:
            n = min(FEATURES, math.prod(self.shape))
            g = torch.Generator().manual_seed(derive_seed("teacher", seed))
            self._teachers[seed] = torch.randn(self.classes, n, generator=g)
        return self._teachers[seed]

    def sample_batch(self, batch_size: int, *, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        _check_batch_size(batch_size)
        w = self.teacher(seed)
        xs, ys = [], []
        for i in range(batch_size):
            x = torch.randn(self.shape, generator=sample_generator(seed, step, i))
            xs.append(x)
            ys.append(torch.argmax(w @ teacher_features(x)))
        return torch.stack(xs), torch.stack(ys).long()

    @staticmethod
    def loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.float(), targets, reduction="sum")


class TaskModel(ZooModel):
    """A model trained on a synthetic task (``self.task``, set by the subclass: a
    :class:`ClassificationTask`, or a factory model's regression task): batches, loss, input dtype
    and per-sample shape all come from the task."""

    task: Any

    def sample_batch(self, batch_size: int, *, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.task.sample_batch(batch_size, seed=seed, step=step)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The task's loss, summed over samples (cross-entropy, or mean squared error per sample)."""
        return self.task.loss(output, targets)

    def input_dtype(self) -> torch.dtype:
        return torch.float32

    def sample_shape(self) -> tuple[int, ...]:
        return self.task.shape
