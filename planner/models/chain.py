"""A plain ``nn.Module`` whose forward is a chain of child calls, split into blocks without a wrapper.

    blocks = split_chain(torchvision.models.resnet50(num_classes=10), where="torchvision:resnet50")
    [name for name, _ in blocks]     # ['conv1', 'layer1.0', ..., 'layer4.2', 'fc']
    blocks[0][1].state_dict().keys() # conv1.weight, bn1.weight, ...: the model's own keys

Why: a torchvision classifier (``ResNet``, ``VGG``, ...) is one module whose ``forward`` calls its
children in turn (``conv1``, ``bn1``, ``relu``, ``maxpool``, ``layer1`` .. ``layer4``, ``avgpool``,
``torch.flatten``, ``fc``). Tracing it with :func:`torch.fx.symbolic_trace` (children left whole,
except an ``nn.Sequential`` child such as ``layer1`` or ``features``, whose children are its stages)
gives that sequence; when every operation takes the previous one's output and nothing else, the
model is a chain and may be cut between any two operations. Anything else (a branch, a skip
connection across children, control flow on values) is refused with one line naming the module
and the node, since cutting it would need more than one tensor between blocks.

How it is cut, as the zoo splits its own models: a composite child (a module with children of its
own: a residual block, a transformer layer, a nested Sequential) is a block of its own; a run of torch layers between
them is cut before each weight layer (convolution, linear, embedding), so normalisation layers,
activations, pooling, dropout and shape operations stay with the weight layer before them (a
leading run of them with the weight layer after). ResNet: the stem (conv1, bn1, relu, maxpool),
each bottleneck, the head (avgpool, flatten, fc). VGG: each convolution with its ReLU (and pool).

Each block (:class:`Segment`) holds its modules at their paths in the model (``layer1.0``), so its
state-dict keys are the model's own: a checkpoint consolidates to the model's ``state_dict`` and
``--init-from`` reads a plain ``torch.save(model.state_dict())``. A module the chain calls twice is
one module in two blocks: a tied parameter, found by identity as for any factory.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.utils._pytree import tree_map

from hetplan.errors import HetplanError

__all__ = ["Segment", "is_plain_model", "split_chain"]

#: Layers that start a block in a run of torch layers (the rest join the block before them).
_WEIGHT_LAYERS = (
    nn.Linear,
    nn.Bilinear,
    nn.Embedding,
    nn.EmbeddingBag,
    nn.modules.conv._ConvNd,
)


class _Chained:
    """The chain's value in a function step's arguments."""


_CHAINED = _Chained()


@dataclass(frozen=True)
class _Step:
    """One operation of the chain: a module at ``path``, or a function / method with constant
    arguments around the chain's value."""

    op: str  # "call_module", "call_function" or "call_method"
    target: Any  # the module's path, the function, or the method's name
    args: tuple = ()
    kwargs: tuple = ()  # (name, value) pairs

    def label(self) -> str:
        if self.op == "call_module":
            return str(self.target)
        return getattr(self.target, "__name__", str(self.target))


class _Holder(nn.Module):
    """A container that only gives a module its path (``layer1`` holding ``0``)."""


class Segment(nn.Module):
    """Consecutive operations of a chained model, its modules kept at their paths in the model."""

    def __init__(self, root: nn.Module, steps: list[_Step]) -> None:
        super().__init__()
        self._steps = list(steps)
        for step in steps:
            if step.op == "call_module":
                _attach(self, str(step.target), root.get_submodule(str(step.target)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for step in self._steps:
            if step.op == "call_module":
                x = self.get_submodule(step.target)(x)
                continue
            args, kwargs = tree_map(lambda a, x=x: x if a is _CHAINED else a, (step.args, dict(step.kwargs)))
            x = (
                step.target(*args, **kwargs)
                if step.op == "call_function"
                else getattr(args[0], step.target)(*args[1:], **kwargs)
            )
        return x

    def extra_repr(self) -> str:
        return " -> ".join(step.label() for step in self._steps)


def _attach(holder: nn.Module, path: str, module: nn.Module) -> None:
    *parents, leaf = path.split(".")
    for name in parents:
        if name not in holder._modules:
            holder.add_module(name, _Holder())
        holder = holder._modules[name]
    holder.add_module(leaf, module)


class _StagesTracer(torch.fx.Tracer):
    """Children are leaves, except an ``nn.Sequential`` child of the root, traced into its stages."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return not (isinstance(m, nn.Sequential) and "." not in qualname)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _steps(model: nn.Module, where: str) -> list[_Step]:
    """The model's forward as a chain of steps; one line naming the node where it is not one."""
    kind = type(model).__name__
    try:
        graph = _StagesTracer().trace(model)
    except Exception as exc:  # control flow on values, an untraceable call
        raise HetplanError(
            f"{where}: cannot trace {kind}.forward into a chain of child calls ({_first_line(exc)}); "
            "return its blocks from a factory instead (docs/train-your-own-model.md)",
            field="factory",
        ) from None
    nodes = list(graph.nodes)
    inputs = [n for n in nodes if n.op == "placeholder"]
    if len(inputs) != 1:
        raise HetplanError(
            f"{where}: {kind}.forward takes {len(inputs)} inputs; a chain takes one tensor", field="factory"
        )
    steps: list[_Step] = []
    prev = inputs[0]
    for node in nodes[1:]:
        used = list(node.all_input_nodes)
        if node.op == "output":
            if node.args[0] is not prev:
                raise HetplanError(
                    f"{where}: {kind}.forward does not return its last operation's output (one tensor)",
                    field="factory",
                )
            break
        if node.op not in ("call_module", "call_function", "call_method") or used != [prev] or len(prev.users) != 1:
            if node.op == "get_attr":
                why = f"it reads the tensor {node.target!r} of its own, outside a child module"
            elif len(prev.users) != 1:
                why = f"the output of {prev.name!r} goes to {len(prev.users)} operations"
            else:
                why = f"it takes {', '.join(repr(a.name) for a in used) or 'no input'}, not {prev.name!r} alone"
            raise HetplanError(
                f"{where}: {kind}.forward is not a chain of child calls at node {node.name!r} ({why}); "
                "return its blocks from a factory instead (docs/train-your-own-model.md)",
                field="factory",
            )
        if node.op == "call_function" and node.target is operator.getitem:
            raise HetplanError(
                f"{where}: {kind}.forward indexes a result at node {node.name!r}; every block passes one tensor",
                field="factory",
            )
        args = torch.fx.node.map_arg(node.args, lambda _: _CHAINED)  # the one node it takes: prev
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda _: _CHAINED)
        steps.append(_Step(node.op, node.target, tuple(args), tuple(kwargs.items())))
        prev = node
    if not steps:
        raise HetplanError(f"{where}: {kind}.forward calls no child module", field="factory")
    return steps


def _groups(model: nn.Module, steps: list[_Step]) -> list[list[_Step]]:
    """Steps grouped into blocks: composites alone, runs of torch layers cut before weight layers."""
    groups: list[list[_Step]] = []
    current: list[_Step] = []
    weighted = False  # the current run holds a weight layer

    def close() -> None:
        nonlocal current, weighted
        if current:
            groups.append(current)
        current, weighted = [], False

    for step in steps:
        module = model.get_submodule(step.target) if step.op == "call_module" else None
        if module is not None and any(True for _ in module.children()):
            close()
            groups.append([step])
            continue
        if isinstance(module, _WEIGHT_LAYERS):
            if weighted:
                close()
            weighted = True
        current.append(step)
    close()
    return groups


def _name(model: nn.Module, group: list[_Step]) -> str:
    for step in group:
        if step.op == "call_module" and (
            len(group) == 1 or isinstance(model.get_submodule(step.target), _WEIGHT_LAYERS)
        ):
            return str(step.target)
    return group[0].label()


def split_chain(model: nn.Module, *, where: str) -> list[tuple[str, nn.Module]]:
    """``model`` as ``(name, block)`` pairs whose blocks, run in order, compute its forward.

    Args:
        model: a module whose forward calls its children (and shape functions) one after another.
        where: what to name in an error (the factory, ``torchvision:resnet50``).

    Raises:
        HetplanError: at ``factory``, naming the module and the node, when the forward is not a chain.
    """
    if not any(True for _ in model.children()):  # one layer: one block
        return [(type(model).__name__.lower(), model)]
    steps = _steps(model, where)
    out: list[tuple[str, nn.Module]] = []
    seen: set[str] = set()
    for group in _groups(model, steps):
        name = _name(model, group)
        while name in seen:
            name += "'"
        seen.add(name)
        out.append((name, Segment(model, group).train(model.training)))
    return out


def is_plain_model(built: Any) -> bool:
    """A single module that is not a container of blocks (``nn.Sequential``, ``nn.ModuleList``)."""
    return isinstance(built, nn.Module) and not isinstance(built, (nn.Sequential, nn.ModuleList))
