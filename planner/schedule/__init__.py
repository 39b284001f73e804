"""The schedule as data: a plan compiles once into per-device action lists.

    programs = compile_plan(plan, n_blocks=len(profile.blocks)).programs
    print(programs["node0/1"].render())      # "RA0 F0 SA0 RA1 F1 SA1 RG0 B0 SG0 ... AR1 OPT"

The simulator times these lists, the runtime executes them, the validator checks them and the
timeline draws them: one representation for all four (as torch.distributed.pipelining does).
"""

from hetplan.schedule.actions import Action, Kind
from hetplan.schedule.compile import (
    DeviceProgram,
    GradGroup,
    Transfer,
    compile_plan,
    gradient_groups,
    shared_groups,
    with_shared_groups,
)

__all__ = [
    "Action",
    "DeviceProgram",
    "GradGroup",
    "Kind",
    "Transfer",
    "compile_plan",
    "gradient_groups",
    "shared_groups",
    "with_shared_groups",
]
