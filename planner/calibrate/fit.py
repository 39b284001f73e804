"""The fit: regularised least squares over the simulator's own predictions, and what the data can tell.

Residuals (all relative, so a 2 ms error on a 20 ms step weighs as a 200 ms one on 2 s):

* per run: simulated / measured iteration time - 1;
* per rank of a run log: simulated / measured compute time (forward + backward per step) - 1. These
  separate compute from communication: a run's ranks give one compute figure per device type
  whatever the links did.

Prior: each ``theta`` (the log of a value over its input value) is pulled towards 0 by a row
``LAMBDA * theta``, with ``LAMBDA = NOISE / PRIOR_WIDTH``: the maximum a posteriori estimate when
measurements carry ``NOISE`` (2%) relative noise and the input figures are believed within a factor
``e`` (``PRIOR_WIDTH`` = 1 in log space). That keeps a handful of runs well-posed, whatever the
number of parameters, and costs the fit almost nothing where the data are informative.

What the data can tell (:func:`resolution`): the diagonal of ``(J'J + LAMBDA^2 I)^-1 J'J`` at the
solution, ``J`` the residuals' Jacobian in ``theta``: for each parameter the share of its estimate
that comes from the data rather than from the prior (1: all data, 0: all prior). A parameter no
measured plan touches has a zero column (share 0); two parameters that move the residuals the same
way (a link's bandwidth and latency, seen through one message size) share what the data say, about
1/2 each. :func:`identify` puts the least resolved parameter back to its prior and refits, until
every parameter left has a share of at least ``RESOLUTION`` (0.9): those are "identified", the
others keep their input values and are reported "not identified", not fitted to noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from hetplan.calibrate.inputs import Observation
from hetplan.calibrate.params import Model, Param
from hetplan.calibrate.relevance import relevance
from hetplan.simulate import simulate
from hetplan.simulate.memory import MemoryUse
from hetplan.simulate.simulator import SimResult

__all__ = [
    "LAMBDA",
    "NOISE",
    "PRIOR_WIDTH",
    "RESOLUTION",
    "FitResult",
    "Problem",
    "identify",
    "prior_weights",
    "resolution",
]

NOISE = 0.02
PRIOR_WIDTH = 1.0
LAMBDA = NOISE / PRIOR_WIDTH
RESOLUTION = 0.9
#: Parameters the data resolve less than this go back to their prior together, in one round.
NEGLIGIBLE = 0.25
#: No parameter moves by more than this factor from its input (a bound on theta, so that a wild
#: step of the solver cannot make the simulator divide by a vanishing bandwidth).
MAX_FACTOR = 1e3
#: Relative step of the finite differences (in theta).
DIFF_STEP = 1e-6
#: Simulations kept per run (a few Jacobians' worth); the cache starts again when full.
CACHE_SIZE = 4096


@dataclass(frozen=True)
class Row:
    """One residual: a run's iteration time (``device`` None) or one rank's compute time."""

    run: int
    device: str | None
    measured: float


@dataclass
class Problem:
    """The model, the measured runs, and the residual rows they give."""

    model: Model
    observations: list[Observation]
    rows: list[Row] = field(default_factory=list)
    reads: list[set[int]] = field(default_factory=list)  # per run, the parameters its simulation reads
    _cache: dict[tuple, SimResult] = field(default_factory=dict, repr=False)
    #: Per run, its memory walk from its first simulation: the fitted parameters are times, links
    #: and overheads, which the walk never reads (``simulate``'s ``memory``).
    _memory: dict[int, dict[str, MemoryUse]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for i, obs in enumerate(self.observations):
            self.rows.append(Row(i, None, obs.iteration_s))
            for device, seconds in obs.compute_s.items():
                if seconds > 0:
                    self.rows.append(Row(i, device, seconds))
        self.reads = relevance(self.model, self.observations)

    @property
    def params(self) -> list[Param]:
        return self.model.params

    @property
    def used(self) -> set[int]:
        """Parameters some measured run's simulation reads."""
        return set().union(*self.reads) if self.reads else set()

    def simulate(self, theta: np.ndarray, runs: Sequence[int], active: Sequence[int]) -> dict[int, SimResult]:
        """Each of ``runs`` simulated with the ``active`` parameters at ``theta`` (the others at
        their input values: a zero latency stays zero, where ``theta = 0`` would mean
        :data:`~hetplan.calibrate.params.LATENCY_START`). A run is simulated again only when a
        parameter it reads has moved since a simulation already made."""
        out: dict[int, SimResult] = {}
        built = None
        for i in runs:
            key = (i, *((j, float(theta[j])) for j in active if j in self.reads[i]))
            sim = self._cache.get(key)
            if sim is None:
                if built is None:
                    built = self.model.build({self.params[j]: self.params[j].value(float(theta[j])) for j in active})
                obs = self.observations[i]
                sim = simulate(obs.plan, built[0], built[1], compiled=obs.compiled, memory=self._memory.get(i))
                if i not in self._memory:
                    self._memory[i] = {a: d.memory for a, d in sim.devices.items()}
                if len(self._cache) >= CACHE_SIZE:
                    self._cache.clear()
                self._cache[key] = sim
            out[i] = sim
        return out

    def predictions(self, theta: np.ndarray, runs: Sequence[int], active: Sequence[int]) -> np.ndarray:
        """Simulated figure of every row of ``runs``, in row order."""
        sims = self.simulate(theta, runs, active)
        keep = set(runs)
        return np.array(
            [
                sims[r.run].iteration_s if r.device is None else sims[r.run].devices[r.device].compute_s
                for r in self.rows
                if r.run in keep
            ]
        )

    def residuals(self, theta: np.ndarray, runs: Sequence[int], active: Sequence[int]) -> np.ndarray:
        keep = set(runs)
        measured = np.array([r.measured for r in self.rows if r.run in keep])
        return self.predictions(theta, runs, active) / measured - 1.0

    def jacobian(self, theta: np.ndarray, runs: Sequence[int], columns: Sequence[int]) -> np.ndarray:
        """Forward differences of the residuals in the ``columns`` parameters, every parameter
        active (rows of ``runs`` x columns)."""
        active = range(len(theta))
        base = self.residuals(theta, runs, active)
        jac = np.zeros((len(base), len(columns)))
        for k, j in enumerate(columns):
            step = DIFF_STEP * max(1.0, abs(theta[j]))
            moved = theta.copy()
            moved[j] += step
            jac[:, k] = (self.residuals(moved, runs, active) - base) / step
        return jac


def resolution(jac: np.ndarray, lambdas: np.ndarray | None = None) -> np.ndarray:
    """Per parameter, the share of its estimate set by the data: diag((J'J + diag(lambdas^2))^-1 J'J)
    (``lambdas``: each column's prior weight, :func:`prior_weights`; default LAMBDA for all)."""
    if jac.shape[1] == 0:
        return np.zeros(0)
    info = jac.T @ jac
    weights = np.full(info.shape[0], LAMBDA) if lambdas is None else np.asarray(lambdas)
    return np.diag(np.linalg.solve(info + np.diag(weights**2), info)).copy()


def prior_weights(params: Sequence[Param], columns: Sequence[int]) -> np.ndarray:
    """The prior row's weight of each of ``columns``: NOISE / the parameter's prior width (LAMBDA for
    a stated figure; less for one the input lacks, whose start is only a scale)."""
    return np.array([NOISE / (PRIOR_WIDTH * params[j].width) for j in columns])


@dataclass
class FitResult:
    """The fitted ``theta`` (all parameters; 0 where not free), which were free, and why the others were not."""

    theta: np.ndarray
    free: list[int]
    resolution: dict[int, float]  # parameter -> its share at the last fit it was part of
    unused: set[int]  # parameters no measured run's simulation reads
    rounds: int = 0


def solve(
    problem: Problem, free: list[int], runs: Sequence[int], start: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Regularised least squares over the ``free`` parameters of the rows of ``runs``.

    Starts from ``start`` (full theta; default the prior). The regularised objective has one
    minimum where the data resolve the free parameters, so a start near it (the previous fit) only
    saves iterations. Returns the full theta (0 outside ``free``) and the Jacobian of the data
    residuals in the free parameters."""
    theta = np.zeros(len(problem.params))
    if not free:
        return theta, np.zeros((0, 0))
    bound = math.log(MAX_FACTOR)
    n_data = sum(1 for r in problem.rows if r.run in set(runs))
    weights = prior_weights(problem.params, free)

    def fun(x: np.ndarray) -> np.ndarray:
        full = theta.copy()
        full[free] = x
        return np.concatenate([problem.residuals(full, runs, free), weights * x])

    x0 = np.zeros(len(free)) if start is None else np.clip(start[free], -bound, bound)
    result = least_squares(
        fun,
        x0,
        jac="2-point",
        bounds=(-bound, bound),
        method="trf",
        diff_step=DIFF_STEP,
        x_scale=1.0,
        xtol=1e-10,
        ftol=1e-12,
        gtol=1e-12,
        max_nfev=200,
    )
    full = theta.copy()
    full[free] = result.x
    return full, np.asarray(result.jac)[:n_data]


def identify(problem: Problem, candidates: list[int]) -> FitResult:
    """Fit, put the least resolved parameter back to its prior, refit, until all left are resolved."""
    runs = list(range(len(problem.observations)))
    used = problem.used
    unused = {j for j in candidates if j not in used}
    free = [j for j in candidates if j in used]
    shares: dict[int, float] = {}
    theta: np.ndarray | None = None
    rounds = 0
    while True:
        rounds += 1
        theta, jac = solve(problem, free, runs, start=theta)
        if not free:
            return FitResult(theta, free, shares, unused, rounds)
        share = resolution(jac, prior_weights(problem.params, free))
        for j, s in zip(free, share, strict=True):
            shares[j] = float(s)
        params = problem.params
        worst = min(range(len(free)), key=lambda k: (round(float(share[k]), 6), params[free[k]].priority, free[k]))
        if share[worst] >= RESOLUTION:
            return FitResult(theta, free, shares, unused, rounds)
        # the least resolved goes back to its prior, and with it every one the data hardly see at all
        # (those share nothing with the others, so dropping them together changes no other estimate)
        free = [j for k, j in enumerate(free) if k != worst and share[k] >= NEGLIGIBLE]
