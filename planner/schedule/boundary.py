"""Split boundary transfers into tensor-parallel groups (Megatron's scatter/gather optimisation).

Every member of a tensor-parallel replica holds the whole boundary tensor, so sending it whole to
each member of a receiving replica of degree ``c`` moves it ``c`` times over the link. Instead the
receiving member ``k`` gets only chunk ``k`` of its buffer (the micro-batch share it computes,
flattened, cut in ``c`` chunks of ``ceil(n / c)`` elements: the last one shorter where ``c`` does
not divide ``n``; the runtime pads it for the all-gather), from the sender the schedule pairs it
with (:mod:`hetplan.schedule.compile`), and the receiving group all-gathers the chunks before the
compute that consumes them. Gradients go back the same way, chunked by the gradient receiver's
degree. The action lists do not change: a transfer action ``[lo, hi)`` to or from a member of degree
``c > 1`` carries only :func:`piece` of it, and a member of degree ``c > 1`` all-gathers every
received buffer before its ``F`` (activations) or ``B`` (gradients).

Coordinates are elements of the whole micro-batch (``sample * row``), where ``row`` is one sample's
size: elements in the runtime, bytes in the simulator (any unit works, the cut is proportional).
"""

from __future__ import annotations

from hetplan.schedule.compile import DeviceProgram

__all__ = ["chunk", "piece", "splits"]


def splits(receiver: DeviceProgram) -> bool:
    """Whether transfers into ``receiver`` are split (it is a member of a degree >= 2 replica)."""
    return receiver.tensor_parallel > 1


def chunk(receiver: DeviceProgram, micro: int, row: float) -> tuple[float, float]:
    """``receiver``'s chunk of its buffer of micro-batch ``micro``, in micro-batch coordinates."""
    base = receiver.offsets[micro] * row
    n = receiver.counts[micro] * row
    c = receiver.tensor_parallel
    size = -(-n // c) if isinstance(n, int) else n / c
    lo = base + receiver.tp_rank * size
    return lo, min(base + n, lo + size)


def piece(lo: int, hi: int, row: float, receiver: DeviceProgram, micro: int) -> tuple[float, float]:
    """The part ``[a, b)`` of a transfer of samples ``[lo, hi)`` of micro-batch ``micro`` that
    ``receiver`` gets: all of it where transfers into it are not split, else its overlap with the
    receiver's chunk (empty, ``b <= a``, where they do not meet: neither side posts it)."""
    if not splits(receiver):
        return lo * row, hi * row
    c_lo, c_hi = chunk(receiver, micro, row)
    return max(lo * row, c_lo), min(hi * row, c_hi)
