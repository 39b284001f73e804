"""The file contracts: typed, validated objects for every YAML file hetplan reads or writes.

Each loader raises only :class:`hetplan.errors.HetplanError`, naming the file and field.
"""

from hetplan.contracts.catalog import Catalog, DeviceType, load_catalog
from hetplan.contracts.cluster import Cluster, Device, Link, load_cluster
from hetplan.contracts.model_profile import Block, ModelProfile, Timing, load_profile
from hetplan.contracts.plan import Pipeline, Plan, Stage, check_plan, load_plan, load_plan_inputs, split_micro_batch

__all__ = [
    "Block",
    "Catalog",
    "Cluster",
    "Device",
    "DeviceType",
    "Link",
    "ModelProfile",
    "Pipeline",
    "Plan",
    "Stage",
    "Timing",
    "check_plan",
    "load_catalog",
    "load_cluster",
    "load_plan",
    "load_plan_inputs",
    "load_profile",
    "split_micro_batch",
]
