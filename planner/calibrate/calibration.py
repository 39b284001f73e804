"""``hetplan calibrate``'s fit: the profile and cluster fitted to measured runs, and their predictions.

    result = calibrate(profile, raw_cluster, cluster, measurements)
    result.runs[0].measured, result.runs[0].before, result.runs[0].after, result.runs[0].loo
    result.params            # every parameter: prior, fitted value, identified or not and why

Steps: load and check every run (:mod:`.inputs`); choose per-kind or per-type compute factors
(:func:`choose_per_kind`); fit and identify (:mod:`.fit`); refit without each run to predict it
(leave-one-out); fit the memory reserves (:mod:`.memory`). Writing the files is :mod:`.write`'s job,
reading them :mod:`.files`'. docs/calibration.md says why each step is as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hetplan.calibrate.fit import RESOLUTION, FitResult, Problem, identify, resolution, solve
from hetplan.calibrate.inputs import Observation, load_observations
from hetplan.calibrate.memory import AllocatorPeak, ReserveFit, fit_reserves
from hetplan.calibrate.params import Model, Param, block_kinds, candidate_params, timed_types
from hetplan.calibrate.select import prune
from hetplan.contracts.catalog import Catalog, load_catalog
from hetplan.contracts.cluster import Cluster
from hetplan.contracts.measurements import Measurements
from hetplan.contracts.model_profile import ModelProfile
from hetplan.simulate import simulate

__all__ = ["Calibration", "ComputeRow", "ParamFit", "RunFit", "calibrate", "choose_per_kind", "round6"]


def round6(x: float) -> float:
    """Six significant digits: what the written files and notes carry (well inside any measurement's
    precision, and short to read)."""
    return float(f"{x:.6g}")


@dataclass(frozen=True)
class ParamFit:
    """A parameter's outcome: its input value, its value now, and whether the data set it."""

    name: str
    kind: str
    prior: float
    value: float
    identified: bool
    reason: str  # "resolution 0.99", "not used by any measured plan", "not identified (resolution 0.31)"
    resolution: float | None

    @property
    def factor(self) -> float | None:
        return self.value / self.prior if self.prior > 0 else None


@dataclass(frozen=True)
class ComputeRow:
    """One rank of a run log: its median compute per step, and the simulator's before and after."""

    device: str
    type: str
    measured: float
    before: float
    after: float


@dataclass
class RunFit:
    """A measured run: iteration time measured, predicted before and after, and left out."""

    name: str
    measured: float
    before: float
    after: float
    loo: float | None  # predicted by a fit that did not see this run (None: a single run)
    steps: int
    compute: list[ComputeRow] = field(default_factory=list)

    @property
    def residual(self) -> float:
        return self.after / self.measured - 1.0

    @property
    def loo_error(self) -> float | None:
        return None if self.loo is None else self.loo / self.measured - 1.0


@dataclass
class Calibration:
    """Everything ``hetplan calibrate`` found, and the two files it makes."""

    runs: list[RunFit]
    params: list[ParamFit]
    reserves: list[ReserveFit]
    allocator_peaks: list[AllocatorPeak]
    per_kind: list[str]  # device types given one compute factor per block kind
    kinds: list[str]
    n_rows: int  # residuals the data give (iteration times and per-rank compute times)
    n_used: int  # parameters some measured run's simulation reads
    warnings: list[str]
    fitted_profile: ModelProfile | None = None  # the profile with the fitted compute factors
    fitted_raw_cluster: dict = field(default_factory=dict)  # the cluster mapping with the fitted links
    #: per device type, the fitted catalog figures (``micro_batch_s``, ``overlap_slowdown``): a
    #: catalog entry's fields, which the cluster mapping above does not carry
    fitted_type_figures: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def identified(self) -> list[ParamFit]:
        return [p for p in self.params if p.identified]


def choose_per_kind(
    raw: dict, profile: ModelProfile, cluster: Cluster, observations: list[Observation], catalog: Catalog
) -> tuple[list[Param], list[str]]:
    """The parameters, and the device types fitted per block kind.

    A type gets one factor per block kind only where its run-log compute times tell the kinds apart:
    every kind's factor, fitted from those rows alone, must be resolved (:func:`resolution` at least
    ``RESOLUTION``, at the prior). Otherwise one factor scales all of its blocks: the data would
    only split it by noise."""
    kinds = block_kinds(profile)
    timed = timed_types(profile, cluster)
    with_compute = {cluster.device(d).type.name for obs in observations for d in obs.compute_s}
    trial = [t for t in timed if t in with_compute] if len(kinds) > 1 else []
    keep: list[str] = []
    if trial:
        params = candidate_params(raw, cluster, profile, per_kind=set(trial))
        problem = Problem(Model(profile, raw, cluster, catalog, params), observations)
        runs = list(range(len(observations)))
        for name in trial:
            cols = [j for j, p in enumerate(params) if p.kind == "compute" and p.target[0] == name]
            rows = [
                i
                for i, r in enumerate(problem.rows)
                if r.device is not None and cluster.device(r.device).type.name == name
            ]
            jac = problem.jacobian(np.zeros(len(params)), runs, cols)
            share = resolution(jac[rows])
            if float(share.min()) >= RESOLUTION:
                keep.append(name)
    return candidate_params(raw, cluster, profile, per_kind=set(keep)), keep


def _param_fits(
    params: list[Param], fit: FitResult, values: dict[Param, float], dropped: dict[int, str]
) -> list[ParamFit]:
    out = []
    for j, p in enumerate(params):
        share = fit.resolution.get(j)
        if j in fit.free:
            reason = f"resolution {share:.2f}"
        elif j in dropped:
            reason = dropped[j]
        elif j in fit.unused and p.kind in ("overhead", "overlap"):
            reason = "no run log with a rank of this type's compute (and, for overlap, a collective beside it)"
        elif j in fit.unused:
            reason = "not used by any measured plan"
        else:
            reason = f"not identified (resolution {share:.2f} < {RESOLUTION})"
        out.append(
            ParamFit(
                name=p.name,
                kind=p.kind,
                prior=p.prior,
                value=values.get(p, p.prior),
                identified=j in fit.free,
                reason=reason,
                resolution=share,
            )
        )
    return out


def _leave_one_out(problem: Problem, fit: FitResult):
    """``loo_of(free)``: each run's iteration time predicted by a fit of ``free`` to the other runs
    (memoised per free set: pruning asks for the same sets again)."""
    runs = list(range(len(problem.observations)))
    memo: dict[tuple[int, ...], dict[int, float]] = {}

    def loo_of(free: list[int]) -> dict[int, float]:
        key = tuple(free)
        if key not in memo:
            out = {}
            for i in runs:
                theta, _ = solve(problem, list(free), [r for r in runs if r != i], start=fit.theta)
                out[i] = problem.simulate(theta, [i], list(free))[i].iteration_s
            memo[key] = out
        return memo[key]

    return loo_of


def calibrate(
    profile: ModelProfile,
    raw_cluster: dict,
    cluster: Cluster,
    measurements: Measurements,
) -> Calibration:
    """Fit ``profile`` and ``cluster`` to ``measurements``; nothing is written (see :func:`calibrate_files`)."""
    catalog = load_catalog()
    observations = load_observations(measurements, profile, cluster)
    params, per_kind = choose_per_kind(raw_cluster, profile, cluster, observations, catalog)
    model = Model(profile, raw_cluster, cluster, catalog, params)
    problem = Problem(model, observations)
    fit = identify(problem, list(range(len(params))))
    runs = list(range(len(observations)))
    before = problem.simulate(np.zeros(len(params)), runs, active=[])
    loo_of = _leave_one_out(problem, fit)
    raw_errors = np.array([before[i].iteration_s / obs.iteration_s - 1.0 for i, obs in enumerate(observations)])
    measured = np.array([obs.iteration_s for obs in observations])
    pruned = prune(
        fit.free,
        lambda free: np.array([loo_of(free)[i] for i in runs]) / measured - 1.0,
        raw_errors,
        lambda j: params[j].name,
        len(observations),
    )
    if pruned.kept != fit.free:
        theta, _ = solve(problem, pruned.kept, runs, start=fit.theta)
        fit = FitResult(theta, pruned.kept, fit.resolution, fit.unused, fit.rounds)
    values = {params[j]: round6(params[j].value(float(fit.theta[j]))) for j in fit.free}

    fitted_profile, fitted_cluster = model.build(values)
    after = {
        i: simulate(obs.plan, fitted_profile, fitted_cluster, compiled=obs.compiled)
        for i, obs in enumerate(observations)
    }
    loo = loo_of(fit.free) if len(observations) > 1 else {}

    run_fits = []
    for i, obs in enumerate(observations):
        compute = [
            ComputeRow(
                device=d,
                type=cluster.device(d).type.name,
                measured=m,
                before=before[i].devices[d].compute_s,
                after=after[i].devices[d].compute_s,
            )
            for d, m in obs.compute_s.items()
        ]
        run_fits.append(
            RunFit(
                name=obs.name,
                measured=obs.iteration_s,
                before=before[i].iteration_s,
                after=after[i].iteration_s,
                loo=loo.get(i),
                steps=obs.steps,
                compute=compute,
            )
        )
    reserves, peaks = fit_reserves(observations, before, cluster)
    return Calibration(
        runs=run_fits,
        params=_param_fits(params, fit, values, pruned.dropped),
        reserves=reserves,
        allocator_peaks=peaks,
        per_kind=per_kind,
        kinds=block_kinds(profile),
        n_rows=len(problem.rows),
        n_used=len(params) - len(fit.unused),
        warnings=[w for o in observations for w in o.warnings],
        fitted_profile=fitted_profile,
        fitted_raw_cluster=model.build_raw_cluster(values),
        fitted_type_figures=model.type_figures(values),
    )
