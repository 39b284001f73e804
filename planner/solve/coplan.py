"""Plan two training jobs for the same GPUs: both plans and their co-schedule, under a fairness rule.

    result = co_plan(profile_a, profile_b, cluster, CoPlanOptions(batch_a=256, batch_b=256))
    result.chosen          # the two plans, the policy, each job's co-run iteration, combined samples/s
    result.sequential      # (a) each job's solo plan, one after the other
    result.split           # (b) each job planned on its half of the devices, side by side
    write_co_plan(result, "co/", profile_a="a.yaml", profile_b="b.yaml", cluster="cluster.yaml")

**Candidates.** Each job is planned alone (:func:`hetplan.solve.training.plan_training`) on the whole
cluster; on the whole cluster with a share of each GPU's memory (A 1/3, 1/2, 2/3; B the rest), so
that plans which use every GPU fit beside each other; and on each half of the cluster
(:func:`split_devices`). Every plan those searches simulated and that fits is a candidate: each
planning's winner, then the fastest runners-up and baselines (``per_job`` in all). A plan on a half
shares nothing but the network with a plan on the other half; plans on memory shares share every
GPU, one computing while the other communicates.

**Fairness** (default ``X = 2.0``): neither job's co-run steady-state iteration may exceed ``X`` times
its solo plan's, the solo plan being the job's best plan alone on the whole cluster (the reference a
user would otherwise run). ``X = 2`` is what two equal jobs get by taking turns one iteration at a
time; a smaller ``X`` protects the job that would otherwise pay for the other's throughput.

**Choice.** Of the pairs that fit in memory together (each job's peak with its own reserve, added on
every shared device), the highest upper bound first (the two solo steady-state rates added:
assuming co-running never makes a job faster than alone), each pair is co-simulated under each
policy tried (:func:`hetplan.simulate.together.simulate_together`); the fair one with the most
combined samples/s wins (ties: the earlier pair, then a policy the runtime runs). The policies tried
are, by default, only those ``hetplan launch A B`` runs (``RUNTIME_POLICIES``: first-come):
``crossover`` is a simulated what-if (the runtime version starved a pipeline job), tried only when
asked for, never preferred on a tie, and marked ``simulated only`` where chosen. The search stops when no remaining
pair's bound beats the best found, or after ``max_pairs`` pairs (the summary says how many it
simulated). Candidates whose solo steady state alone is already beyond ``X`` times the reference are
not tried. Deterministic: same inputs, same files, byte for byte.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hetplan.contracts.catalog import Catalog
from hetplan.contracts.cluster import Cluster, Device
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan, parse_plan
from hetplan.contracts.yamlio import sha256_of, write_yaml
from hetplan.errors import HetplanError
from hetplan.simulate.together import (
    RUNTIME_POLICIES,
    PreparedJob,
    TogetherJob,
    TogetherResult,
    prepare_job,
    simulate_together,
)
from hetplan.solve.search import PlanOptions, PlanResult
from hetplan.solve.training import plan_training

__all__ = [
    "Arrangement",
    "CoPlanOptions",
    "CoPlanResult",
    "Pools",
    "choose",
    "co_plan",
    "co_plan_candidates",
    "co_plan_files",
    "split_devices",
    "summary",
    "write_co_plan",
]

LABELS = ("A", "B")
HALVES = ("first half", "second half")
SPLIT_RULE = (
    "each node's first half of devices (rounded up) to A, the rest to B; nodes of one device alternate between A and B"
)


@dataclass(frozen=True)
class CoPlanOptions:
    """What to plan and how hard to search."""

    batch_a: int
    batch_b: int
    fairness: float = 2.0
    policies: tuple[str, ...] = RUNTIME_POLICIES  # crossover only when asked: a what-if the runtime cannot run
    iterations: int = 6  # of the slower job in each co-simulation (hetplan.simulate.together)
    schedule: str = "1f1b"
    optimizer: str = "adam"
    memory_shares: tuple[float, ...] = (1 / 3, 1 / 2, 2 / 3)  # job A's shares of each GPU (B: the rest)
    per_job: int = 8  # candidates kept per job: every planning's winner, then the fastest others
    max_pairs: int = 12  # pairs co-simulated at most (each under every policy)
    refine: bool = True  # the planner's simulator-driven refinement of each solo plan (PlanOptions.refine)


@dataclass
class Candidate:
    """One plan for one job, where it was planned, and its solo figures (prepared for co-simulation)."""

    label: str  # "whole cluster: plan", "first half: runner-up 2", "whole cluster: baseline uniform", ...
    plan: Plan
    prepared: PreparedJob

    @property
    def solo_s(self) -> float:
        return self.prepared.solo_period_s


@dataclass
class Arrangement:
    """Two jobs' plans and how they ran: co-run, one after the other, or side by side."""

    name: str
    policy: str
    plans: tuple[Candidate, ...]
    iteration_s: tuple[float, ...]  # each job's steady-state iteration in this arrangement
    samples_per_s: float  # combined

    def slowdowns(self, reference: tuple[float, ...]) -> tuple[float, ...]:
        return tuple(t / r if r > 0 else 1.0 for t, r in zip(self.iteration_s, reference, strict=True))


@dataclass
class CoPlanResult:
    options: CoPlanOptions
    reference: tuple[Candidate, ...]  # each job's best plan alone on the whole cluster
    chosen: Arrangement
    sequential: Arrangement
    split: Arrangement | None  # None when a job does not fit on its half
    candidates: tuple[int, ...]
    pairs_fitting: int
    pairs_simulated: int
    co_run: TogetherResult | None = field(default=None, repr=False)


def split_devices(cluster: Cluster) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The two halves of the cluster (:data:`SPLIT_RULE`): each job gets half of every node, so the
    two halves hold the same mix of device types and links."""
    first: list[str] = []
    second: list[str] = []
    singles = 0
    for node in cluster.nodes:
        devices = [d.address for d in node.devices]
        if len(devices) == 1:
            (first if singles % 2 == 0 else second).extend(devices)
            singles += 1
            continue
        k = (len(devices) + 1) // 2
        first.extend(devices[:k])
        second.extend(devices[k:])
    if not first or not second:
        raise HetplanError(
            f"cluster {cluster.name!r} has one device: two jobs cannot be split across it", file=cluster.file
        )
    return tuple(first), tuple(second)


def restrict(cluster: Cluster, addresses: tuple[str, ...], name: str) -> tuple[Cluster, dict[str, str]]:
    """The cluster with only ``addresses`` (same nodes, links and types), its devices renumbered from 0
    on each node (the planner's baselines rebuild a cluster from device counts), and the map from the
    renumbered addresses back to the whole cluster's: a plan made on it, mapped back, is a plan of the
    whole cluster that leaves the other devices alone."""
    keep = set(addresses)
    nodes = []
    back: dict[str, str] = {}
    for node in cluster.nodes:
        kept = [d for d in node.devices if d.address in keep]
        if not kept:
            continue
        devices = tuple(Device(node.name, i, d.type) for i, d in enumerate(kept))
        back.update({new.address: old.address for new, old in zip(devices, kept, strict=True)})
        nodes.append(replace(node, devices=devices))
    sub = Cluster(
        name=f"{cluster.name} ({name})",
        nodes=tuple(nodes),
        network=cluster.network,
        groups=cluster.groups,
        overrides=cluster.overrides,
        catalog=cluster.catalog,
        file=cluster.file,
        description=cluster.description,
        collective_efficiency=cluster.collective_efficiency,
        calibrated=cluster.calibrated,
    )
    return sub, back


def shared_memory(cluster: Cluster, share: float) -> Cluster:
    """The cluster with each device type holding ``share`` of its memory (its reserve unchanged: each
    job is a process with its own CUDA context): plans of two jobs made on complementary shares fit
    on the same GPUs together."""
    scaled = {
        name: replace(t, name=t.name, memory=t.memory * share, reserve=t.reserve_bytes)
        for name, t in cluster.device_types.items()
    }
    nodes = tuple(
        replace(n, devices=tuple(replace(d, type=scaled[d.type.name]) for d in n.devices)) for n in cluster.nodes
    )
    return Cluster(
        name=f"{cluster.name} ({share:.0%} memory)",
        nodes=nodes,
        network=cluster.network,
        groups=cluster.groups,
        overrides=cluster.overrides,
        catalog=Catalog({**cluster.catalog.types, **scaled}, file=cluster.catalog.file),
        file=cluster.file,
        description=cluster.description,
        collective_efficiency=cluster.collective_efficiency,
        calibrated=cluster.calibrated,
    )


def _mapped(plan: Plan, back: dict[str, str]) -> Plan:
    """``plan`` with its devices renamed by ``back`` (a sub-cluster's addresses to the whole cluster's)."""
    data = plan.to_dict()
    for pipeline in data["pipelines"]:
        for stage in pipeline["stages"]:
            stage["devices"] = [back[a] for a in stage["devices"]]
    data.setdefault("inputs", {"profile": {"path": "-"}, "cluster": {"path": "-"}})
    mapped = parse_plan(data, file=plan.file)
    mapped.inputs = plan.inputs
    return mapped


def _plans_of(result: PlanResult, where: str) -> list[tuple[str, Plan, float]]:
    """The winner, the simulated runners-up and the baselines that fit, labelled by where they were
    planned, with their simulated iteration."""
    out = [(f"{where}: plan", result.plan, result.sim.iteration_s)]
    ranked = sorted((c for c in result.candidates if c.sim is not None), key=lambda c: c.sim.iteration_s)
    for i, c in enumerate(ranked, start=1):
        if all(d.memory.fits for d in c.sim.devices.values()):
            out.append((f"{where}: runner-up {i} ({c.label})", c.plan, c.sim.iteration_s))
    for name, c in result.baselines.items():
        if c is not None and c.sim is not None and all(d.memory.fits for d in c.sim.devices.values()):
            out.append((f"{where}: baseline {name}", c.plan, c.sim.iteration_s))
    return out


def _key(plan: Plan) -> str:
    data = plan.to_dict()
    return repr([data.get(k) for k in ("pipelines", "zero", "sync", "schedule", "optimizer")])


def _plannings(
    j: int, cluster: Cluster, halves: tuple[tuple[str, ...], tuple[str, ...]], shares: tuple[float, ...]
) -> list[tuple[str, Cluster, dict[str, str] | None]]:
    """Where job ``j`` is planned: the whole cluster, its memory shares, and each half (its own first)."""
    out: list[tuple[str, Cluster, dict[str, str] | None]] = [("whole cluster", cluster, None)]
    for share in shares:
        out.append((f"whole cluster, {share:.0%} of each GPU's memory", shared_memory(cluster, share), None))
    own, other = (0, 1) if j == 0 else (1, 0)
    for k in (own, other):
        sub, back = restrict(cluster, halves[k], HALVES[k])
        out.append((HALVES[k], sub, back))
    return out


def _candidates(
    j: int,
    profile: ModelProfile,
    cluster: Cluster,
    halves: tuple[tuple[str, ...], tuple[str, ...]],
    opts: CoPlanOptions,
    progress: Callable[[str], None],
) -> tuple[list[Candidate], Candidate, Candidate | None]:
    """Job ``j``'s candidates (fastest solo first), its whole-cluster winner, and its winner on its half.

    Every planning's winner is kept; the other places up to ``per_job`` go to the fastest runners-up
    and baselines."""
    label = LABELS[j]
    batch = (opts.batch_a, opts.batch_b)[j]
    plan_opts = PlanOptions(global_batch=batch, schedule=opts.schedule, optimizer=opts.optimizer, refine=opts.refine)
    shares = opts.memory_shares if j == 0 else tuple(1.0 - s for s in opts.memory_shares)
    labelled: list[tuple[str, Plan, float]] = []
    winners: dict[str, Plan] = {}
    for where, sub, back in _plannings(j, cluster, halves, shares):
        progress(f"planning job {label} on the {where}")
        try:
            result = plan_training(profile, sub, plan_opts)
        except HetplanError:
            if sub is cluster:
                raise
            continue  # the job does not fit there: it is simply not a candidate there
        found = _plans_of(result, where)
        if back is not None:
            found = [(name, _mapped(plan, back), t) for name, plan, t in found]
        winners[where] = found[0][1]
        labelled.extend(found)
    seen: dict[str, tuple[str, Plan, float]] = {}
    for item in labelled:
        seen.setdefault(_key(item[1]), item)
    by_solo = sorted(seen.values(), key=lambda item: item[2])  # stable: ties keep the planning order
    must = {_key(p) for p in winners.values()}
    kept = [item for item in by_solo if _key(item[1]) in must]
    kept += [item for item in by_solo if _key(item[1]) not in must][: max(0, opts.per_job - len(kept))]
    progress(f"timing job {label}'s {len(kept)} candidates alone")
    out: list[Candidate] = []
    for name, plan, _ in kept:
        prepared = prepare_job(TogetherJob(label, plan, profile, cluster), iterations=opts.iterations)
        out.append(Candidate(name, plan, prepared))
    out.sort(key=lambda c: (c.solo_s, c.label))
    reference = next(c for c in out if _key(c.plan) == _key(winners["whole cluster"]))
    half = HALVES[j]
    own = next((c for c in out if half in winners and _key(c.plan) == _key(winners[half])), None)
    return out, reference, own


def _fits_together(a: PreparedJob, b: PreparedJob) -> bool:
    for address in set(a.devices) & set(b.devices):
        ma, mb = a.sim.devices[address].memory, b.sim.devices[address].memory
        if ma.total + mb.total > ma.capacity:
            return False
    return True


def _arrangement(name: str, pair: tuple[Candidate, Candidate], result: TogetherResult) -> Arrangement:
    return Arrangement(
        name=name,
        policy=result.policy if result.shared_devices else "",  # no GPU shared: no order to decide
        plans=pair,
        iteration_s=tuple(j.co_iteration_s for j in result.jobs),
        samples_per_s=result.combined_samples_per_s,
    )


@dataclass
class Pools:
    """Each job's candidates, its solo plan on the whole cluster, and its winner on its half."""

    candidates: tuple[list[Candidate], list[Candidate]]
    reference: tuple[Candidate, Candidate]
    own_half: tuple[Candidate | None, Candidate | None]


def co_plan_candidates(
    profile_a: ModelProfile,
    profile_b: ModelProfile,
    cluster: Cluster,
    opts: CoPlanOptions,
    *,
    progress: Callable[[str], None] | None = None,
) -> Pools:
    """Plan each job alone where it may run (module docstring) and time its candidates alone."""
    say = progress or (lambda _: None)
    halves = split_devices(cluster)
    found = [_candidates(j, profile, cluster, halves, opts, say) for j, profile in enumerate((profile_a, profile_b))]
    return Pools(
        candidates=(found[0][0], found[1][0]),
        reference=(found[0][1], found[1][1]),
        own_half=(found[0][2], found[1][2]),
    )


def co_plan(
    profile_a: ModelProfile,
    profile_b: ModelProfile,
    cluster: Cluster,
    opts: CoPlanOptions,
    *,
    progress: Callable[[str], None] | None = None,
) -> CoPlanResult:
    """Choose both plans and their co-schedule (module docstring)."""
    _check_fairness(opts)
    return choose(co_plan_candidates(profile_a, profile_b, cluster, opts, progress=progress), opts, progress=progress)


def _check_fairness(opts: CoPlanOptions) -> None:
    if opts.fairness < 1.0:
        raise HetplanError(
            f"fairness must be at least 1.0 (below it a job would have to run faster beside another than "
            f"alone), got {opts.fairness:g}",
            field="--fairness",
        )


def _runtime_first(policies: tuple[str, ...]) -> tuple[str, ...]:
    """The policies in the order they are tried: those the runtime runs first, so that a tie (the
    earlier policy wins) goes to a co-schedule ``hetplan launch A B`` can deliver."""
    return tuple(p for p in policies if p in RUNTIME_POLICIES) + tuple(p for p in policies if p not in RUNTIME_POLICIES)


def choose(pools: Pools, opts: CoPlanOptions, *, progress: Callable[[str], None] | None = None) -> CoPlanResult:
    """The fair pair of candidates and policy with the most combined samples/s, beside the jobs one
    after the other and side by side on split devices (module docstring)."""
    _check_fairness(opts)
    say = progress or (lambda _: None)
    pools_, reference, own = pools.candidates, pools.reference, pools.own_half
    ref_s = tuple(r.solo_s for r in reference)
    limit = tuple(opts.fairness * r for r in ref_s)

    pairs = []
    for a in pools_[0]:
        for b in pools_[1]:
            if a.solo_s > limit[0] or b.solo_s > limit[1] or not _fits_together(a.prepared, b.prepared):
                continue
            bound = opts.batch_a / a.solo_s + opts.batch_b / b.solo_s
            pairs.append((bound, a, b))
    pairs.sort(key=lambda item: -item[0])  # stable: candidates already in a deterministic order
    best: tuple[Arrangement, TogetherResult] | None = None
    simulated = 0
    split: Arrangement | None = None
    if own[0] is not None and own[1] is not None:
        say("co-simulating the split")
        run = simulate_together(
            [own[0].prepared.job, own[1].prepared.job],
            policy=_runtime_first(opts.policies)[0],
            iterations=opts.iterations,
            prepared=[own[0].prepared, own[1].prepared],
        )
        split = _arrangement("split devices", (own[0], own[1]), run)
        if all(t <= lim for t, lim in zip(split.iteration_s, limit, strict=True)):
            best = (split, run)
    for bound, a, b in pairs:
        if simulated >= opts.max_pairs or (best is not None and bound <= best[0].samples_per_s):
            break
        simulated += 1
        say(f"co-simulating pair {simulated}: A {a.label} + B {b.label}")
        for policy in _runtime_first(opts.policies):
            run = simulate_together(
                [a.prepared.job, b.prepared.job],
                policy=policy,
                iterations=opts.iterations,
                prepared=[a.prepared, b.prepared],
            )
            fair = all(j.co_iteration_s <= lim for j, lim in zip(run.jobs, limit, strict=True))
            if fair and (best is None or run.combined_samples_per_s > best[0].samples_per_s):
                shared = len(run.shared_devices)
                name = f"{shared} GPUs shared" if shared else "no GPU shared"
                best = (_arrangement(name, (a, b), run), run)
    if best is None:
        raise HetplanError(
            f"no pair of plans keeps both jobs within {opts.fairness:g}x of their solo plans "
            f"({simulated} pairs co-simulated); raise --fairness or run them one after the other",
            field="--fairness",
        )
    chosen, run = best
    total = sum(ref_s)
    sequential = Arrangement(
        name="one after the other",
        policy="",
        plans=tuple(reference),
        iteration_s=(total, total),
        samples_per_s=(opts.batch_a + opts.batch_b) / total if total > 0 else 0.0,
    )
    return CoPlanResult(
        options=opts,
        reference=tuple(reference),
        chosen=chosen,
        sequential=sequential,
        split=split,
        candidates=tuple(len(p) for p in pools_),
        pairs_fitting=len(pairs),
        pairs_simulated=simulated,
        co_run=run,
    )


def _round(x: float, digits: int = 9) -> float:
    return round(float(x), digits)


def _arrangement_summary(arr: Arrangement, reference: tuple[float, ...], files: tuple[str, ...] | None) -> dict:
    jobs = {}
    for i, (label, cand) in enumerate(zip(LABELS, arr.plans, strict=True)):
        entry: dict[str, Any] = {}
        if files:
            entry["plan"] = files[i]
        entry["structure"] = cand.label
        entry["devices"] = len(cand.prepared.devices)
        entry["iteration_s"] = _round(arr.iteration_s[i])
        entry["slowdown"] = _round(arr.slowdowns(reference)[i], 6)
        jobs[label] = entry
    out: dict[str, Any] = {"arrangement": arr.name}
    if arr.policy:
        out["policy"] = arr.policy
        if arr.policy not in RUNTIME_POLICIES:
            out["runs"] = "simulated only: hetplan launch A B runs first-come (docs/co-scheduling.md)"
    out["combined_samples_per_s"] = _round(arr.samples_per_s, 6)
    out["jobs"] = jobs
    return out


def summary(result: CoPlanResult, *, inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``summary.yaml`` holds and ``hetplan co-plan`` prints (plain data: views render it)."""
    ref = tuple(c.solo_s for c in result.reference)
    opts = result.options
    out: dict[str, Any] = {"kind": "hetplan co-plan summary"}
    if inputs:
        out["inputs"] = inputs
    out["fairness"] = opts.fairness
    out["fairness_rule"] = (
        "neither job's co-run steady-state iteration above fairness x its solo plan's "
        "(the job's best plan alone on the whole cluster)"
    )
    out["jobs"] = {
        label: {
            "batch": (opts.batch_a, opts.batch_b)[i],
            "solo_plan": result.reference[i].label,
            "solo_devices": len(result.reference[i].prepared.devices),
            "solo_iteration_s": _round(ref[i]),
        }
        for i, label in enumerate(LABELS)
    }
    out["chosen"] = _arrangement_summary(result.chosen, ref, ("plan-a.yaml", "plan-b.yaml"))
    out["sequential"] = _arrangement_summary(result.sequential, ref, None)
    if result.split is not None:
        out["split"] = {"rule": SPLIT_RULE, **_arrangement_summary(result.split, ref, None)}
    else:
        out["split"] = {"rule": SPLIT_RULE, "fits": False}
    out["search"] = {
        "candidates": dict(zip(LABELS, result.candidates, strict=True)),
        "pairs_fitting": result.pairs_fitting,
        "pairs_simulated": result.pairs_simulated,
        "policies": list(opts.policies),
        "iterations": opts.iterations,
        "steady_state": "as hetplan simulate --together measures it (docs/co-scheduling.md)",
    }
    return out


def _relative(path: str | Path, folder: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), folder.resolve())).as_posix()


def write_co_plan(
    result: CoPlanResult,
    output_dir: str | Path,
    *,
    profile_a: str | Path,
    profile_b: str | Path,
    cluster: str | Path,
) -> tuple[list[Path], dict[str, Any]]:
    """Write ``plan-a.yaml``, ``plan-b.yaml`` (plan files ``simulate`` and ``launch`` take, each with
    its solo prediction and a ``details.co_plan`` note) and ``summary.yaml``; return the paths and
    the summary."""
    folder = Path(output_dir)
    written = []
    names = ("plan-a.yaml", "plan-b.yaml")
    ref = tuple(c.solo_s for c in result.reference)
    for i, (cand, profile_path) in enumerate(zip(result.chosen.plans, (profile_a, profile_b), strict=True)):
        plan = cand.plan
        data = plan.to_dict()
        data["inputs"] = {
            "profile": {"path": _relative(profile_path, folder), "sha256": sha256_of(profile_path)},
            "cluster": {"path": _relative(cluster, folder), "sha256": sha256_of(cluster)},
        }
        data["dtype"] = cand.prepared.job.profile.dtype
        data["predicted"] = cand.prepared.sim.predicted()
        data.pop("baselines", None)
        data["details"] = {
            "structure": cand.label,
            "co_plan": {
                "with": names[1 - i],
                "policy": result.chosen.policy or "none (no GPU shared)",
                "iteration_s_together": _round(result.chosen.iteration_s[i]),
                "iteration_s_alone": _round(cand.solo_s),
                "solo_plan_iteration_s": _round(ref[i]),
                "fairness": result.options.fairness,
                "summary": "summary.yaml",
            },
        }
        # keys in the order a plan file writes them
        order = ["schema", "tool", "inputs", "global_batch", "dtype", "optimizer", "schedule", "sync", "sync_options"]
        ordered = {k: data[k] for k in order if k in data}
        ordered.update({k: v for k, v in data.items() if k not in ordered})
        path = folder / names[i]
        write_yaml(ordered, path)
        written.append(path)
    inputs = {
        "profile_a": {"path": _relative(profile_a, folder), "sha256": sha256_of(profile_a)},
        "profile_b": {"path": _relative(profile_b, folder), "sha256": sha256_of(profile_b)},
        "cluster": {"path": _relative(cluster, folder), "sha256": sha256_of(cluster)},
    }
    data = summary(result, inputs=inputs)
    write_yaml(data, folder / "summary.yaml")
    written.append(folder / "summary.yaml")
    return written, data


def co_plan_files(
    profile_a: str | Path,
    profile_b: str | Path,
    cluster: str | Path,
    opts: CoPlanOptions,
    output_dir: str | Path,
    *,
    progress: Callable[[str], None] | None = None,
) -> tuple[CoPlanResult, list[Path], dict[str, Any]]:
    """``hetplan co-plan``: load the inputs, plan, write the folder; the result, the files, the summary."""
    from hetplan.contracts.cluster import load_cluster
    from hetplan.contracts.model_profile import load_profile

    loaded_a, loaded_b = load_profile(profile_a), load_profile(profile_b)
    loaded_cluster = load_cluster(cluster)
    result = co_plan(loaded_a, loaded_b, loaded_cluster, opts, progress=progress)
    written, data = write_co_plan(result, output_dir, profile_a=profile_a, profile_b=profile_b, cluster=cluster)
    return result, written, data
