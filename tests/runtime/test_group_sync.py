"""The gradient-group combiners on four gloo ranks against one-process references: all-reduce, top-k
(ratio 1 is the sum; a small ratio with error feedback over three steps), Adasum across pipelines
with a replicated stage and unequal batch shares."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from spawn_ranks import spawn_ranks

from hetplan.runtime.sync.group_sync import GroupLayout, make_group_sync
from hetplan.runtime.sync.topk import TopK, densify

WORLD = 4
SIZES = (6, 3, 5)  # three tensors in one group's flat buffer
#: rank -> pipeline: pipeline 0 has two replicas (ranks 0 and 1)
PIPELINE_OF = (0, 0, 1, 2)
BATCHES = {0: 4, 1: 2, 2: 2}
SAMPLES = (3, 1, 2, 2)  # each rank's samples: pipeline 0 splits its 4 as 3 + 1
STEPS = 3


def _contribution(rank: int, step: int) -> torch.Tensor:
    """A rank's gradient contribution: its replica's mean gradient weighted by samples / global batch."""
    gen = torch.Generator().manual_seed(100 * step + rank)
    mean = torch.randn(sum(SIZES), generator=gen, dtype=torch.float64)
    return (mean * SAMPLES[rank] / sum(BATCHES.values())).float()


def _same(rank: int) -> torch.Tensor:
    """Every replica's mean gradient the same: each contribution is it weighted by its samples."""
    mean = torch.randn(sum(SIZES), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return (mean * SAMPLES[rank] / sum(BATCHES.values())).float()


def _weighted_pair(a, b):
    """The weighted Adasum rule of hetplan.runtime.sync.adasum's doc, written out here (float64): the
    reference, independent of the code under test. Nodes are (value, weight, leaves)."""
    (va, wa, na), (vb, wb, nb) = a, b
    n, w = na + nb, wa + wb
    ca, cb = (wa / na) * (n / w), (wb / nb) * (n / w)
    dot, la, lb = va @ vb, va @ va, vb @ vb
    alpha, beta = (ca + cb - 1) * cb / (ca + cb), (ca + cb - 1) * ca / (ca + cb)
    return ca * va + cb * vb - dot * (alpha * va / la + beta * vb / lb), w, n


def _run(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    try:
        layout = GroupLayout(PIPELINE_OF, BATCHES, SIZES)
        results: dict[str, list[torch.Tensor]] = {}
        for name, sync in [
            ("allreduce", make_group_sync("allreduce")),
            ("topk1", make_group_sync("topk", ratio=1.0)),
            ("topk", make_group_sync("topk", ratio=0.3)),
            ("adasum", make_group_sync("adasum", layouts={0: layout})),
        ]:
            results[name] = []
            for step in range(STEPS):
                pending = sync.issue(0, _contribution(rank, step), None, timeout_s=60)
                results[name].append(sync.complete(pending).clone())
        # pipelines whose mean gradients agree: Adasum gives what the all-reduce gives
        same = make_group_sync("adasum", layouts={0: layout})
        results["adasum_same"] = [same.complete(same.issue(0, _same(rank), None, timeout_s=60)).clone()]
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("sync")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    spawn_ranks(_run, args=(f"file://{tmp / 'store'}", str(tmp)), nprocs=WORLD)
    return [torch.load(tmp / f"rank{r}.pt") for r in range(WORLD)]


def test_every_rank_holds_the_same_bits(results: list[dict]) -> None:
    for name in results[0]:
        for step in range(len(results[0][name])):
            assert all(torch.equal(r[name][step], results[0][name][step]) for r in results), name


def test_allreduce_and_topk_ratio_one_are_the_sum(results: list[dict]) -> None:
    for step in range(STEPS):
        expect = sum(_contribution(r, step).double() for r in range(WORLD)).float()
        assert torch.allclose(results[0]["allreduce"][step], expect, atol=1e-6)
        assert torch.allclose(results[0]["topk1"][step], results[0]["allreduce"][step], atol=1e-5, rtol=0)


def test_topk_with_error_feedback_equals_one_process(results: list[dict]) -> None:
    compressors = [TopK(0.3) for _ in range(WORLD)]
    for step in range(STEPS):
        parts = [compressors[r].compress("group0", _contribution(r, step)) for r in range(WORLD)]
        assert torch.allclose(results[0]["topk"][step], densify(parts, sum(SIZES)), atol=1e-7)


def test_adasum_across_pipelines_equals_one_process(results: list[dict]) -> None:
    """Pipeline 0's two replicas summed, each pipeline's mean, then the tree ((p0 p1) p2) per tensor."""
    total = sum(BATCHES.values())
    for step in range(STEPS):
        means = []
        for p in sorted(BATCHES):
            summed = sum(_contribution(r, step).double() for r in range(WORLD) if PIPELINE_OF[r] == p)
            means.append(summed * total / BATCHES[p])
        pieces, offset = [], 0
        for size in SIZES:
            leaf = [(m[offset : offset + size], float(BATCHES[p]), 1) for p, m in enumerate(means)]
            pieces.append(_weighted_pair(_weighted_pair(leaf[0], leaf[1]), leaf[2])[0])
            offset += size
        assert torch.allclose(results[0]["adasum"][step].double(), torch.cat(pieces), atol=1e-5, rtol=0)


def test_adasum_of_identical_pipelines_is_the_allreduce(results: list[dict]) -> None:
    """Pipelines whose mean gradients agree: Adasum gives what the all-reduce gives."""
    expect = sum(_same(r).double() for r in range(WORLD))
    assert torch.allclose(results[0]["adasum_same"][0].double(), expect, atol=1e-5, rtol=0)
