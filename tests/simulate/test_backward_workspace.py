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
from hetplan.solve.range_memory import range_terms
from hetplan.solve.tables import CostTables


def test_the_largest_backward_early_in_a_stage_is_counted_without_the_later_blocks_kept() -> None:
    # block 0's backward needs 30 while blocks 1 and 2 have freed their 10 each: 10 + 30 = 40 held,
    # 10 beyond the 30 the forward kept (the largest work beside all of it would say 30)
    assert backward_extra([10.0, 10.0, 10.0], [30.0, 5.0, 5.0]) == 10.0
    # the last block's backward runs with everything still kept
    assert backward_extra([10.0, 10.0, 10.0], [5.0, 5.0, 7.0]) == 7.0
    assert backward_extra([4.0], [6.0]) == 6.0
    assert backward_extra([], []) == 0.0


def _gpt():
    device = load_catalog().get("A100-40GB")
    config = {"layers": 2, "hidden": 64, "heads": 4, "seq": 128, "vocab": 512}
    return analytic_profile("gpt", config, devices=[device], micro_batches=(1,))


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("tp", [1, 2])
def test_the_planners_tables_price_the_walks_backward_on_every_range(recompute: str, tp: int) -> None:
    """Blocks of unequal sizes (embedding, attention, MLP, head), whole and at degree 2: both of the
    planner's per-sample figures during a backward (the tables' and the range matrices') equal the
    walk's on every range."""
    profile = _gpt()
    tables = CostTables(profile, make_cluster([("n0", [("A100-40GB", 2)])]), optimizer="adam")
    ranges = range_terms(profile, optimizer="adam", tp=tp, recompute=recompute, zero_holders=1)
    n = len(profile.blocks)
    for start in range(n):
        for end in range(start + 1, n + 1):
            terms = stage_terms(profile, start, end, tp=tp, recompute=recompute)
            want = terms.grad_in + terms.grad_out + terms.workspace
            assert tables._compute_terms(start, end, tp, recompute, 1)[5] == pytest.approx(want, rel=1e-12)
            assert ranges.usable[start, end]
            assert ranges.during[start, end] == pytest.approx(want, rel=1e-12), (start, end)
