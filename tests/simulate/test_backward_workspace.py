"""A stage's backward peak: the blocks after the one whose backward runs have freed what they kept.

``backward_extra`` is the walk's term beyond what the forward kept; the planner's range tables
(solve/tables.py, solve/range_memory.py) price the same term for every range.
"""

from __future__ import annotations

import pytest
from builders import make_cluster

from hetplan.contracts import load_catalog
from hetplan.profile.analytic import analytic_profile
from hetplan.simulate.memory import backward_extra, stage_terms
from hetplan.solve.tables import CostTables


def test_the_largest_backward_early_in_a_stage_is_counted_without_the_later_blocks_kept() -> None:
    # block 0's backward needs 30 while blocks 1 and 2 have freed their 10 each: 10 + 30 = 40 held,
    # 10 beyond the 30 the forward kept (the largest work beside all of it would say 30)
    assert backward_extra([10.0, 10.0, 10.0], [30.0, 5.0, 5.0]) == 10.0
    # the last block's backward runs with everything still kept
    assert backward_extra([10.0, 10.0, 10.0], [5.0, 5.0, 7.0]) == 7.0
    assert backward_extra([4.0], [6.0]) == 6.0
    assert backward_extra([], []) == 0.0


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_planners_tables_price_the_walks_backward_on_every_range(recompute: str) -> None:
    """Blocks of unequal sizes (embedding, attention, MLP, head): the tables' per-sample figure
    during a backward equals the walk's on every range."""
    device = load_catalog().get("A100-40GB")
    profile = analytic_profile(
        "gpt", {"layers": 2, "hidden": 64, "heads": 4, "seq": 128, "vocab": 512}, devices=[device], micro_batches=(1,)
    )
    tables = CostTables(profile, make_cluster([("n0", [("A100-40GB", 1)])]), optimizer="adam")
    n = len(profile.blocks)
    for start in range(n):
        for end in range(start + 1, n + 1):
            terms = stage_terms(profile, start, end, recompute=recompute)
            during = tables._compute_terms(start, end, 1, recompute, 1)[5]
            want = terms.grad_in + terms.grad_out + terms.workspace
            assert during == pytest.approx(want, rel=1e-12), (start, end)
