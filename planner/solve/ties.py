"""What the search may do with a profile's shared (tied) parameters: what the runtime runs.

    profile = degrees_the_runtime_runs(profile)   # no TP degrees for a tied model from outside the zoo
    ties_agree(block_degrees(plan), profile)      # every entry's holders at one degree

The runtime (:mod:`hetplan.runtime.parallel.tied`) keeps a tied parameter's copies equal only with
every holder at one tensor-parallel degree, and cuts a tied table under tensor parallelism only for
the zoo's GPT; :func:`hetplan.contracts.plan.check_shared_parameters` refuses the rest. The planner
and the baselines use these two so that they never make such a plan.
"""

from __future__ import annotations

from dataclasses import replace

from hetplan.contracts.model_profile import ModelProfile

__all__ = ["degrees_the_runtime_runs", "ties_agree"]


def ties_agree(degree: dict[int, int] | None, profile: ModelProfile) -> bool:
    """Whether a per-block degree map (None: holders of one block disagree) holds each shared
    (tied) entry's blocks at one degree, as the runtime needs (``check_shared_parameters``)."""
    if degree is None:
        return False
    return all(len({degree.get(b, 1) for b in entry.blocks}) == 1 for entry in profile.shared)


def degrees_the_runtime_runs(profile: ModelProfile) -> ModelProfile:
    """``profile`` without tensor-parallel degrees where the runtime refuses them: a model that is
    not from the zoo and ties parameters; its plans are then what degree 1 gives, timed and sized by
    the same figures. ``profile`` itself (the same object) elsewhere."""
    if not profile.shared or "family" in profile.model:
        return profile
    if not any(b.tensor_parallel for b in profile.blocks):
        return profile
    return replace(profile, blocks=[replace(b, tensor_parallel={}) for b in profile.blocks])
