"""``vocab_parallel: false``: the GPT's embedding and head whole on every member of a TP stage, priced
so (hetplan.simulate.vocab). The allocator peaks of a real run: tests/runtime/test_vocab_parallel.py."""

from __future__ import annotations

from builders import make_cluster

from hetplan.contracts import load_catalog
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.profile.analytic import analytic_profile
from hetplan.schedule.compile import compile_plan
from hetplan.simulate import simulate
from hetplan.simulate.costs import CostModel
from hetplan.simulate.memory import plan_memory
from hetplan.simulate.vocab import whole_vocab_profile

A100 = "A100-80GB"
CONFIG = {"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "vocab": 8192, "head": "tied"}


def _plan(vocab_parallel: bool) -> Plan:
    stages = (
        Stage(0, 3, ("n0/0", "n0/1"), (1.0,), tensor_parallel=2, vocab_parallel=vocab_parallel),
        Stage(3, 6, ("n0/2", "n0/3"), (1.0,), tensor_parallel=2, vocab_parallel=vocab_parallel),
    )
    return Plan(4, [Pipeline(4, (2, 2), stages)], optimizer="adam")


def test_a_whole_vocabulary_is_priced_whole_and_a_cut_one_as_before() -> None:
    catalog = load_catalog()
    profile = analytic_profile("gpt", CONFIG, devices=[catalog.get(A100)], tp_degrees=(1, 2))
    cluster = make_cluster([("n0", [(A100, 4)])])
    cut, whole = _plan(True), _plan(False)
    assert whole_vocab_profile(cut, profile) is profile  # nothing opts out: the same object, caches kept
    priced = whole_vocab_profile(whole, profile)
    for b in (0, 5):  # the embedding and the head: their degree-1 figures at degree 2, no all-reduce
        assert priced.shard(b, 2).params == profile.blocks[b].params
        assert priced.shard(b, 2).activation_bytes == profile.blocks[b].activation_bytes
        assert priced.shard(b, 2).allreduce_bytes == 0.0
    for b in (1, 2, 3, 4):  # the layers stay cut
        assert priced.shard(b, 2) == profile.shard(b, 2)
    assert priced.shared[0].at(2) == (8192 * 64, 4.0 * 8192 * 64)  # the tied table whole on each member
    memory = {
        vp: plan_memory(compile_plan(plan, 6), profile, cluster, optimizer="adam", plan=plan)
        for vp, plan in ((True, cut), (False, whole))
    }
    table = 8192 * 64
    for address in ("n0/0", "n0/2"):  # each member keeps the other half of the table too
        assert memory[False][address].weights - memory[True][address].weights == 4.0 * table / 2
    # the head's member computes the whole logits: what it holds per sample doubles with them
    assert memory[False]["n0/2"].activations > 1.5 * memory[True]["n0/2"].activations
    # and the whole head's compute, without the vocabulary all-reduces
    device = cluster.device("n0/2")
    head_cut = CostModel(profile, cluster, optimizer="adam").block_times(device, 2, backward=False, tp=2)[5]
    head_whole = CostModel(priced, cluster, optimizer="adam").block_times(device, 2, backward=False, tp=2)[5]
    assert head_whole == profile.block_time(5, device.type, 2)[0]
    assert head_whole != head_cut
    assert simulate(whole, profile, cluster).iteration_s != simulate(cut, profile, cluster).iteration_s
