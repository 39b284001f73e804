"""The rank's device behind one small interface, so CPU tests drive the GPU path's bookkeeping.

    ops = make_ops(device)            # CudaOps or CpuOps: compute timing, settling, peak memory
    pci_order(); index = gpu_index(local_rank, cuda=torch.cuda)   # which GPU a rank takes
    install_staging()                 # --backend gloo on GPU ranks: tensors staged through the host

Every CUDA-specific call of the runtime is in this package (``ops.CudaOps``, ``select``).
"""

from hetplan.runtime.device.ops import CpuOps, CudaOps, DeviceOps, Mark, make_ops
from hetplan.runtime.device.select import device_mismatch, gpu_index, pci_order
from hetplan.runtime.device.staged import Staging, install_staging

__all__ = [
    "CpuOps",
    "CudaOps",
    "DeviceOps",
    "Mark",
    "Staging",
    "device_mismatch",
    "gpu_index",
    "install_staging",
    "make_ops",
    "pci_order",
]
