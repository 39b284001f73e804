"""``hetplan probe``: what this node has, measured, written as a cluster entry.

    from hetplan.probe import probe_node
    result = probe_node(seconds=0.2)          # a few seconds in all; longer runs steadier
    result.write("node.yaml")                 # a hetplan/cluster/v1 file: this node, catalog types
    for line in result.differences:           # measured vs the catalog, where > 20% apart
        print(line)

The probe lists the GPUs torch sees in PCI bus order (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, within
``CUDA_VISIBLE_DEVICES``), maps each name to a catalog type, times a dense matmul per dtype, the
device's memory copy, host<->device copies and GPU<->GPU copies, and compares each figure with what
the catalog (peak x achieved fraction) predicts. On a machine without a GPU it describes the CPU.
"""

from hetplan.probe.entry import DIFFERENCE_THRESHOLD, ProbeResult
from hetplan.probe.run import probe_node

__all__ = ["DIFFERENCE_THRESHOLD", "ProbeResult", "probe_node"]
