"""A plan's ``vocab_parallel: false`` stages priced as they run: the embedding and the head whole.

    priced = whole_vocab_profile(plan, profile)   # ``profile`` itself where no stage opts out

At tensor-parallel degree ``t`` a profile's figures for the GPT's embedding and LM head are its
vocabulary-parallel cut (⌈V/t⌉ rows of the token table and the head on each member, the logits'
slice, the all-reduces that join them: :mod:`hetplan.profile.analytic.gpt`, ``hetplan profile
--tensor-parallel``). A stage with ``vocab_parallel: false`` keeps both whole on every member
(:mod:`hetplan.models.gpt_tp`): each member holds the whole table, computes the whole lookup and
the whole logits and loss, and needs no all-reduce for them, which is the block at degree 1. The
plan contract gives every holder of a block one degree and one choice (``parse_plan``), so for one
plan a block at degree ``t`` is either cut on every holder or whole on every holder: its degree-``t``
figures can be replaced by its degree-1 figures, and the walk, the cost model and the simulator read
the result as they read any profile. A tied table (the profile's ``shared`` entry held by those
blocks) is whole there too.
"""

from __future__ import annotations

from dataclasses import replace

from hetplan.contracts.model_profile import Block, ModelProfile, SharedParams, TensorParallel
from hetplan.contracts.plan import Plan

__all__ = ["VOCABULARY_KINDS", "whole_vocab_profile"]

#: The block kinds vocabulary parallelism cuts (the zoo GPT's, as its measured and analytic profiles name them).
VOCABULARY_KINDS = ("embedding", "head")


def whole_vocab_profile(plan: Plan, profile: ModelProfile) -> ModelProfile:
    """``profile`` with the degree-``t`` figures of the embedding and head blocks of every
    ``vocab_parallel: false`` stage at degree ``t`` > 1 replaced by the whole block's; ``profile``
    itself (the same object, so caches keep serving it) where no stage opts out."""
    whole: dict[int, int] = {}  # block -> the degree it is kept whole at
    for p in plan.pipelines:
        for s in p.stages:
            if s.tensor_parallel > 1 and not s.vocab_parallel:
                for b in range(s.start, min(s.end, len(profile.blocks))):
                    block = profile.blocks[b]
                    # kept whole, the block needs no figures at the degree (a profile may have none:
                    # an importer's that kept the vocabulary whole)
                    if block.kind in VOCABULARY_KINDS:
                        whole[b] = s.tensor_parallel
    if not whole:
        return profile
    blocks = list(profile.blocks)
    for b, t in whole.items():
        blocks[b] = replace(blocks[b], tensor_parallel={**blocks[b].tensor_parallel, t: _whole(blocks[b])})
    shared = [_whole_entry(entry, whole) for entry in profile.shared]
    return replace(profile, blocks=blocks, shared=shared)


def _whole(block: Block) -> TensorParallel:
    """The block's degree-1 figures as one member's: the whole of it, no all-reduce."""
    return TensorParallel(
        params=block.params,
        param_bytes=block.param_bytes,
        activation_bytes=block.activation_bytes,
        allreduce_bytes=0.0,
        times=block.times,
        selective_bytes=block.selective_bytes,
    )


def _whole_entry(entry: SharedParams, whole: dict[int, int]) -> SharedParams:
    """A shared entry held by blocks kept whole at a degree: whole at that degree."""
    degrees = {whole[b] for b in entry.blocks if b in whole}
    if not degrees:
        return entry
    return replace(entry, tensor_parallel={t: v for t, v in entry.tensor_parallel.items() if t not in degrees})
