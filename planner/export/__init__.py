"""Export a plan to the closest configuration DeepSpeed, Megatron-LM or torchtitan can express.

    result = export_plan("megatron", plan, profile, cluster, "out/")
    result.written            # out/megatron-args.txt, out/node-NODE.sh (one a node), out/exported-plan.yaml, ...
    result.dropped            # one line per feature of the plan the runtime cannot express
    rows = export_rows(plan, result.exported, profile, cluster, name="Megatron-LM export")

Each runtime runs one pipeline shape replicated (:mod:`hetplan.export.structure`); each module here
writes one runtime's files and keeps the list of keys it may write, with the source they come
from (:mod:`~hetplan.export.deepspeed`, :mod:`~hetplan.export.megatron` with
:mod:`~hetplan.export.megatron_args`, :mod:`~hetplan.export.torchtitan`). An export that hetplan's
simulator finds does not fit in memory is refused unless asked for (``write_unfit=True``).
"""

from hetplan.export.compare import export_rows
from hetplan.export.run import EXPORTED_PLAN, RUNTIMES, ExportResult, export_plan, runtime_named

__all__ = ["EXPORTED_PLAN", "RUNTIMES", "ExportResult", "export_plan", "export_rows", "runtime_named"]
