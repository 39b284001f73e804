"""Run a user's model factory so that only some of its blocks hold memory, with the values a full
build gives them, bit for bit.

    blocks = build_partially(lambda: factory(**config), lambda built: built[4:6])   # blocks 4, 5 real
    meta = build_on_meta(lambda: factory(**config))                                  # shapes only

Why: a factory builds the whole model in one call, and a rank holds only its stage's blocks. Calling
it on the CPU would allocate the whole model on every rank; calling it under ``torch.device("meta")``
allocates nothing but loses the user's initialisation (a meta tensor has no values). This module
runs the factory twice under a :class:`~torch.utils._python_dispatch.TorchDispatchMode`:

1. **On meta**, recording every aten operation: which storages it writes (the tensors it creates,
   the ones it changes in place) and which it reads. The blocks wanted are then known, and with the
   recorded data flow, every storage their values come from (a ``randn`` scaled into a parameter).
2. **Again, selectively**: an operation that writes any of those storages runs for real, as the
   factory asked; every other one runs on meta (no memory), and if it draws random numbers, it
   draws them first into a CPU scratch buffer of the same shape, strides and dtype (one buffer,
   reused from draw to draw), so the random generator advances exactly as in a full build. The
   blocks wanted therefore get the very values the full build gives them, and besides them the
   build holds one buffer the size of the largest tensor drawn for another block.

``torch.nn.init``'s ``trunc_normal_``, ``orthogonal_`` and ``sparse_`` return at once on a meta
tensor (``if tensor.is_meta``), and their draws depend on the values drawn (a rejection loop), so
during both calls they run outside the recording, on the real tensor or on the scratch buffer.

Note: a factory that reads a value of a tensor outside the wanted blocks (``.item()``, a branch on
data) or whose operations differ between the two calls cannot be built this way; the caller falls
back to the full build (:class:`PartialBuildError` says why). A tensor made outside the dispatcher
(``torch.tensor(0)``, BatchNorm's step count) stays a real CPU tensor in every block.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["PartialBuildError", "build_on_meta", "build_partially"]

T = TypeVar("T")
_META = torch.device("meta")


class PartialBuildError(RuntimeError):
    """The factory cannot be built partially (it read a value outside the wanted blocks, or its two
    calls differed); the caller builds it whole instead."""


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.device.type != "meta":
        return x.to(_META)
    if isinstance(x, torch.device) and x.type != "meta":
        return _META
    return x


def _written_args(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensor arguments ``func`` writes into (``normal_``'s self, ``out=``)."""
    written = []
    for i, arg in enumerate(func._schema.arguments):
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        flat, _ = tree_flatten(value)
        written += [t for t in flat if isinstance(t, torch.Tensor)]
    return written


def _is_view(func: Any) -> bool:
    """An operation that returns views of its inputs and writes nothing (``detach``, ``view``, ``t``):
    it makes no storage, and how often it runs depends on reference counts (``nn.Parameter`` of a
    tensor referenced elsewhere detaches it), so the two calls are compared without them."""
    returns = func._schema.returns
    return (
        bool(returns)
        and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
        and not any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
    )


def _tensors(tree: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten(tree)
    return [t for t in flat if isinstance(t, torch.Tensor)]


def _is_random(func: Any) -> bool:
    return torch.Tag.nondeterministic_seeded in func.tags


def _with_meta_device(kwargs: dict) -> dict:
    return {k: (_META if k == "device" else v) for k, v in kwargs.items()}


class _Record(TorchDispatchMode):
    """Pass 1: every operation on meta; per operation, the storages it writes and reads, named by the
    number of the operation that created them (stable across the two calls, unlike addresses)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, frozenset[int], frozenset[int]]] = []  # name, writes, reads
        self.origin: dict[int, int] = {}  # storage address -> the operation that created it
        self.keep: list[torch.Tensor] = []  # alive until the end, so no address is reused

    def _name(self, t: torch.Tensor, n: int) -> int:
        key = _storage(t)
        if key not in self.origin:
            self.origin[key] = n
            self.keep.append(t)
        return self.origin[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_view(func):
            return func(*args, **kwargs)
        n = len(self.ops)
        reads = frozenset(self._name(t, n) for t in _tensors((args, kwargs)) if t.device.type == "meta")
        args, kwargs = tree_map(_to_meta, args), tree_map(_to_meta, kwargs)
        if "device" in kwargs or not _tensors((args, kwargs)):
            kwargs = _with_meta_device(kwargs)
        out = func(*args, **kwargs)
        writes = {self._name(t, n) for t in _written_args(func, args, kwargs)}
        writes |= {self._name(t, n) for t in _tensors(out)}
        self.ops.append((str(func), frozenset(writes), reads - writes))
        return out


class _Scratch:
    """CPU buffers that random draws for blocks left on meta are made into, reused from draw to draw:
    allocating and freeing a block-sized tensor per draw would leave the process's resident memory
    well above its live tensors (glibc keeps freed large blocks for reuse once its mmap threshold
    has risen), so that a partial build would peak above a full one."""

    def __init__(self) -> None:
        self.buffers: dict[int, torch.Tensor] = {}

    def like(self, slot: int, t: torch.Tensor) -> torch.Tensor:
        """A zeroed CPU tensor of ``t``'s shape, strides and dtype, in buffer ``slot``."""
        if t.numel() == 0:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
        span = t.storage_offset() + 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
        size = span * t.element_size()
        buf = self.buffers.get(slot)
        if buf is None or buf.numel() < size:
            self.buffers.pop(slot, None)
            buf = self.buffers[slot] = torch.empty(max(size, 64), dtype=torch.uint8)
        view = buf[:size].view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())
        return view.zero_()


def _trim() -> None:
    """Give freed heap memory back to the system (glibc's ``malloc_trim``; elsewhere nothing)."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 - present on glibc only
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC: Any = None


class _Replay(TorchDispatchMode):
    """Pass 2: operation ``n`` runs for real when ``real[n]``; otherwise on meta, random draws made
    into a throw-away CPU tensor first so the generator advances as in a full build."""

    def __init__(self, names: list[str], real: list[bool], scratch: _Scratch) -> None:
        super().__init__()
        self.names, self.real, self.n, self.scratch = names, real, 0, scratch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_view(func):
            return func(*args, **kwargs)
        n = self.n
        self.n += 1
        if n >= len(self.names) or self.names[n] != str(func):
            raise PartialBuildError(f"the factory's second call differs from its first at operation {n} ({func})")
        # a tensor made outside the dispatcher (``torch.tensor(0)``: BatchNorm's step count) is real in
        # both calls; what writes into it runs for real, so it ends as in a full build
        outside = any(t.device.type != "meta" for t in _written_args(func, args, kwargs))
        if self.real[n] or outside:
            if any(t.device.type == "meta" for t in _tensors((args, kwargs))):
                raise PartialBuildError(f"operation {n} ({func}) needs a value outside the blocks built")
            return func(*args, **kwargs)
        if _is_random(func):  # advance the generator as the full build would
            slots = iter(range(1 << 30))

            def real(x: Any) -> Any:
                if isinstance(x, torch.Tensor):
                    return self.scratch.like(next(slots), x) if x.device.type == "meta" else x
                return torch.device("cpu") if isinstance(x, torch.device) else x

            with torch.no_grad():
                out = func(*tree_map(real, args), **tree_map(real, kwargs))
            if not _written_args(func, args, kwargs):  # a new tensor (randn): given back to the system now
                del out
                _trim()
        margs, mkwargs = tree_map(_to_meta, args), tree_map(_to_meta, kwargs)
        if "device" in mkwargs or not _tensors((margs, mkwargs)):
            mkwargs = _with_meta_device(mkwargs)
        return func(*margs, **mkwargs)


#: ``torch.nn.init`` functions that do nothing to a meta tensor (``if tensor.is_meta: return``), and
#: so would not advance the random generator for a block left on meta.
_SKIP_META = ("trunc_normal_", "orthogonal_", "sparse_")


@contextlib.contextmanager
def _init_functions_draw(scratch: _Scratch) -> Iterator[None]:
    """Make the :data:`_SKIP_META` functions draw as in a full build: outside the recording (their
    loops depend on the values drawn), into the tensor when it is real, else into a CPU tensor of
    its shape that is then thrown away."""
    saved = {name: getattr(nn.init, name) for name in _SKIP_META}

    def drawing(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        @functools.wraps(original)
        def draw(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            with _disable_current_modes(), torch.no_grad():
                if tensor.device.type != "meta":
                    return original(tensor, *args, **kwargs)
                original(scratch.like(0, tensor), *args, **kwargs)
            return tensor

        return draw

    try:
        for name, fn in saved.items():
            setattr(nn.init, name, drawing(fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def build_on_meta(factory: Callable[[], T]) -> T:
    """``factory()`` with every tensor on meta: the structure, shapes and dtypes, no memory."""
    with _Record():
        return factory()


def _held(modules: Iterable[nn.Module]) -> list[torch.Tensor]:
    return [t for m in modules for t in [*m.parameters(), *m.buffers()]]


def build_partially(factory: Callable[[], T], wanted: Callable[[T], Iterable[nn.Module]]) -> T:
    """``factory()`` with the modules ``wanted(result)`` selects holding the values a full build gives
    them (on the device the factory put them on) and every other tensor on meta.

    ``factory`` must make the same calls twice (seed the random generator inside it). Raises
    :class:`PartialBuildError` where that cannot be done; the caller then builds the whole model.
    """
    scratch = _Scratch()
    record = _Record()
    with _init_functions_draw(scratch), record:
        first = factory()
    targets = {record.origin[_storage(t)] for t in _held(wanted(first)) if _storage(t) in record.origin}
    # everything the wanted storages' values come from: the data flow, walked backwards
    writers: dict[int, list[int]] = {}
    for n, (_, writes, _) in enumerate(record.ops):
        for s in writes:
            writers.setdefault(s, []).append(n)
    needed, todo = set(targets), list(targets)
    while todo:
        s = todo.pop()
        for n in writers.get(s, ()):
            _, writes, reads = record.ops[n]
            for r in reads | writes:
                if r not in needed:
                    needed.add(r)
                    todo.append(r)
    # an operation that writes nothing (a size, ``.item()``) runs for real where what it reads is real
    real = [
        bool(writes & needed) or (not writes and bool(reads) and reads <= needed) for _, writes, reads in record.ops
    ]
    names = [name for name, _, _ in record.ops]
    del first, record
    replay = _Replay(names, real, scratch)
    with _init_functions_draw(scratch), replay:
        second = factory()
    if replay.n != len(names):
        raise PartialBuildError(f"the factory's second call made {replay.n} operations, its first {len(names)}")
    if any(t.device.type == "meta" for t in _held(wanted(second))):
        raise PartialBuildError("a tensor of the blocks built was not made by an operation hetplan saw")
    return second
