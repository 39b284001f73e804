"""Emit launch files for a plan: the rank config every rank reads, a torchrun script per node, SLURM.

files = emit_launch(plan, profile, cluster, out_dir="launch/", master="node0.example:29500")
"""

from hetplan.emit.launch_files import emit_launch
from hetplan.emit.rank_config import RANK_CONFIG_SCHEMA, build_rank_config

__all__ = ["RANK_CONFIG_SCHEMA", "build_rank_config", "emit_launch"]
