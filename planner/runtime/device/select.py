"""Which GPU a rank takes, and whether it is the type the plan put there.

    pci_order()                                    # before CUDA initialises: number GPUs by PCI bus
    index = gpu_index(local_rank, cuda=torch.cuda)  # the local_rank-th GPU CUDA_VISIBLE_DEVICES shows
    mismatch = device_mismatch(name, memory, planned_type, planned_memory)   # None, or what differs

CUDA numbers a node's GPUs fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is set before it
initialises: in a node of four V100s and one A100 the A100 would be ``cuda:0`` whatever its slot.
hetplan numbers a node's devices in PCI order (``hetplan probe`` writes them so), sets that variable
in everything it emits or spawns, and here once more before torch touches CUDA. A rank takes the GPU
of its local rank among those ``CUDA_VISIBLE_DEVICES`` shows (torch numbers the visible GPUs from 0
in the listed order): the emitted node script makes the plan's devices of the node visible, in
order, unless the scheduler (SLURM) has set the variable already.

The type check compares what the driver reports with the plan's device type: the type's model
(``H100`` of ``H100-SXM``, ``RTX 4090`` of ``RTX-4090``) must appear in the reported name and the
reported memory must be within 15% of the type's (the driver reports a little less than the
marketed figure; 40 and 80 GB A100s differ by half). It cannot tell an H100 SXM from an H100 PCIe
of the same memory; it catches a rank on the wrong GPU of a mixed node.
"""

from __future__ import annotations

import os
import re
from typing import Any

from hetplan.errors import HetplanError

__all__ = ["MEMORY_TOLERANCE", "device_mismatch", "gpu_index", "pci_order"]

#: How far (as a fraction) the reported memory may be from the device type's.
MEMORY_TOLERANCE = 0.15

#: Type-name words that name a family, not a model: the next word belongs to the model (RTX 4090).
_FAMILY_WORDS = ("RTX", "TITAN", "GTX", "QUADRO", "INSTINCT", "RADEON")


def pci_order() -> None:
    """Set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (refusing another order the user chose): call before
    CUDA initialises, which reads the variable once."""
    order = os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if order != "PCI_BUS_ID":
        raise HetplanError(
            f"CUDA_DEVICE_ORDER={order}: hetplan numbers a node's GPUs in PCI order; unset it or set PCI_BUS_ID",
            field="CUDA_DEVICE_ORDER",
        )


def gpu_index(local_rank: int, *, cuda: Any) -> int:
    """torch's index of the GPU for ``local_rank``: the ``local_rank``-th visible GPU.

    Args:
        local_rank: the rank's place among its node's devices in the rank config (``LOCAL_RANK``
            under torchrun's ``--node-name``).
        cuda: the ``torch.cuda`` namespace (a stand-in in tests).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = int(cuda.device_count())
    if not 0 <= local_rank < count:
        shown = f"CUDA_VISIBLE_DEVICES={visible}" if visible is not None else "no CUDA_VISIBLE_DEVICES"
        raise HetplanError(
            f"local rank {local_rank} needs GPU {local_rank}, and {count} are visible ({shown})",
            field="CUDA_VISIBLE_DEVICES",
        )
    return local_rank


def _model_words(type_name: str) -> list[str]:
    """The words of a type's name that must appear in the driver's name: ``H100-SXM`` -> [H100]."""
    words = [w for w in re.split(r"[-_ ]+", type_name.upper()) if w]
    if not words:
        return []
    return words[:2] if words[0] in _FAMILY_WORDS and len(words) > 1 else words[:1]


def device_mismatch(name: str, memory: float, planned_type: str, planned_memory: float | None) -> str | None:
    """What differs between the GPU a rank got (``name``, ``memory`` bytes, as the driver reports
    them) and the plan's device type; None when they agree."""
    text = re.sub(r"[-_]+", " ", name.upper())
    words = _model_words(planned_type)
    if words and not all(re.search(rf"\b{re.escape(w)}\b", text) for w in words):
        return f"the GPU is {name!r}, not a {planned_type}"
    if planned_memory and abs(memory / planned_memory - 1.0) > MEMORY_TOLERANCE:
        return f"the GPU ({name}) has {memory / 2**30:.1f} GiB, and a {planned_type} {planned_memory / 2**30:.1f} GiB"
    return None
