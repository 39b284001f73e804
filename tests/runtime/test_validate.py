"""The validator under NCCL semantics: bad orderings are refused, every compiled schedule passes.

Three kinds of evidence: hand-written lists that hang only under NCCL (and pass under gloo's
buffered sends), compiled plans of every shape the compiler makes (fixed and random), and random
action lists on which the fast, event-driven check must agree with a naive fixpoint of the same
rules written out plainly below.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Sequence

import pytest
from builders import linear_plan
from hypothesis import given, settings
from hypothesis import strategies as st

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.errors import HetplanError
from hetplan.runtime.validate import validate_programs
from hetplan.schedule.actions import Action, Kind
from hetplan.schedule.compile import compile_plan

_TOKEN = re.compile(r"(SA|RA|SG|RG|F|B)(\d+)(?:[<>](\S+))?")
TRANSFERS = (Kind.SEND_ACT, Kind.RECV_ACT, Kind.SEND_GRAD, Kind.RECV_GRAD)


def acts(text: str) -> list[Action]:
    """``"F0 SA0>b AR1 OPT"`` as actions (whole micro-batches of one sample)."""
    out = []
    for token in text.split():
        if token == "OPT":
            out.append(Action(Kind.STEP))
        elif token.startswith("AR"):
            out.append(Action(Kind.ALLREDUCE, group=int(token[2:])))
        else:
            m = _TOKEN.fullmatch(token)
            assert m, token
            out.append(Action(Kind(m[1]), int(m[2]), m[3] or "", 0, 1))
    return out


def programs_of(**lists: str) -> dict[str, list[Action]]:
    return {name: acts(text) for name, text in lists.items()}


def compiled(plan: Plan, n_blocks: int = 6) -> dict[str, list[Action]]:
    return {a: p.actions for a, p in compile_plan(plan, n_blocks).programs.items()}


def check_both(programs: dict[str, list[Action]]) -> None:
    """A schedule the compiler makes must pass under NCCL and (therefore) under gloo."""
    validate_programs(programs)
    validate_programs(programs, semantics="gloo")


# ---------------------------------------------------------------- orderings that hang only under NCCL
def test_each_rank_sending_first_in_its_own_batch_deadlocks_under_nccl_only() -> None:
    # both sends go out (asynchronously), then each host waits for a receive that is queued, on its
    # pair's stream, behind its own send, whose receive is queued behind the peer's send
    programs = programs_of(a="F0 SA0>b F1 RA1<b OPT", b="F1 SA1>a F0 RA0<a OPT")
    validate_programs(programs, semantics="gloo")  # buffered sends: fine
    with pytest.raises(HetplanError) as info:
        validate_programs(programs)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("the schedule would deadlock under NCCL semantics: a at RA1<b (")
    assert "queued behind its earlier SA0>b" in message
    assert ", b at RA0<a (" in message


def test_the_same_exchange_posted_in_one_batch_passes() -> None:
    # one group call: the send and the receive progress together (send_forward_recv_backward)
    for order in ("SA0>b RA1<b", "RA1<b SA0>b"):
        check_both(programs_of(a=f"F0 {order} OPT", b="F1 SA1>a RA0<a OPT"))


def test_all_reduces_issued_in_opposite_orders_deadlock_under_nccl_only() -> None:
    programs = programs_of(a="F0 B0 AR0 AR1 OPT", b="F0 B0 AR1 AR0 OPT")
    validate_programs(programs, semantics="gloo")  # gloo: one thread per process group
    with pytest.raises(HetplanError, match=r"under NCCL semantics: a at OPT \(its AR0 is waiting for b's AR0 issued"):
        validate_programs(programs)
    # three groups over three devices: a cycle of pairwise-consistent orders is still a deadlock
    cycle = programs_of(a="AR0 AR2 OPT", b="AR0 AR1 OPT", c="AR1 AR2 OPT")
    check_both(cycle)
    cycle = programs_of(a="AR2 AR0 OPT", b="AR0 AR1 OPT", c="AR1 AR2 OPT")
    validate_programs(cycle, semantics="gloo")
    with pytest.raises(HetplanError, match="deadlock under NCCL"):
        validate_programs(cycle)


def test_a_receive_batched_after_a_send_to_the_same_peer_that_sends_first_too() -> None:
    # stage 0 sends activation 1 and only in a later batch (after more compute) receives gradient 0;
    # stage 1 expects the opposite order: it sends gradient 0 first and receives activation 1 in a
    # later batch. gloo buffers both sends; NCCL needs one side to post its receive first.
    s0 = "F0 SA0>s1 F1 SA1>s1 F2 RG0<s1 B0 SA2>s1 RG1<s1 B1 RG2<s1 B2 OPT"
    s1 = "RA0<s0 F0 B0 SG0>s0 F9 RA1<s0 F1 B1 SG1>s0 RA2<s0 F2 B2 SG2>s0 OPT"
    programs = programs_of(s0=s0, s1=s1)
    validate_programs(programs, semantics="gloo")
    with pytest.raises(HetplanError, match=r"s0 at RG0<s1 \(queued behind its earlier SA1>s1"):
        validate_programs(programs)
    # posting s1's gradient send and its next receive together (as the compiler does) fixes it
    check_both(programs_of(s0=s0, s1=s1.replace("SG0>s0 F9 RA1<s0", "SG0>s0 RA1<s0")))


def test_compiled_1f1b_posted_one_transfer_at_a_time_deadlocks_under_nccl_only() -> None:
    """Why the runtime batches: 1F1B's steady state needs ``send_forward_recv_backward``.

    A compute action between every two transfers (``F99``, which the validator cannot tell from a
    real one) makes each transfer a batch of its own, as plain ``isend``/``irecv`` would.
    """

    def one_at_a_time(actions: list[Action]) -> list[Action]:
        out: list[Action] = []
        for a in actions:
            if out and a.kind in TRANSFERS and out[-1].kind in TRANSFERS:
                out.append(Action(Kind.FORWARD, 99, "", 0, 1))
            out.append(a)
        return out

    devices = ["n0/0", "n0/1", "n0/2"]
    one_f_one_b = {d: one_at_a_time(a) for d, a in compiled(linear_plan(devices, 6, [1] * 4)).items()}
    validate_programs(one_f_one_b, semantics="gloo")
    with pytest.raises(HetplanError, match=r"n0/1 at RG0<n0/2 \(queued behind its earlier SA1>n0/2"):
        validate_programs(one_f_one_b)
    gpipe = {d: one_at_a_time(a) for d, a in compiled(linear_plan(devices, 6, [1] * 4, schedule="gpipe")).items()}
    check_both(gpipe)  # all forwards, then all backwards: each pair's traffic goes one way at a time


def test_sends_and_receives_of_one_pair_must_be_posted_in_the_same_order_under_nccl() -> None:
    # NCCL has no tags: the first receive would get micro-batch 0's tensor
    programs = programs_of(a="F0 SA0>b F1 SA1>b OPT", b="RA1<a RA0<a F0 F1 OPT")
    validate_programs(programs, semantics="gloo")
    with pytest.raises(HetplanError, match=r"a -> b: the 1st send is SA0>b .* but the 1st receive is RA1<a"):
        validate_programs(programs)


def test_a_step_waits_for_its_sends_to_be_received_under_nccl_only() -> None:
    # a's step needs b to receive SA0, which b does after a message that a sends after its step
    programs = programs_of(a="SA0>b OPT SA1>c OPT", c="RA1<a F0 SA2>b OPT", b="RA2<c F0 RA0<a OPT")
    validate_programs(programs, semantics="gloo")  # buffered: a's step does not wait
    with pytest.raises(HetplanError, match=r"a at OPT \(its SA0>b is waiting for b to post RA0<a; b is stuck at RA2<c"):
        validate_programs(programs)


def test_a_pipeline_of_three_devices_passing_sends_around_a_ring_is_fine_per_pair() -> None:
    # each send waits for a different pair than the receive behind it: no head-of-line blocking
    check_both(programs_of(a="SA0>b F0 RA2<c OPT", b="SA1>c F0 RA0<a OPT", c="SA2>a F0 RA1<b OPT"))


# ---------------------------------------------------------------- what both semantics refuse
def test_a_receive_waited_on_before_the_send_it_needs_deadlocks_under_both() -> None:
    programs = programs_of(a="RA1<b F0 SA0>b OPT", b="RA0<a F1 SA1>a OPT")
    for semantics, label in (("nccl", "NCCL"), ("gloo", "gloo")):
        with pytest.raises(HetplanError, match=rf"under {label} semantics: a at RA1<b \(waiting for b to post SA1>a"):
            validate_programs(programs, semantics=semantics)


def test_the_compiled_two_stage_schedule_with_a_send_moved_behind_a_receive() -> None:
    programs = compiled(linear_plan(["n0/0", "n0/1"], 6, [1, 1]))
    check_both(programs)
    first = programs["n0/0"]  # F0 SA0>n0/1 F1 SA1>n0/1 RG0<n0/1 B0 RG1<n0/1 B1 OPT
    send = next(a for a in first if a.kind is Kind.SEND_ACT and a.micro == 0)
    rest = [a for a in first if a != send]
    # behind RG0's backward, the send waits for a gradient that needs it: a deadlock under both
    late = [*rest]
    late.insert(next(i for i, a in enumerate(rest) if a.kind is Kind.BACKWARD and a.micro == 0) + 1, send)
    for semantics, label in (("nccl", "NCCL"), ("gloo", "gloo")):
        with pytest.raises(HetplanError, match=rf"under {label} semantics: n0/0 at RG0<n0/1 .*, n0/1 at RA0<n0/0"):
            validate_programs({**programs, "n0/0": late}, semantics=semantics)
    # right behind RG0 it joins RG0's batch, posted before the wait: no hang, but under NCCL (no
    # tags) the first activation received would be micro-batch 1's
    batched = [*rest]
    batched.insert(next(i for i, a in enumerate(rest) if a.kind is Kind.RECV_GRAD and a.micro == 0) + 1, send)
    validate_programs({**programs, "n0/0": batched}, semantics="gloo")
    with pytest.raises(HetplanError, match=r"the 1st send is SA1>n0/1 .* but the 1st receive is RA0<n0/0"):
        validate_programs({**programs, "n0/0": batched})


def test_static_rules_are_kept() -> None:
    with pytest.raises(HetplanError, match="device a: backward of micro-batch 0 comes before its forward"):
        validate_programs(programs_of(a="B0 F0 OPT"))
    with pytest.raises(HetplanError, match=r"a -> b: 1 send\(s\) but 0 receive\(s\) of activations of micro-batch 0"):
        validate_programs(programs_of(a="F0 SA0>b OPT", b="RG0<a OPT"), semantics="gloo")
    with pytest.raises(HetplanError, match="a issues AR0 2 time"):
        validate_programs(programs_of(a="AR0 AR0 OPT", b="AR0 OPT"))
    with pytest.raises(HetplanError, match="unknown communication semantics 'mpi'"):
        validate_programs(programs_of(a="F0 OPT"), semantics="mpi")


def test_outstanding_sends_at_the_step_are_named() -> None:
    # a's step waits for its send, which completes once b has passed its own step and receives
    check_both(programs_of(a="F0 SA0>b OPT", b="AR0 OPT RA0<a", c="AR0 OPT"))
    # b's step waits for its send, whose receive on a is queued behind a send that b receives after its step
    hang = programs_of(a="F0 SA0>b F1 RA1<b OPT", b="SA1>a OPT RA0<a")
    validate_programs(hang, semantics="gloo")
    with pytest.raises(HetplanError, match=r"b at OPT \(its SA1>a is waiting for a's RA1<b queued there behind SA0>b"):
        validate_programs(hang)


def test_the_message_is_deterministic_and_starts_with_the_cycle() -> None:
    # d waits on the a/b cycle without being part of it: the cycle is named first
    programs = programs_of(d="RA5<a OPT", a="F0 SA0>b F1 RA1<b F5 SA5>d OPT", b="F1 SA1>a F0 RA0<a OPT", c="F0 OPT")
    messages = set()
    for _ in range(3):
        with pytest.raises(HetplanError) as info:
            validate_programs(programs)
        messages.add(str(info.value))
    (message,) = messages
    assert re.search(
        r"NCCL semantics: a at RA1<b .*, b at RA0<a .*, d at RA5<a \(waiting for a to post SA5>d; a is stuck", message
    )


# ---------------------------------------------------------------- compiled schedules pass
def _stage(start: int, end: int, *devices: str, shares: Sequence[float] | None = None) -> Stage:
    return Stage(start, end, devices, tuple(shares or [1.0 / len(devices)] * len(devices)))


def _plan(pipelines: list[Pipeline], schedule: str) -> Plan:
    return Plan(global_batch=sum(p.batch for p in pipelines), pipelines=pipelines, schedule=schedule, optimizer="sgd")


SHAPES = {
    "one stage": [Pipeline(8, (4, 4), (_stage(0, 6, "n0/0"),))],
    "two stages, unequal micro-batches": [Pipeline(8, (1, 2, 5), (_stage(0, 3, "n0/0"), _stage(3, 6, "n0/1")))],
    "three stages": [Pipeline(6, (2, 2, 2), (_stage(0, 2, "n0/0"), _stage(2, 4, "n0/1"), _stage(4, 6, "n0/2")))],
    "four stages": [
        Pipeline(8, (2,) * 4, (_stage(0, 1, "n0/0"), _stage(1, 3, "n0/1"), _stage(3, 5, "n0/2"), _stage(5, 6, "n0/3")))
    ],
    "two replicas feed one": [
        Pipeline(8, (3, 5), (_stage(0, 2, "n0/0", "n0/1", shares=(0.75, 0.25)), _stage(2, 6, "n0/2")))
    ],
    "one feeds three, three feed two": [
        Pipeline(
            12,
            (5, 4, 3),
            (
                _stage(0, 2, "n0/0"),
                _stage(2, 4, "n0/1", "n0/2", "n0/3", shares=(0.5, 0.3, 0.2)),
                _stage(4, 6, "n1/0", "n1/1", shares=(0.6, 0.4)),
            ),
        )
    ],
    "a replica with no samples of a micro-batch": [
        Pipeline(4, (1, 3), (_stage(0, 3, "n0/0", "n0/1"), _stage(3, 6, "n0/2", "n0/3", shares=(0.3, 0.7))))
    ],
    "pipelines cut differently": [
        Pipeline(5, (1, 2, 2), (_stage(0, 2, "n0/0"), _stage(2, 6, "n0/1"))),
        Pipeline(3, (3,), (_stage(0, 4, "n0/2"), _stage(4, 6, "n0/3"))),
        Pipeline(
            4, (1, 1, 2), (_stage(0, 1, "n1/0"), _stage(1, 3, "n1/1"), _stage(3, 5, "n1/2"), _stage(5, 6, "n1/3"))
        ),
    ],
    "replicated pipelines cut differently": [
        Pipeline(6, (2, 4), (_stage(0, 3, "n0/0", "n0/1", shares=(0.6, 0.4)), _stage(3, 6, "n0/2"))),
        Pipeline(6, (3, 3), (_stage(0, 1, "n1/0"), _stage(1, 5, "n1/1", "n1/2"), _stage(5, 6, "n1/3"))),
        Pipeline(2, (2,), (_stage(0, 6, "n2/0"),)),
    ],
}


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_compiled_shape_passes(shape: str, schedule: str) -> None:
    check_both(compiled(_plan(SHAPES[shape], schedule)))


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("stages", "micro"), [(1, 1), (2, 1), (3, 2), (4, 4), (4, 7), (4, 16)])
def test_linear_pipelines_pass(schedule: str, stages: int, micro: int) -> None:
    sizes = [1 + j % 3 for j in range(micro)]
    check_both(compiled(linear_plan([f"n0/{i}" for i in range(stages)], 8, sizes, schedule=schedule), 8))


@st.composite
def random_plans(draw: st.DrawFn) -> Plan:
    """1-3 pipelines over 6 blocks, each cut anywhere into 1-4 stages of 1-3 replicas with any shares."""
    pipelines = []
    for p in range(draw(st.integers(1, 3))):
        n_stages = draw(st.integers(1, 4))
        cuts = [0, *sorted(draw(st.sets(st.integers(1, 5), min_size=n_stages - 1, max_size=n_stages - 1))), 6]
        micro = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=6)))
        stages = []
        for s in range(n_stages):
            shares = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
            devices = tuple(f"n{p}/{s * 3 + r}" for r in range(len(shares)))
            stages.append(Stage(cuts[s], cuts[s + 1], devices, tuple(x / sum(shares) for x in shares)))
        pipelines.append(Pipeline(sum(micro), micro, tuple(stages)))
    return _plan(pipelines, draw(st.sampled_from(["1f1b", "gpipe"])))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(plan=random_plans())
def test_random_compiled_plans_pass(plan: Plan) -> None:
    check_both(compiled(plan))


# ---------------------------------------------------------------- the fast check equals a naive one
def naive_finishes(programs: dict[str, list[Action]], semantics: str) -> bool:
    """The same rules as a plain fixpoint over every device and operation (quadratic, obviously right).

    Hosts: compute runs; a batch (consecutive transfers) is posted whole and, if it receives anything,
    the host waits for all of it; AR is issued; OPT waits for the device's posted sends and issued all-reduces. NCCL: a
    send and its receive (k-th of the pair, in order) complete together once both are posted and
    every operation with the same peer from an earlier batch on each side is complete; an all-reduce
    completes once every member has issued it and, on each, every earlier all-reduce is complete.
    gloo: sends complete when posted; a receive when its send (by key) is posted; all-reduces when
    every member has issued them.
    """
    nccl = semantics == "nccl"
    ops = [(d, i) for d, xs in programs.items() for i, a in enumerate(xs) if a.kind in TRANSFERS]

    def batch(d: str, i: int) -> int:
        while i > 0 and programs[d][i - 1].kind in TRANSFERS:
            i -= 1
        return i

    partner: dict[tuple[str, int], tuple[str, int]] = {}
    by: dict[tuple, list[list[tuple[str, int]]]] = {}
    for d, i in ops:
        a = programs[d][i]
        send = a.kind in (Kind.SEND_ACT, Kind.SEND_GRAD)
        pair = (d, a.peer) if send else (a.peer, d)
        key = pair if nccl else (*pair, a.kind in (Kind.SEND_GRAD, Kind.RECV_GRAD), a.micro, a.lo, a.hi)
        by.setdefault(key, [[], []])[0 if send else 1].append((d, i))
    for sends, recvs in by.values():
        for s, r in zip(sends, recvs, strict=True):
            partner[s], partner[r] = r, s
    members: dict[tuple[int, int], set[str]] = {}
    for d, xs in programs.items():
        seen: dict[int, int] = {}
        for a in xs:
            if a.kind is Kind.ALLREDUCE:
                k = seen[a.group] = seen.get(a.group, -1) + 1
                members.setdefault((a.group, k), set()).add(d)
    pc = dict.fromkeys(programs, 0)
    issued: dict[str, list[tuple[int, int]]] = {d: [] for d in programs}
    counts: dict[str, dict[int, int]] = {d: {} for d in programs}
    posted: set[tuple[str, int]] = set()
    done: set[tuple[str, int]] = set()
    colls_done: set[tuple[int, int]] = set()

    def ready(o: tuple[str, int]) -> bool:
        if o not in posted:
            return False
        if not nccl:
            return True
        d, i = o
        peer = programs[d][i].peer
        return all(
            (d, j) in done
            for j in range(batch(d, i))
            if programs[d][j].kind in TRANSFERS and programs[d][j].peer == peer
        )

    def coll_ready(d: str, inst: tuple[int, int]) -> bool:
        if inst not in issued[d]:
            return False
        return not nccl or all(x in colls_done for x in issued[d][: issued[d].index(inst)])

    changed = True
    while changed:
        changed = False
        for d, xs in programs.items():
            while pc[d] < len(xs):
                a = xs[pc[d]]
                if a.kind in (Kind.FORWARD, Kind.BACKWARD):
                    pc[d] += 1
                elif a.kind is Kind.ALLREDUCE:
                    k = counts[d][a.group] = counts[d].get(a.group, -1) + 1
                    issued[d].append((a.group, k))
                    pc[d] += 1
                elif a.kind is Kind.STEP:
                    sends_done = all((d, j) in done for (e, j) in posted if e == d)
                    if not sends_done or not all(x in colls_done for x in issued[d]):
                        break
                    pc[d] += 1
                else:
                    end = pc[d]
                    while end < len(xs) and xs[end].kind in TRANSFERS:
                        posted.add((d, end))
                        end += 1
                    receives = any(xs[j].kind in (Kind.RECV_ACT, Kind.RECV_GRAD) for j in range(pc[d], end))
                    if receives and not all((d, j) in done for j in range(pc[d], end)):
                        break  # a batch that receives is waited on whole
                    pc[d] = end
                changed = True
        for o in sorted(posted - done):
            if not nccl and programs[o[0]][o[1]].kind in (Kind.SEND_ACT, Kind.SEND_GRAD):
                done.add(o)
                changed = True
            elif ready(o) and ready(partner[o]):
                done.update((o, partner[o]))
                changed = True
        for inst, who in members.items():
            if inst not in colls_done and all(coll_ready(d, inst) for d in who):
                colls_done.add(inst)
                changed = True
    return all(pc[d] == len(xs) for d, xs in programs.items()) and posted == done and len(colls_done) == len(members)


@st.composite
def random_programs(draw: st.DrawFn) -> dict[str, list[Action]]:
    """2-4 devices exchanging random messages and all-reduces in random orders, with random batching.

    Messages of one ordered pair are numbered in the order each side lists them, so the NCCL
    in-order pairing always agrees and only the dynamic rules decide.
    """
    names = [f"d{i}" for i in range(draw(st.integers(2, 4)))]
    tokens: dict[str, list[tuple]] = {d: [] for d in names}
    for _ in range(draw(st.integers(0, 8))):
        src, dst = draw(st.permutations(names))[:2]
        tokens[src].append(("send", dst))
        tokens[dst].append(("recv", src))
    for g in range(draw(st.integers(0, 3))):
        for d in draw(st.sets(st.sampled_from(names), min_size=2)):
            tokens[d].append(("ar", g))
    for d in names:
        tokens[d] += [("sep", i) for i in range(draw(st.integers(0, 4)))]
        tokens[d] += [("opt",)] * draw(st.integers(0, 2))  # steps in the middle: waits for everything
    programs = {}
    numbered: dict[tuple[str, str, str], int] = {}
    for d in names:
        out = []
        for t in draw(st.permutations(tokens[d])):
            if t[0] in ("send", "recv"):
                pair = (d, t[1]) if t[0] == "send" else (t[1], d)
                k = numbered[(*pair, t[0])] = numbered.get((*pair, t[0]), -1) + 1
                kind = (
                    (Kind.SEND_GRAD if k % 2 else Kind.SEND_ACT)
                    if t[0] == "send"
                    else (Kind.RECV_GRAD if k % 2 else Kind.RECV_ACT)
                )
                out.append(Action(kind, k, t[1], 0, 1))
            elif t[0] == "ar":
                out.append(Action(Kind.ALLREDUCE, group=t[1]))
            elif t[0] == "sep":
                out.append(Action(Kind.FORWARD, 100 + t[1], "", 0, 1))
            else:
                out.append(Action(Kind.STEP))
        programs[d] = [*out, Action(Kind.STEP)]
    return programs


@settings(max_examples=400, deadline=None, derandomize=True)
@given(programs=random_programs())
def test_the_event_driven_check_agrees_with_a_naive_fixpoint(programs: dict[str, list[Action]]) -> None:
    verdicts = {}
    for semantics in ("nccl", "gloo"):
        try:
            validate_programs(programs, semantics=semantics)
            verdicts[semantics] = True
        except HetplanError as exc:
            assert "deadlock" in str(exc) and "\n" not in str(exc), str(exc)
            verdicts[semantics] = False
        assert verdicts[semantics] == naive_finishes(programs, semantics), (semantics, programs)
    assert verdicts["gloo"] or not verdicts["nccl"]  # NCCL is the stricter


# ---------------------------------------------------------------- cost and imports
def test_a_large_compiled_plan_is_checked_quickly() -> None:
    # 4 pipelines x 16 stages cut two ways (odd pipelines shifted by one block), every third stage
    # replicated 2-way and resharded: 84 devices, 64 micro-batches each
    pipelines = []
    for p in range(4):
        cuts = [0, *(2 * s + p % 2 for s in range(1, 16)), 33]
        stages = []
        for s in range(16):
            devices = (f"n{p}/{s}", f"m{p}/{s}") if s % 3 == 1 else (f"n{p}/{s}",)
            stages.append(_stage(cuts[s], cuts[s + 1], *devices))
        pipelines.append(Pipeline(128, (2,) * 64, tuple(stages)))
    programs = compiled(_plan(pipelines, "1f1b"), 33)
    n_actions = sum(len(a) for a in programs.values())
    start = time.thread_time()  # CPU time: other load on the machine does not count
    validate_programs(programs)
    elapsed = time.thread_time() - start
    assert len(programs) == 84 and n_actions > 30_000
    assert elapsed < 5.0, f"{elapsed:.2f} s for {n_actions} actions"


def test_the_validator_imports_no_torch() -> None:
    code = "import sys, hetplan.runtime.validate; assert not any(m.startswith('torch') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- tensor-parallel groups: the all-reduces inside F/B as barriers ------------------------------------


def test_a_tensor_parallel_barrier_that_closes_a_cycle_is_refused() -> None:
    """b (a's TP partner) waits for c's send, which c makes after computing on a's send, which a
    makes after its F0; with a and b a TP group, a's F0 waits for b: a cycle the lists alone do not show."""
    programs = programs_of(a="F0 SA0>c", b="RA0<c F0", c="RA0<a F0 SA0>b")
    check_both(programs)  # without the group: no wait at F0
    groups = {"a": ("a", "b"), "b": ("a", "b")}
    for semantics in ("nccl", "gloo"):
        with pytest.raises(HetplanError, match=r"a at F0 \(its tensor-parallel group waits for b to reach it\)"):
            validate_programs(programs, semantics=semantics, tp_groups=groups)


@pytest.mark.parametrize(
    ("degrees", "schedule"),
    [((2, 2), "1f1b"), ((2, 1), "1f1b"), ((1, 2), "gpipe"), ((2, 4), "1f1b"), ((4, 2), "gpipe")],
)
def test_compiled_tensor_parallel_plans_pass_with_their_groups(degrees: tuple[int, int], schedule: str) -> None:
    """Split boundary sends (each member receives its chunk) and TP barriers at every F/B, on two
    replicated pipelines: what the compiler makes passes, under both semantics."""
    first, second = degrees
    pipelines = []
    for p in range(2):
        base = p * (first + second)
        devices_a = tuple(f"n0/{base + i}" for i in range(first))
        devices_b = tuple(f"n0/{base + first + i}" for i in range(second))
        stages = (
            Stage(0, 3, devices_a, (1.0,), tensor_parallel=first),
            Stage(3, 6, devices_b, (1.0,), tensor_parallel=second),
        )
        pipelines.append(Pipeline(4, (1, 2, 1), stages))
    plan = Plan(8, pipelines, schedule=schedule)
    programs = compile_plan(plan, 6).programs
    groups = {a: p.tp_group for a, p in programs.items()}
    assert any(len(g) > 1 for g in groups.values())
    for semantics in ("nccl", "gloo"):
        validate_programs({a: p.actions for a, p in programs.items()}, semantics=semantics, tp_groups=groups)
