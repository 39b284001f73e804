"""Which samples of the global batch a rank computes: pipeline, micro-batch and replica offsets.

Every rank generates the same global batch for a step (the zoo's ``sample_batch`` is deterministic
in seed and step) and slices its own samples, so no data crosses a process.
"""

from __future__ import annotations

from planner.contracts.plan import Plan

__all__ = ["micro_offsets", "pipeline_offsets"]


def pipeline_offsets(plan: Plan) -> list[int]:
    """Where each pipeline's share starts in the global batch."""
    out, total = [], 0
    for p in plan.pipelines:
        out.append(total)
        total += p.batch
    return out


def micro_offsets(micro_batches: tuple[int, ...]) -> list[int]:
    """Where each micro-batch starts inside its pipeline's share."""
    out, total = [], 0
    for m in micro_batches:
        out.append(total)
        total += m
    return out
