"""Check per-device action lists before the first step: a schedule that would hang is refused.

Every rank runs this before its first step (and the tests run it over large compiled plans), so it
is a pure-Python abstract execution, linear in the number of actions, and imports no torch.

Static rules (both semantics): each forward precedes its backward on a device; every send has
exactly one matching receive (same micro-batch, kind, sample range, peer); a collective is issued
the same number of times by every device that issues it. Under ``"nccl"`` also: between one pair of
ranks the k-th send in one direction meets the k-th receive on the other side, because NCCL has no
tags (``torch.distributed.isend``: "tag is not supported with the NCCL backend";
``batch_isend_irecv``: "the ordering does matter for multiple operations between the same pair of
ranks in the same direction"). Under gloo a receive finds its send by tag, so order does not matter.
The order is checked after the abstract run, so an order that would also hang is reported as the
deadlock it causes (the run pairs a send with the receive of the same key).

The dynamic rule: execute the lists abstractly and refuse the schedule if some device can never go
on. What a device's list means (the runtime contract, produced by :mod:`hetplan.schedule.compile`):

* ``F`` / ``B``: compute; always finishes.
* a run of consecutive ``SA``/``RA``/``SG``/``RG`` is one *batch*, posted together
  (``batch_isend_irecv``); if the batch receives anything the host then waits for the whole batch
  (NCCL returns one work for a coalesced batch, so its sends cannot be waited on apart from its
  receives); a batch of sends alone is waited on at ``OPT`` at the latest.
* ``AR g``: the all-reduce of gradient group ``g``, issued asynchronously; waited on at ``OPT``.
* ``OPT`` (and the end of the list): waits for every outstanding send and all-reduce of the device.

The model of NCCL (``semantics="nccl"``, the default and the stricter). It is written from what the
NCCL documentation ("Point-to-point communication", "Group calls", "Using multiple NCCL
communicators concurrently") and PyTorch's ``ProcessGroupNCCL`` say, from memory (no search was
available when this was written), and it is deliberately conservative:

* rendezvous: a send completes only when the matching receive has been posted on the peer and can
  progress there, and vice versa (NCCL may complete small sends eagerly, but a schedule that relies
  on that hangs as soon as a message outgrows NCCL's buffers);
* one stream per pair of ranks: on a rank, an operation with peer ``p`` cannot progress until every
  operation with ``p`` posted in an *earlier* batch has completed (kernels on one CUDA stream run in
  order); the operations of one batch progress together (a group call: "calls within a group can be
  seen as progressing independently, hence should never block each other");
* collectives: an all-reduce completes only when every member has issued it, and each rank's
  collectives run in issue order (NCCL kernels block waiting for their peers, so collectives on
  different communicators must be issued in one consistent order on every rank); two ranks issuing
  two all-reduces in opposite orders deadlock;
* the host blocks only where the contract above says so.

Not modelled, and why it is fine today: the loss all-reduce after ``OPT`` (every device has then
waited for everything, so it acts as a barrier between iterations and one iteration is enough to
check); ``batch_isend_irecv`` on NCCL coalescing a batch onto the group's main communicator, which
serializes *all* batches of a rank on one stream rather than one per pair (stricter than the model
above; compiled schedules were checked under that stricter rule too, see ``docs/runtime.md``).
Tensor parallelism's collectives inside a replica (the all-reduces inside ``F``/``B`` and the
all-gather of a split boundary buffer right before ``F``/``B``, :mod:`hetplan.schedule.boundary`) are
run as barriers when the caller gives each device's group (``tp_groups``; the runtime does): the
k-th ``F``/``B`` of a member finishes once every member of its group has reached its own k-th, so a
member whose receives wait, through other devices, on a partner's later sends is reported as the
cycle it is. They are kept apart from the gradient all-reduces' issue order (a group's collectives
run on a communicator of their own, and every member issues its gradient all-reduces at the same
places of the same list). A split transfer whose piece is empty is posted by neither side (both
compute the same :func:`~hetplan.schedule.boundary.piece`); checking the pair as posted is the
stricter case.

``semantics="gloo"`` is the looser model the previous validator used (sends buffered: complete
when posted), under the same contract: a receive completes once its send has been posted, by tag,
with no ordering between the operations of a pair, and an all-reduce completes once every member
has issued it, whatever else they issued before (gloo runs each process group on its own threads
and matches its collectives by sequence number). Two differences from the previous validator follow
from the contract: a batch's sends are posted before its receives are waited on, wherever they sit
in the batch (``batch_isend_irecv`` posts every operation first, on gloo too), and all-reduces no
longer block the host where they are issued.

The abstract run is event driven: each device's host advances until it blocks; completing an
operation or a collective wakes only the devices it concerns, so every action, batch and queue
segment is handled a bounded number of times.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hetplan.errors import HetplanError
from hetplan.schedule.actions import Action, Kind
from hetplan.schedule.compile import gc_paused

__all__ = ["SEMANTICS", "P2PGroup", "validate_p2p_groups", "validate_programs"]

SEMANTICS = ("nccl", "gloo")

_SENDS = (Kind.SEND_ACT, Kind.SEND_GRAD)
_TRANSFERS = frozenset((Kind.SEND_ACT, Kind.RECV_ACT, Kind.SEND_GRAD, Kind.RECV_GRAD))
_GRADS = (Kind.SEND_GRAD, Kind.RECV_GRAD)
_LABEL = {"nccl": "NCCL", "gloo": "gloo"}
_SHOWN = 4  # devices named in a deadlock message; the rest are counted


def _key(src: str, dst: str, a: Action) -> tuple:
    """What a send and its receive share: the pair, the direction of data, the micro-batch, the samples."""
    return (src, dst, a.kind in _GRADS, a.micro, a.lo, a.hi)


def _describe(key: tuple) -> str:
    _, _, grad, micro, lo, hi = key
    return f"{'gradients' if grad else 'activations'} of micro-batch {micro} samples [{lo}, {hi})"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def validate_programs(
    actions: Mapping[str, Sequence[Action]],
    *,
    semantics: str = "nccl",
    tp_groups: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """Raise a one-line :class:`HetplanError` naming the devices and actions of the first problem found.

    ``semantics`` is ``"nccl"`` (the default: what the GPU runtime needs, and safe for gloo too) or
    ``"gloo"`` (buffered sends, tag matching), so tests can tell the two apart. ``tp_groups``: each
    device's tensor-parallel group (``DeviceProgram.tp_group``), whose collectives inside ``F``/``B``
    are run as barriers: the k-th ``F``/``B`` of a member finishes once every member has reached its own.
    """
    if semantics not in SEMANTICS:
        raise HetplanError(f"unknown communication semantics {semantics!r}: expected one of {', '.join(SEMANTICS)}")
    for device, acts in actions.items():
        seen_forward: set[int] = set()
        for a in acts:
            if a.kind is Kind.FORWARD:
                seen_forward.add(a.micro)
            elif a.kind is Kind.BACKWARD and a.micro not in seen_forward:
                raise HetplanError(f"device {device}: backward of micro-batch {a.micro} comes before its forward")
    with gc_paused():  # tens of thousands of small lists and tuples, no cycles: see gc_paused
        run = _AbstractRun(actions, nccl=semantics == "nccl", tp_groups=tp_groups)
        run.execute()
        if semantics == "nccl":
            run.check_pair_order()


@dataclass(frozen=True)
class P2PGroup:
    """A process group that batched send/receive use, as the runtime sets it up at start-up.

    ``members``: the device addresses (``central`` for the central process) of the group;
    ``initialised_on``: those that run a collective on it before any batched send/receive
    (:func:`hetplan.runtime.device.transport.warm_p2p_group`)."""

    name: str
    members: frozenset[str]
    initialised_on: frozenset[str]


def validate_p2p_groups(
    actions: Mapping[str, Sequence[Action]], groups: Sequence[P2PGroup], *, semantics: str = "nccl"
) -> None:
    """Refuse, in one line, batched send/receive on a group that is not set up for it.

    Every transfer's two devices must be members of a group; under ``"nccl"`` that group must be
    initialised on every member at start-up, since ``batch_isend_irecv`` as a group's first
    collective needs all its members, and a member that never transfers (a one-device pipeline of
    wsp or sdpipe) would never join it: the others would hang in their first batch.
    """
    if semantics not in SEMANTICS:
        raise HetplanError(f"unknown communication semantics {semantics!r}: expected one of {', '.join(SEMANTICS)}")
    for device, acts in actions.items():
        for a in acts:
            if a.kind not in _TRANSFERS:
                continue
            group = next((g for g in groups if device in g.members and a.peer in g.members), None)
            if group is None:
                raise HetplanError(f"device {device}: {a} has no process group holding both {device} and {a.peer}")
            missing = sorted(group.members - group.initialised_on)
            if semantics == "nccl" and missing:
                shown = ", ".join(missing[:_SHOWN]) + (
                    f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else ""
                )
                raise HetplanError(
                    f"device {device}: {a} is a batched send/receive on {group.name}, which {shown} never "
                    "initialise at start-up: under NCCL the first batch would need every member and hang"
                )


class _AbstractRun:
    """The action lists as operations, batches, pair queues and collectives, run to a fixpoint.

    Everything is indexed by small integers in flat lists (devices, operations, batches, queue
    segments, collective instances): the run touches each a bounded number of times.

    A *segment* is the operations of one batch that share one queue; a queue (one per device and
    peer under NCCL) is a list of segments in issue order, and only its head segment may progress.
    Under gloo every operation is its own queue, so nothing waits behind anything.
    """

    def __init__(
        self,
        actions: Mapping[str, Sequence[Action]],
        *,
        nccl: bool,
        tp_groups: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.nccl = nccl
        self.label = _LABEL["nccl" if nccl else "gloo"]
        self.names: list[str] = list(actions)
        self.programs: list[Sequence[Action]] = [actions[n] for n in self.names]
        n_dev = len(self.names)
        # operations (one per transfer action)
        self.op_dev: list[int] = []
        self.op_pos: list[int] = []
        self.op_send: list[bool] = []
        self.op_batch: list[int] = []
        self.op_seg: list[int] = []
        # batches
        self.batch_of: list[dict[int, int]] = [{} for _ in range(n_dev)]  # device -> first position -> batch
        self.batch_end: list[int] = []
        self.batch_segs: list[list[int]] = []
        self.batch_ops: list[list[int]] = []
        # queue segments and queues
        self.seg_ops: list[list[int]] = []
        self.seg_queue: list[int] = []
        self.queue_segs: list[list[int]] = []
        # collectives: instance (group, k-th issue); per device its instances in issue order
        self.coll_group: list[int] = []
        self.coll_members: list[list[int]] = []
        self.coll_ready: list[int] = []
        self.coll_done: list[bool] = []
        self.dev_colls: list[list[int]] = [[] for _ in range(n_dev)]
        self.dev_coll_pos: list[list[int]] = [[] for _ in range(n_dev)]  # position of each in the list
        self.coll_issued = [0] * n_dev
        self.coll_head = [0] * n_dev
        # tensor-parallel groups: the k-th F/B of every member meets (a barrier: the blocks' all-reduces)
        index = {name: d for d, name in enumerate(self.names)}
        self.tp_members: list[tuple[int, ...]] = []
        for name in self.names:
            group = tuple(index[m] for m in (tp_groups or {}).get(name, ()) if m in index)
            self.tp_members.append(group if len(group) > 1 else ())
        self.tp_reached = [0] * n_dev  # F/B actions passed
        self.tp_arrived: dict[tuple[tuple[int, ...], int], int] = {}  # (group, k) -> members there
        self.tp_waiting = [-1] * n_dev  # the k the device has arrived at and waits on (-1: none)
        # hosts
        self.pc = [0] * n_dev
        self.outstanding = [0] * n_dev  # sends and collectives issued and not complete
        # _build also sets, per batch: batch_sends, batch_pending (receives not complete yet),
        # batch_posted; per segment: seg_left (operations not complete yet), seg_posted; per queue:
        # queue_head (its first segment not complete yet)
        self._build()
        self.op_partner = self._pair()
        n_ops = len(self.op_dev)
        self.op_ready = [False] * n_ops
        self.op_done = [False] * n_ops
        self.runnable: list[int] = []

    # ------------------------------------------------------------------ building
    def _build(self) -> None:
        """One pass over every action: operations, batches, queue segments and collective instances."""
        nccl = self.nccl
        self.sends_by_key: dict[tuple, list[int]] = {}
        self.recvs_by_key: dict[tuple, list[int]] = {}
        sends_by_key, recvs_by_key = self.sends_by_key, self.recvs_by_key
        coll_of: dict[tuple[int, int], int] = {}
        issued: list[dict[int, int]] = []
        transfers, sends, allreduce, grads = _TRANSFERS, _SENDS, Kind.ALLREDUCE, _GRADS
        op_dev, op_pos, op_send, op_batch, op_seg = self.op_dev, self.op_pos, self.op_send, self.op_batch, self.op_seg
        batch_end, batch_segs, batch_ops = self.batch_end, self.batch_segs, self.batch_ops
        seg_ops, seg_queue, queue_segs = self.seg_ops, self.seg_queue, self.queue_segs
        for d, (name, acts) in enumerate(zip(self.names, self.programs, strict=True)):
            counts: dict[int, int] = {}
            issued.append(counts)
            batch = -1
            segs: dict[str, int] = {}  # peer -> this batch's segment of that peer's queue
            queues: dict[str, int] = {}  # peer -> queue of this device
            batch_of = self.batch_of[d]
            ops: list[int] = []
            for pos, a in enumerate(acts):
                kind = a.kind
                if kind not in transfers:
                    if batch >= 0:
                        batch_end[batch] = pos
                        batch = -1
                    if kind is allreduce:
                        k = counts.get(a.group, 0)
                        counts[a.group] = k + 1
                        inst = coll_of.get((a.group, k))
                        if inst is None:
                            inst = coll_of[(a.group, k)] = len(self.coll_group)
                            self.coll_group.append(a.group)
                            self.coll_members.append([])
                        self.coll_members[inst].append(d)
                        self.dev_colls[d].append(inst)
                        self.dev_coll_pos[d].append(pos)
                    continue
                if batch < 0:
                    batch = batch_of[pos] = len(batch_end)
                    batch_end.append(len(acts))
                    ops = []
                    batch_ops.append(ops)
                    batch_segs.append([])
                    segs = {}
                op = len(op_dev)
                op_dev.append(d)
                op_pos.append(pos)
                op_batch.append(batch)
                ops.append(op)
                peer = a.peer
                if kind in sends:
                    op_send.append(True)
                    key = (name, peer, kind in grads, a.micro, a.lo, a.hi)
                    by_key = sends_by_key
                else:
                    op_send.append(False)
                    key = (peer, name, kind in grads, a.micro, a.lo, a.hi)
                    by_key = recvs_by_key
                listed = by_key.get(key)
                if listed is None:
                    by_key[key] = [op]
                else:
                    listed.append(op)
                seg = segs.get(peer, -1) if nccl else -1
                if seg < 0:
                    seg = len(seg_ops)
                    queue = queues.get(peer, -1) if nccl else -1
                    if queue < 0:
                        queue = len(queue_segs)
                        queue_segs.append([])
                        if nccl:
                            queues[peer] = queue
                    if nccl:
                        segs[peer] = seg
                    queue_segs[queue].append(seg)
                    seg_ops.append([op])
                    seg_queue.append(queue)
                    batch_segs[batch].append(seg)
                else:
                    seg_ops[seg].append(op)
                op_seg.append(seg)
        self.batch_sends = [sum(op_send[x] for x in ops) for ops in batch_ops]
        # the host waits for the whole batch when it receives anything (NCCL hands back one work for
        # a coalesced batch, so its sends cannot be waited apart); a batch of sends alone runs on
        self.batch_pending = [
            len(ops) if len(ops) > n else 0 for ops, n in zip(batch_ops, self.batch_sends, strict=True)
        ]
        self.batch_posted = [False] * len(batch_ops)
        self.seg_left = [len(ops) for ops in seg_ops]
        self.seg_posted = [False] * len(seg_ops)
        self.queue_head = [0] * len(queue_segs)
        self.coll_ready = [0] * len(self.coll_group)
        self.coll_done = [False] * len(self.coll_group)
        # a collective needs every member: a device that issues it fewer times leaves the others waiting
        groups: dict[int, list[int]] = {}
        for d, counts in enumerate(issued):
            for g in counts:
                groups.setdefault(g, []).append(d)
        for g, devs in groups.items():
            first = devs[0]
            for d in devs[1:]:
                if issued[d][g] != issued[first][g]:
                    raise HetplanError(
                        f"{self.names[first]} issues AR{g} {issued[first][g]} time(s) but {self.names[d]} "
                        f"{issued[d][g]}: every member of a gradient group must issue its all-reduce alike"
                    )

    def _pair(self) -> list[int]:
        """Each operation's partner on the peer, by key; refuses a send or receive without its match.

        Pairing by key (rather than by NCCL's issue order) lets a wrongly ordered pair that would
        hang be reported as the deadlock it causes; :meth:`check_pair_order` then refuses the orders
        that would not hang but would hand a receive the wrong tensor.
        """
        sends, recvs = self.sends_by_key, self.recvs_by_key
        for key in [*sends, *(k for k in recvs if k not in sends)]:
            n_send, n_recv = len(sends.get(key, ())), len(recvs.get(key, ()))
            if n_send != n_recv:
                src, dst = key[0], key[1]
                raise HetplanError(f"{src} -> {dst}: {n_send} send(s) but {n_recv} receive(s) of {_describe(key)}")
        partner = [0] * len(self.op_dev)
        for key, ops in sends.items():  # the k-th send of a key meets the k-th receive of that key
            for s, r in zip(ops, recvs[key], strict=True):
                partner[s], partner[r] = r, s
        return partner

    def check_pair_order(self) -> None:
        """NCCL has no tags: per ordered pair, the k-th send meets the k-th receive, so they must agree."""
        by_pair_sends: dict[tuple[str, str], list[int]] = {}
        by_pair_recvs: dict[tuple[str, str], list[int]] = {}
        for key, ops in self.sends_by_key.items():
            by_pair_sends.setdefault(key[:2], []).extend(ops)
        for key, ops in self.recvs_by_key.items():
            by_pair_recvs.setdefault(key[:2], []).extend(ops)
        op_dev, op_pos, programs = self.op_dev, self.op_pos, self.programs
        for pair, s_ops in by_pair_sends.items():
            r_ops = by_pair_recvs[pair]
            s_ops.sort()  # operation ids grow with the position on a device: issue order
            r_ops.sort()
            for i, (s, r) in enumerate(zip(s_ops, r_ops, strict=True)):
                sa = programs[op_dev[s]][op_pos[s]]
                ra = programs[op_dev[r]][op_pos[r]]
                if (sa.kind in _GRADS, sa.micro, sa.lo, sa.hi) != (ra.kind in _GRADS, ra.micro, ra.lo, ra.hi):
                    raise HetplanError(
                        f"{pair[0]} -> {pair[1]}: the {_ordinal(i + 1)} send is {sa} ({_describe(_key(*pair, sa))}) "
                        f"but the {_ordinal(i + 1)} receive is {ra} ({_describe(_key(*pair, ra))}); NCCL has no "
                        "tags, so the operations of one pair of ranks must be posted in the same order on both"
                    )

    # ------------------------------------------------------------------ running
    def execute(self) -> None:
        """Advance every host until none can; raise if any device or operation is left unfinished."""
        runnable = self.runnable
        runnable.extend(reversed(range(len(self.names))))
        advance = self._advance
        while runnable:
            advance(runnable.pop())
        stuck = [d for d, acts in enumerate(self.programs) if self.pc[d] < len(acts) or self.outstanding[d]]
        if stuck:
            raise HetplanError(self._deadlock_message(stuck))

    def _advance(self, d: int) -> None:
        """Run device ``d``'s host from where it stopped until it blocks or its list ends."""
        acts = self.programs[d]
        n = len(acts)
        pc = self.pc[d]
        forward, backward, allreduce = Kind.FORWARD, Kind.BACKWARD, Kind.ALLREDUCE
        batch_of = self.batch_of[d]
        while pc < n:
            kind = acts[pc].kind
            if kind is forward or kind is backward:
                if self.tp_members[d] and not self._tp_barrier(d):
                    break
                pc += 1
            elif kind is allreduce:
                self._issue(d)
                pc += 1
            elif kind is Kind.STEP:
                if self.outstanding[d]:
                    break
                pc += 1
            else:
                batch = batch_of[pc]
                if not self.batch_posted[batch]:
                    self._post(d, batch)
                if self.batch_pending[batch]:
                    break
                pc = self.batch_end[batch]
        self.pc[d] = pc

    def _tp_barrier(self, d: int) -> bool:
        """Device ``d`` at an ``F``/``B`` of a tensor-parallel group: whether it may pass (every member
        has reached its own k-th ``F``/``B``); the last to arrive wakes the others."""
        group, k = self.tp_members[d], self.tp_reached[d]
        key = (group, k)
        if self.tp_waiting[d] != k:
            self.tp_waiting[d] = k
            self.tp_arrived[key] = self.tp_arrived.get(key, 0) + 1
            if self.tp_arrived[key] == len(group):
                self.runnable.extend(m for m in group if m != d)
        if self.tp_arrived[key] < len(group):
            return False
        self.tp_waiting[d] = -1
        self.tp_reached[d] = k + 1
        return True

    def _post(self, d: int, batch: int) -> None:
        """Post a batch: its segments join their queues; those at a queue's head start progressing."""
        self.batch_posted[batch] = True
        self.outstanding[d] += self.batch_sends[batch]
        queue_head, queue_segs, seg_queue = self.queue_head, self.queue_segs, self.seg_queue
        seg_posted = self.seg_posted
        for seg in self.batch_segs[batch]:
            seg_posted[seg] = True
            queue = seg_queue[seg]
            if queue_segs[queue][queue_head[queue]] == seg:
                self._activate(seg)

    def _activate(self, first: int) -> None:
        """Segments at the head of their queue progress: each operation meets its partner if it is ready too.

        Completing a segment moves its queue's head to the next one, which progresses at once when
        it is already posted: a worklist, not recursion, so long chains cost no stack.
        """
        nccl = self.nccl
        op_ready, op_done, op_partner, op_send = self.op_ready, self.op_done, self.op_partner, self.op_send
        seg_ops, seg_left, seg_queue, seg_posted = self.seg_ops, self.seg_left, self.seg_queue, self.seg_posted
        queue_segs, queue_head = self.queue_segs, self.queue_head
        op_seg, op_dev, op_batch = self.op_seg, self.op_dev, self.op_batch
        batch_pending, outstanding, runnable = self.batch_pending, self.outstanding, self.runnable
        work = [first]
        while work:
            seg = work.pop()
            for op in seg_ops[seg]:
                op_ready[op] = True
                finished = [op] if not nccl and op_send[op] else []  # gloo buffers sends
                partner = op_partner[op]
                if op_ready[partner]:
                    finished = [op, partner]
                for x in finished:
                    if op_done[x]:
                        continue
                    op_done[x] = True
                    dev = op_dev[x]
                    if op_send[x]:
                        outstanding[dev] -= 1
                        if not outstanding[dev]:
                            runnable.append(dev)
                    b = op_batch[x]
                    if batch_pending[b]:  # a batch the host waits for (it receives something)
                        batch_pending[b] -= 1
                        if not batch_pending[b]:
                            runnable.append(dev)
                    s = op_seg[x]
                    seg_left[s] -= 1
                    if not seg_left[s]:
                        queue = seg_queue[s]
                        head = queue_head[queue] = queue_head[queue] + 1
                        segs = queue_segs[queue]
                        if head < len(segs) and seg_posted[segs[head]]:
                            work.append(segs[head])

    def _issue(self, d: int) -> None:
        """Issue device ``d``'s next collective; under NCCL it is ready only at the head of d's order."""
        k = self.coll_issued[d]
        self.coll_issued[d] = k + 1
        self.outstanding[d] += 1
        inst = self.dev_colls[d][k]
        if not self.nccl or self.coll_head[d] == k:
            self._ready(inst)

    def _ready(self, first: int) -> None:
        """One more member is ready for a collective; when all are, it completes and frees their next."""
        nccl = self.nccl
        coll_ready, coll_members, coll_done = self.coll_ready, self.coll_members, self.coll_done
        coll_head, coll_issued, dev_colls = self.coll_head, self.coll_issued, self.dev_colls
        outstanding, runnable = self.outstanding, self.runnable
        work = [first]
        while work:
            inst = work.pop()
            coll_ready[inst] += 1
            members = coll_members[inst]
            if coll_ready[inst] < len(members):
                continue
            coll_done[inst] = True
            for m in members:
                outstanding[m] -= 1
                if not outstanding[m]:
                    runnable.append(m)
                if nccl:
                    head = coll_head[m] = coll_head[m] + 1
                    if head < coll_issued[m]:
                        work.append(dev_colls[m][head])

    # ------------------------------------------------------------------ explaining
    def _at(self, d: int) -> str:
        acts = self.programs[d]
        pc = self.pc[d]
        return str(acts[pc]) if pc < len(acts) else "the end of its list"

    def _state(self, d: int) -> str:
        """Where device ``d``'s host is: stuck at an action, or finished."""
        if self.pc[d] < len(self.programs[d]):
            return f"{self.names[d]} is stuck at {self._at(d)}"
        if self.outstanding[d]:
            return f"{self.names[d]} is waiting at the end of its list"
        return f"{self.names[d]} has finished"

    def _op(self, op: int) -> Action:
        return self.programs[self.op_dev[op]][self.op_pos[op]]

    def _blocker(self, op: int) -> int:
        """The first incomplete operation of the head segment of ``op``'s queue (``op`` waits behind it)."""
        queue = self.seg_queue[self.op_seg[op]]
        head = self.queue_segs[queue][self.queue_head[queue]]
        return next(x for x in self.seg_ops[head] if not self.op_done[x])

    def _why_op(self, op: int) -> tuple[str, int]:
        """Why an incomplete operation cannot complete (no commas: devices are separated by them)."""
        if not self.op_ready[op]:
            ahead = self._blocker(op)
            text, target = self._why_partner(ahead)
            return f"queued behind its earlier {self._op(ahead)} which is {text}", target
        return self._why_partner(op)

    def _why_partner(self, op: int) -> tuple[str, int]:
        """What an operation at the head of its queue waits for: its partner, and the partner's device."""
        partner = self.op_partner[op]
        peer = self.op_dev[partner]
        name = self.names[peer]
        if not self.batch_posted[self.op_batch[partner]]:
            return f"waiting for {name} to post {self._op(partner)}; {self._state(peer)}", peer
        ahead = self._blocker(partner)
        return f"waiting for {name}'s {self._op(partner)} queued there behind {self._op(ahead)}", peer

    def _why_collective(self, d: int, inst: int) -> tuple[str, int]:
        """What an incomplete all-reduce of device ``d`` waits for, and the device that holds it up."""
        group = self.coll_group[inst]
        k = self.dev_colls[d].index(inst)
        if self.nccl and self.coll_head[d] < k:
            earlier = self.dev_colls[d][self.coll_head[d]]
            text, target = self._why_collective(d, earlier)
            return f"queued behind its earlier AR{self.coll_group[earlier]} which is {text}", target
        for m in self.coll_members[inst]:
            position = self.dev_colls[m].index(inst)
            if self.coll_issued[m] <= position:
                return f"waiting for {self.names[m]} to issue AR{group}; {self._state(m)}", m
            if self.nccl and self.coll_head[m] < position:
                earlier = self.coll_group[self.dev_colls[m][self.coll_head[m]]]
                return f"waiting for {self.names[m]}'s AR{group} issued there behind AR{earlier}", m
        return f"waiting for AR{group}", d  # not reached: a collective ready on every member completes

    def _why_device(self, d: int) -> tuple[str, int]:
        """Why device ``d``'s host cannot go on: its first unfinished wait, and the device it waits on."""
        acts = self.programs[d]
        pc = self.pc[d]
        name = self.names[d]
        if pc < len(acts) and acts[pc].kind in (Kind.FORWARD, Kind.BACKWARD) and self.tp_members[d]:
            k = self.tp_reached[d]
            behind = [m for m in self.tp_members[d] if self.tp_reached[m] <= k and self.tp_waiting[m] != k]
            target = behind[0] if behind else d
            names = ", ".join(self.names[m] for m in behind)
            return f"{name} at {acts[pc]} (its tensor-parallel group waits for {names} to reach it)", target
        if pc < len(acts) and acts[pc].kind in _TRANSFERS:
            batch = self.batch_of[d][pc]
            left = [x for x in self.batch_ops[batch] if not self.op_done[x]]
            op = next((x for x in left if not self.op_send[x]), left[0])  # a receive first, else a send
            text, target = self._why_op(op)
            return f"{name} at {self._op(op)} ({text})", target
        # at OPT or the end: the earliest outstanding send or collective, by position in the list
        waits: list[tuple[int, bool, int]] = []
        for batch in set(self.batch_of[d].values()):
            if self.batch_posted[batch]:
                waits.extend(
                    (self.op_pos[x], False, x) for x in self.batch_ops[batch] if self.op_send[x] and not self.op_done[x]
                )
        for k in range(self.coll_issued[d]):
            inst = self.dev_colls[d][k]
            if not self.coll_done[inst]:
                waits.append((self.dev_coll_pos[d][k], True, inst))
        _, collective, item = min(waits)
        if collective:
            text, target = self._why_collective(d, item)
            return f"{name} at {self._at(d)} (its AR{self.coll_group[item]} is {text})", target
        text, target = self._why_op(item)
        return f"{name} at {self._at(d)} (its {self._op(item)} is {text})", target

    def _deadlock_message(self, stuck: list[int]) -> str:
        """One line: the devices of a wait-for cycle first (found from the first stuck device), then the rest."""
        why = {d: self._why_device(d) for d in stuck}
        order: list[int] = []
        seen: set[int] = set()
        d = stuck[0]
        while d in why and d not in seen:
            seen.add(d)
            order.append(d)
            d = why[d][1]
        if d in seen:  # a cycle: start the message at its first device
            order = order[order.index(d) :] + order[: order.index(d)]
        order += [d for d in stuck if d not in seen]
        shown = ", ".join(why[d][0] for d in order[:_SHOWN])
        more = f", and {len(order) - _SHOWN} more device(s)" if len(order) > _SHOWN else ""
        return f"the schedule would deadlock under {self.label} semantics: {shown}{more}"
