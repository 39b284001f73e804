"""The accelerators this process sees, in PCI bus order, each mapped to a catalog type.

    devices = seen_devices(torch_module=torch)   # [SeenDevice(index=0, name="NVIDIA H100 80GB HBM3", ...)]

CUDA numbers devices fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is set before CUDA
initialises, so :func:`pci_order_env` sets it (when CUDA is not yet initialised) and the devices are
sorted by their PCI address as well: the index a node's cluster entry gives a GPU is the one a rank
started with the same environment gets.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from hetplan.contracts.catalog import Catalog
from hetplan.profile.measure import cpu_name, cuda_device_type

__all__ = ["SeenDevice", "cpu_name", "pci_order_env", "seen_devices", "total_host_memory"]


@dataclass(frozen=True)
class SeenDevice:
    """One device as the driver reports it. ``index``: torch's index (``cuda:<index>``) in this
    process; ``pci_bus_id``: ``DDDD:BB:DD.0`` or "" where torch does not report it; ``type``: the
    catalog type the name maps to, None where the catalog has none."""

    index: int
    name: str
    memory: float
    pci_bus_id: str
    type: str | None
    sms: int = 0
    kind: str = "cuda"


def pci_order_env() -> str:
    """Set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` unless the user chose an order; returns the order used."""
    return os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")


def _pci_bus_id(props: Any) -> str:
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return ""
    domain = getattr(props, "pci_domain_id", 0) or 0
    device = getattr(props, "pci_device_id", 0) or 0
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def seen_devices(torch_module: Any, catalog: Catalog) -> list[SeenDevice]:
    """The GPUs torch sees (CUDA or ROCm), sorted by PCI address; empty without a GPU."""
    cuda = torch_module.cuda
    if not cuda.is_available():
        return []
    out = []
    for i in range(cuda.device_count()):
        props = cuda.get_device_properties(i)
        out.append(
            SeenDevice(
                index=i,
                name=str(props.name),
                memory=float(props.total_memory),
                pci_bus_id=_pci_bus_id(props),
                type=cuda_device_type(str(props.name), float(props.total_memory), catalog),
                sms=int(getattr(props, "multi_processor_count", 0) or 0),
            )
        )
    return sorted(out, key=lambda d: (d.pci_bus_id or "~", d.index))


def total_host_memory() -> float:
    """Bytes of RAM on this host (0 where the platform does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0.0
