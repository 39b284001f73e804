"""ZeRO-1 (planner/runtime/parallel/zero.py): a sharded step equals the replicated optimizer's, to 1e-6.

One spawn of 4 gloo processes (module fixture) runs every case on holder groups of 2, 3 and 4 ranks
and writes, per rank, the largest differences it saw against a plain non-sharded reference that
each process computes itself from the same gradients (fp32 master weights, ``make_optimizer``,
``torch.nn.utils.clip_grad_norm_``); the tests below judge them. Gradients are fed as the runtime
feeds them: two micro-batches per step per holder, as ``.grad`` at the weights' dtype.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from spawn_ranks import spawn_ranks
from torch import nn

from hetplan.errors import HetplanError
from hetplan.runtime.optim import OPTIMIZERS, clip_coefficient, make_optimizer
from hetplan.runtime.parallel.zero import Zero1Group, shard_bounds

WORLD = 4
SHAPES = [(7, 3), (5,), (4, 2, 2), (1,)]  # 43 elements: shards 22/21, 15/15/13, 11/11/11/10
TINY = [(3,), (2,)]  # 5 elements: over 4 equal holders 2/2/1/0, over weights [1, 1, 1, 10] 0/1/0/4
WEIGHTS = [1.0, 2.5, 1.5, 3.0]  # per holder (the first H of them): unequal shard sizes
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LR = 0.05
MAX_NORM = 2.0  # below the first steps' norms (about 3 to 9 here): clipping is active
STEPS = 3
TOL = 1e-6
WEIGHTED_CASES = (("adam", "bf16"), ("momentum", "fp32"))  # (optimizer, dtype) run with weighted shards too


# -- the deterministic inputs every process can compute ---------------------------------------------


def _initial(shapes: list[tuple[int, ...]], dtype: torch.dtype, seed: int = 7) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in shapes]


def _grad(step: int, holder: int, micro: int, index: int, shape: tuple[int, ...]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1_000_003 * step + 1009 * holder + 101 * micro + index)
    return torch.randn(shape, generator=gen) * 0.5


def _feed(zero: Zero1Group, step: int, holder: int) -> None:
    """Two micro-batches of one holder's gradients, through the hook's call."""
    for micro in range(2):
        for i, p in enumerate(zero.params):
            p.grad = _grad(step, holder, micro, i, tuple(p.shape)).to(p.dtype)
            zero.accumulate_one(p)


def _summed(shapes, dtype: torch.dtype, step: int, holders: int) -> list[torch.Tensor]:
    """The summed fp32 gradient of every parameter, accumulated as a holder does then summed."""
    total = [torch.zeros(s) for s in shapes]
    for holder in range(holders):
        for i, s in enumerate(shapes):
            acc = torch.zeros(s)
            for micro in range(2):
                acc.add_(_grad(step, holder, micro, i, s).to(dtype))
            total[i] += acc
    return total


class _Plain:
    """The replicated optimizer: fp32 masters, ``clip_grad_norm_``, ``make_optimizer``."""

    def __init__(self, name: str, masters: list[torch.Tensor], shapes) -> None:
        self.shapes = shapes
        self.masters = [nn.Parameter(m.detach().float().clone()) for m in masters]
        self.optimizer = make_optimizer(name, self.masters, LR)

    def step(self, dtype: torch.dtype, step: int, holders: int) -> float:
        for m, g in zip(self.masters, _summed(self.shapes, dtype, step, holders), strict=True):
            m.grad = g
        norm = float(torch.nn.utils.clip_grad_norm_(self.masters, MAX_NORM))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm


def _zero_step(zero: Zero1Group, step: int, pg) -> float:
    """One ZeRO-1 step as the executor wires it: reduce, norm over holders, clip, step, gather."""
    _feed(zero, step, dist.get_rank(pg))
    for work in zero.start_reduce():
        work.wait()
    total = torch.stack([zero.shard_sq_norm(), torch.tensor(float(zero.shard_has_inf()), dtype=torch.float64)])
    dist.all_reduce(total, group=pg)
    norm = math.sqrt(float(total[0]))
    zero.step(clip_coef=clip_coefficient(norm, MAX_NORM))
    for work in zero.start_gather():
        work.wait()
    zero.finish_gather()
    return norm


def _diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    pairs = zip(a, b, strict=True)
    return max(float((x.detach().float() - y.detach().float()).abs().max()) if x.numel() else 0.0 for x, y in pairs)


def _state_diff(saved: dict[str, dict[str, Any]], plain: _Plain, names: list[str]) -> float:
    """Largest difference between a gathered ZeRO state and the plain optimizer's, key by key."""
    worst = 0.0
    for name, m in zip(names, plain.masters, strict=True):
        ref = plain.optimizer.state.get(m, {})
        got = saved[name]
        ref_keys = {k for k, v in ref.items() if v is not None}
        if ref_keys != set(got):
            return math.inf
        for key in ref_keys:
            a, b = torch.as_tensor(got[key]).float(), torch.as_tensor(ref[key]).float()
            if a.shape != b.shape:
                return math.inf
            worst = max(worst, float((a - b).abs().max()) if a.numel() else 0.0)
    return worst


# -- the cases, run in every process ----------------------------------------------------------------


def _names(shapes) -> list[str]:
    return [f"b{i // 2}/p{i}" for i in range(len(shapes))]


def _equivalence(results, pgs, rank: int, holders: int, opt: str, dtype_name: str, layout: str, coll: str, shapes):
    key = f"H{holders}/{opt}/{dtype_name}/{layout}/{coll}/N{sum(math.prod(s) for s in shapes)}"
    if rank >= holders:
        return
    dtype = DTYPES[dtype_name]
    pg = pgs[holders]
    weights = None if layout == "equal" else ([1.0, 1.0, 1.0, 10.0] if shapes == TINY else WEIGHTS)[:holders]
    params = _initial(shapes, dtype)
    zero = Zero1Group(
        list(zip(_names(shapes), params, strict=True)),
        group=pg,
        optimizer=opt,
        lr=LR,
        weights=weights,
        collectives=coll,
    )
    plain = _Plain(opt, params, shapes)
    norm_diff = 0.0
    for step in range(STEPS):
        norm = _zero_step(zero, step, pg)
        ref = plain.step(dtype, step, holders)
        norm_diff = max(norm_diff, abs(norm - ref) / max(1.0, ref))
    saved = zero.state_dict()
    results[key] = {
        "master": _diff([saved["master"][n] for n in zero.names], plain.masters),
        "weights": _diff(params, [m.detach().to(dtype) for m in plain.masters]),
        "norm": norm_diff,
        "state": _state_diff(saved["optim"], plain, zero.names),
        "sizes": [hi - lo for lo, hi in zero.bounds],
        "clipped": _first_norm(shapes, dtype, holders) > MAX_NORM,
    }


def _first_norm(shapes, dtype: torch.dtype, holders: int) -> float:
    """The first step's gradient norm (above MAX_NORM: the case tests clipping, not only stepping)."""
    return math.sqrt(sum(float(g.square().sum()) for g in _summed(shapes, dtype, 0, holders)))


def _overflow(results, pgs, rank: int, holders: int, coll: str) -> None:
    """An inf in one holder's gradient is seen by exactly one shard, and the step is skipped."""
    if rank >= holders:
        return
    pg = pgs[holders]
    params = _initial(SHAPES, torch.float32)
    before = [p.detach().clone() for p in params]
    zero = Zero1Group(
        list(zip(_names(SHAPES), params, strict=True)), group=pg, optimizer="adam", lr=LR, collectives=coll
    )
    _feed(zero, 0, dist.get_rank(pg))
    if dist.get_rank(pg) == holders - 1:
        zero.grad_of(params[2]).view(-1)[5] = math.inf  # element 21 + 5 + 5 = 31 of the buffer
    for work in zero.start_reduce():
        work.wait()
    count = torch.tensor([zero.shard_has_inf(), int(zero.start <= 31 < zero.end)])
    dist.all_reduce(count, group=pg)
    zero.zero_grad()
    results[f"inf/H{holders}/{coll}"] = {
        "count": int(count[0]),
        "holders_of_it": int(count[1]),
        "unchanged": _diff(params, before),
        "buffer_zeroed": float(zero.grad_buffer.abs().sum()),
    }


def _round_trip(results, pgs, rank: int, opt: str, dtype_name: str, folder: str) -> None:
    """3 steps sharded over 2, saved; resumed sharded over 3 and not sharded: both continue as an
    uninterrupted run (whose later steps have 3 holders' gradients)."""
    dtype = DTYPES[dtype_name]
    names = _names(SHAPES)
    path = Path(folder) / f"{opt}-{dtype_name}.pt"
    plain = _Plain(opt, _initial(SHAPES, dtype), SHAPES)
    for step in range(STEPS):
        plain.step(dtype, step, 2)
    for step in range(STEPS, 2 * STEPS):
        plain.step(dtype, step, 3)
    if rank < 2:
        params = _initial(SHAPES, dtype)
        zero = Zero1Group(list(zip(names, params, strict=True)), group=pgs[2], optimizer=opt, lr=LR)
        for step in range(STEPS):
            _zero_step(zero, step, pgs[2])
        saved = zero.state_dict()
        if rank == 0:
            torch.save(saved, path)
    dist.barrier()
    saved = torch.load(path, weights_only=True)
    key = f"resume/{opt}/{dtype_name}"
    if rank < 3:  # over 3 holders, from other initial weights: the load must set everything
        params = _initial(SHAPES, dtype, seed=99)
        zero = Zero1Group(list(zip(names, params, strict=True)), group=pgs[3], optimizer=opt, lr=LR)
        if dtype == torch.float32:  # fp32: the weights are the truth, the master shard comes from them
            with torch.no_grad():
                for p, n in zip(params, names, strict=True):
                    p.copy_(saved["master"][n])
            zero.load_state_dict(saved["optim"])
        else:
            zero.load_state_dict(saved["optim"], saved["master"])
        for step in range(STEPS, 2 * STEPS):
            _zero_step(zero, step, pgs[3])
        again = zero.state_dict()
        results[f"{key}/over3"] = {
            "master": _diff([again["master"][n] for n in names], plain.masters),
            "weights": _diff(params, [m.detach().to(dtype) for m in plain.masters]),
            "state": _state_diff(again["optim"], plain, names),
        }
    if rank == 3:  # not sharded: a plain optimizer loads the same per-parameter state and continues
        none = _Plain(opt, [saved["master"][n] for n in names], SHAPES)
        for m, n in zip(none.masters, names, strict=True):
            if saved["optim"][n]:
                none.optimizer.state[m] = {k: v.clone() for k, v in saved["optim"][n].items()}
        for step in range(STEPS, 2 * STEPS):
            none.step(dtype, step, 3)
        results[f"{key}/none"] = {
            "master": _diff(none.masters, plain.masters),
            "state": _state_diff(
                {n: none.optimizer.state.get(m, {}) for n, m in zip(names, none.masters, strict=True)}, plain, names
            ),
        }


def _layout_check(results, pgs, rank: int) -> None:
    """Holders that flatten different parameters are refused on every holder, with one line."""
    shapes = SHAPES if rank != 1 else [*SHAPES[:-1], (2,)]
    try:
        Zero1Group(
            list(zip(_names(shapes), _initial(shapes, torch.float32), strict=True)),
            group=pgs[4],
            optimizer="sgd",
            lr=LR,
        )
        results["layout_refused"] = False
    except HetplanError as exc:
        results["layout_refused"] = "different parameters" in str(exc)
    default = Zero1Group(
        list(zip(_names(SHAPES), _initial(SHAPES, torch.float32), strict=True)), group=pgs[4], optimizer="sgd", lr=1
    )
    results["gloo_default"] = default.collectives


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    pgs = {h: dist.new_group(list(range(h))) for h in (2, 3, 4)}
    results: dict[str, Any] = {}
    for holders in (2, 3, 4):
        for coll in ("all_reduce", "reduce_scatter"):
            for opt in OPTIMIZERS:
                for dtype_name in DTYPES:
                    _equivalence(results, pgs, rank, holders, opt, dtype_name, "equal", coll, SHAPES)
            # weighted shards change the ranges and the collectives, not the arithmetic: two optimizers
            for opt, dtype_name in WEIGHTED_CASES:
                _equivalence(results, pgs, rank, holders, opt, dtype_name, "weighted", coll, SHAPES)
        for coll in ("all_reduce", "reduce_scatter"):
            _overflow(results, pgs, rank, holders, coll)
    for opt, dtype_name in WEIGHTED_CASES:
        for layout in ("equal", "weighted"):
            for coll in ("all_reduce", "reduce_scatter"):
                _equivalence(results, pgs, rank, 4, opt, dtype_name, layout, coll, TINY)
    for opt in OPTIMIZERS:
        for dtype_name in DTYPES:
            _round_trip(results, pgs, rank, opt, dtype_name, out)
    _layout_check(results, pgs, rank)
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    """Every case's figures, the worst over the ranks that ran it."""
    with tempfile.TemporaryDirectory() as folder:
        init = "file://" + os.path.join(folder, "init")
        spawn_ranks(_worker, args=(init, folder), nprocs=WORLD)
        merged: dict[str, Any] = {}
        for rank in range(WORLD):
            for key, value in json.loads(Path(folder, f"rank{rank}.json").read_text()).items():
                if isinstance(value, dict):
                    entry = merged.setdefault(key, {})
                    for k, v in value.items():
                        entry[k] = max(entry[k], v) if k in entry and isinstance(v, (int, float)) else v
                else:
                    merged.setdefault(key, []).append(value)
    return merged


# -- the tests --------------------------------------------------------------------------------------


def _cases(results, prefix: str) -> dict[str, dict[str, Any]]:
    found = {k: v for k, v in results.items() if k.startswith(prefix)}
    assert found, f"no case {prefix}"
    return found


@pytest.mark.parametrize("holders", [2, 3, 4])
def test_sharded_step_equals_the_replicated_optimizer(results, holders: int) -> None:
    cases = {k: v for k, v in _cases(results, f"H{holders}/").items() if k.endswith("/N43")}
    assert len(cases) == (len(OPTIMIZERS) * len(DTYPES) + len(WEIGHTED_CASES)) * 2
    for key, case in cases.items():
        assert case["master"] <= TOL, (key, case)
        assert case["weights"] <= TOL, (key, case)
        assert case["state"] <= TOL, (key, case)
        assert sum(case["sizes"]) == 43
    # the shards really are unequal: the padded last one, and the weighted ones
    assert len(set(results[f"H{holders}/adam/fp32/equal/all_reduce/N43"]["sizes"])) > 1 or holders == 2
    assert len(set(results[f"H{holders}/adam/bf16/weighted/all_reduce/N43"]["sizes"])) == holders


def test_empty_shards_step_and_gather(results) -> None:
    cases = _cases(results, "H4/")
    tiny = {k: v for k, v in cases.items() if k.endswith("/N5")}
    assert len(tiny) == len(WEIGHTED_CASES) * 4
    for key, case in tiny.items():
        assert 0 in case["sizes"], (key, case)
        assert max(case["master"], case["weights"], case["state"]) <= TOL, (key, case)


def test_global_norm_from_shards_equals_clip_grad_norm(results) -> None:
    """Relative to the norm (about 3 to 9): clip_grad_norm_ adds up in fp32, the shards in float64."""
    for key, case in _cases(results, "H").items():
        assert case["norm"] <= TOL, (key, case)
        assert case["clipped"], key


@pytest.mark.parametrize("holders", [2, 3, 4])
def test_an_overflow_is_seen_once_and_skips_the_step(results, holders: int) -> None:
    for coll in ("all_reduce", "reduce_scatter"):
        case = results[f"inf/H{holders}/{coll}"]
        assert case["count"] == 1 and case["holders_of_it"] == 1, case
        assert case["unchanged"] == 0.0 and case["buffer_zeroed"] == 0.0, case


@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_state_saved_over_two_resumes_over_three_or_none(results, opt: str, dtype_name: str) -> None:
    over3 = results[f"resume/{opt}/{dtype_name}/over3"]
    none = results[f"resume/{opt}/{dtype_name}/none"]
    assert max(over3["master"], over3["weights"], over3["state"]) <= TOL, over3
    assert max(none["master"], none["state"]) <= TOL, none


def test_mismatched_holders_are_refused_and_gloo_falls_back(results) -> None:
    assert results["layout_refused"] == [True] * WORLD
    assert results["gloo_default"] == ["all_reduce"] * WORLD


# -- without processes --------------------------------------------------------------------------------


def test_equal_shards_are_ceil_pieces_padded_at_the_end() -> None:
    assert shard_bounds(43, 4) == [(0, 11), (11, 22), (22, 33), (33, 43)]
    assert shard_bounds(5, 4) == [(0, 2), (2, 4), (4, 5), (5, 5)]
    assert shard_bounds(10, 3, [2.0, 2.0, 2.0]) == shard_bounds(10, 3)


def test_weighted_shards_follow_the_weights_and_cover_the_buffer() -> None:
    bounds = shard_bounds(1000, 3, [1.0, 2.0, 1.0])
    assert bounds == [(0, 250), (250, 750), (750, 1000)]
    for n, w in ((43, [1.0, 2.5, 1.5, 3.0]), (5, [1.0, 1.0, 1.0, 10.0]), (7, [3.0, 0.1])):
        b = shard_bounds(n, len(w), w)
        assert b[0][0] == 0 and b[-1][1] == n and all(b[i][1] == b[i + 1][0] for i in range(len(b) - 1))


@pytest.mark.parametrize("weights", [[1.0], [1.0, 0.0], [1.0, math.nan], [1.0, -2.0]])
def test_bad_weights_are_refused(weights) -> None:
    with pytest.raises(HetplanError, match="weights"):
        shard_bounds(10, 2, weights)


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_one_holder_equals_the_replicated_optimizer(opt: str) -> None:
    params = _initial(SHAPES, torch.bfloat16)
    zero = Zero1Group(list(zip(_names(SHAPES), params, strict=True)), group=None, optimizer=opt, lr=LR)
    plain = _Plain(opt, params, SHAPES)
    for step in range(STEPS):
        _feed(zero, step, 0)
        assert zero.start_reduce() == []
        norm = math.sqrt(float(zero.shard_sq_norm()))
        zero.step(clip_coef=clip_coefficient(norm, MAX_NORM))
        assert zero.start_gather() == []
        zero.finish_gather()
        ref = plain.step(torch.bfloat16, step, 1)
        assert abs(norm - ref) <= TOL * ref
    assert _diff(params, [m.detach().to(torch.bfloat16) for m in plain.masters]) <= TOL
    assert _state_diff(zero.state_dict()["optim"], plain, zero.names) <= TOL


def test_loading_state_that_differs_between_parameters_is_refused() -> None:
    params = _initial(SHAPES, torch.float32)
    names = _names(SHAPES)
    zero = Zero1Group(list(zip(names, params, strict=True)), group=None, optimizer="momentum", lr=LR)
    optim = {n: {"momentum_buffer": torch.zeros(s)} for n, s in zip(names, SHAPES, strict=True)}
    optim[names[2]] = {}
    with pytest.raises(HetplanError, match="one state for all"):
        zero.load_state_dict(optim)
    optim[names[2]] = {"momentum_buffer": torch.zeros(3)}
    with pytest.raises(HetplanError, match=r"b1/p2: saved as \[3\]"):
        zero.load_state_dict(optim)
