"""The calibration's parameters and how a choice of them becomes a profile and a cluster.

Every parameter is fitted as ``theta``, the log of its value over a reference (its input value), so
a value stays positive and ``theta = 0`` is the input:

* ``compute[TYPE]`` (or ``compute[TYPE/KIND]``): a factor on every forward and backward time of the
  device type (of its blocks of that kind);
* ``bandwidth[LINK]`` and ``latency[LINK]`` of each link class: each node's own link
  (``node NAME``), the default ``network``, each ``group NAME`` and each pair override
  (``A<->B``);
* ``collective_efficiency``: the cluster's all-reduce speed relative to the alpha-beta model;
* ``overhead[TYPE]``: the type's fixed seconds per forward or backward call of a stage
  (``DeviceType.micro_batch_s``; a type stating none starts at :data:`OVERHEAD_START`);
* ``overlap[TYPE]``: the type's compute slowdown while a collective runs beside it, fitted as its
  excess over 1 (``overlap_slowdown - 1``; a type stating none starts at :data:`OVERLAP_START`).

:class:`Model` applies values the only way the output files can: it scales the profile's times
and rewrites the cluster's raw mapping, then parses it as ``load_cluster`` would, so a fitted value
predicts exactly what the written files will.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace
from typing import Any

from hetplan.contracts.catalog import Catalog, DeviceType
from hetplan.contracts.cluster import Cluster, parse_cluster, with_device_types
from hetplan.contracts.model_profile import Block, ModelProfile, Timing
from hetplan.errors import HetplanError
from hetplan.units import parse_bandwidth, parse_time

__all__ = [
    "LATENCY_START",
    "OVERHEAD_START",
    "OVERLAP_START",
    "Model",
    "Param",
    "block_kinds",
    "candidate_params",
    "timed_types",
    "with_type_figures",
]

#: A link stated with zero latency cannot be scaled in log space; a fitted one starts here instead.
LATENCY_START = 1e-6
#: Likewise a type without a per-call overhead starts at this fraction of its mean block forward
#: time at one sample (a start far below what the data can see would leave the parameter's column of
#: the Jacobian at noise level, and the fit would never move it), or at OVERHEAD_START seconds ...
OVERHEAD_FRACTION = 0.1
OVERHEAD_START = 1e-5
#: ... and one without an overlap slowdown at this excess over 1.
OVERLAP_START = 0.1
#: Prior width (log space) of a per-type figure the input does not state: its start is a scale, not
#: a belief, so the data may move it a factor e^4 (about 55) either way at little cost.
UNSTATED_WIDTH = 4.0

#: Order in which, of two equally unresolved parameters, one goes back to its prior first: a
#: latency is the least likely to matter, a compute factor the most.
_PRIORITY = {"latency": 0, "overlap": 1, "overhead": 2, "bandwidth": 3, "collective": 4, "compute": 5}


@dataclass(frozen=True)
class Param:
    """One fitted quantity: ``value = ref * exp(theta)``; ``prior`` is the input file's value."""

    name: str
    kind: str  # "compute", "bandwidth", "latency", "collective", "overhead", "overlap"
    target: tuple[Any, ...]  # compute: (type, kind | None); link: ("node", i) / ("network",) / ...; type: (type,)
    prior: float
    ref: float
    #: How far (in log space) the input value is believed: 1 (a factor e) for a stated figure; a
    #: figure the input lacks (zero, started at ``ref``) is hardly believed at all (:data:`UNSTATED_WIDTH`).
    width: float = 1.0

    def value(self, theta: float) -> float:
        """The parameter's value at ``theta``: ``ref * exp(theta)``; for ``overlap`` that is the
        excess over 1, so a slowdown never falls below 1 (no overlap speeds compute up)."""
        if self.kind == "overlap":
            return 1.0 + self.ref * math.exp(theta)
        return self.ref * math.exp(theta)

    @property
    def priority(self) -> int:
        return _PRIORITY[self.kind]


def timed_types(profile: ModelProfile, cluster: Cluster) -> dict[str, tuple[str, float]]:
    """The cluster's device types the profile has times for: name -> (profile key, factor), as
    :meth:`ModelProfile.time_scale` resolves them (a type without times cannot be fitted, or used)."""
    out: dict[str, tuple[str, float]] = {}
    for name, device_type in cluster.device_types.items():
        try:
            out[name] = profile.time_scale(device_type)
        except HetplanError:
            continue
    return out


def block_kinds(profile: ModelProfile) -> list[str]:
    """The profile's block kinds, in first-seen order."""
    return list(dict.fromkeys(b.kind for b in profile.blocks))


def _link_params(label: str, where: tuple[Any, ...], raw: dict[str, Any]) -> list[Param]:
    bandwidth = parse_bandwidth(raw["bandwidth"])
    latency = parse_time(raw.get("latency", 0.0))
    return [
        Param(f"bandwidth[{label}]", "bandwidth", where, bandwidth, bandwidth),
        Param(f"latency[{label}]", "latency", where, latency, latency if latency > 0 else LATENCY_START),
    ]


def candidate_params(
    raw_cluster: dict[str, Any], cluster: Cluster, profile: ModelProfile, *, per_kind: set[str] = frozenset()
) -> list[Param]:
    """Every parameter the cluster and profile offer, in a fixed order (compute, links, collective).

    ``per_kind``: device types that get one factor per block kind instead of one in all."""
    params: list[Param] = []
    kinds = block_kinds(profile)
    for name in timed_types(profile, cluster):
        if name in per_kind:
            params += [Param(f"compute[{name}/{k}]", "compute", (name, k), 1.0, 1.0) for k in kinds]
        else:
            params.append(Param(f"compute[{name}]", "compute", (name, None), 1.0, 1.0))
    for i, node in enumerate(raw_cluster["nodes"]):
        if isinstance(node.get("link"), dict) and len(cluster.node(node["name"]).devices) > 1:
            params += _link_params(f"node {node['name']}", ("node", i), node["link"])
    network = raw_cluster["network"]
    params += _link_params("network", ("network",), network)
    for i, group in enumerate(network.get("groups") or []):
        params += _link_params(f"group {group['name']}", ("group", i), group)
    for i, pair in enumerate(network.get("overrides") or []):
        a, b = pair["between"]
        params += _link_params(f"{a}<->{b}", ("override", i), pair)
    efficiency = cluster.collective_efficiency
    params.append(Param("collective_efficiency", "collective", ("collective",), efficiency, efficiency))
    for name in timed_types(profile, cluster):
        device_type = cluster.device_types[name]
        micro = device_type.micro_batch_s
        start = micro if micro > 0 else _overhead_start(profile, device_type)
        width = 1.0 if micro > 0 else UNSTATED_WIDTH
        params.append(Param(f"overhead[{name}]", "overhead", (name,), micro, start, width))
        excess = device_type.overlap_slowdown - 1.0
        ref, width = (excess, 1.0) if excess > 0 else (OVERLAP_START, UNSTATED_WIDTH)
        params.append(Param(f"overlap[{name}]", "overlap", (name,), device_type.overlap_slowdown, ref, width))
    return params


def _overhead_start(profile: ModelProfile, device_type: DeviceType) -> float:
    """Where a per-call overhead the type does not state starts: :data:`OVERHEAD_FRACTION` of its
    mean block forward at one sample (:data:`OVERHEAD_START` where the profile's times are zero)."""
    times = [profile.block_time(i, device_type, 1)[0] for i in range(len(profile.blocks))]
    mean = sum(times) / len(times) if times else 0.0
    return OVERHEAD_FRACTION * mean if mean > 0 else OVERHEAD_START


#: The :class:`DeviceType` field each per-type parameter kind sets.
TYPE_FIELDS = {"overhead": "micro_batch_s", "overlap": "overlap_slowdown"}


def with_type_figures(cluster: Cluster, figures: dict[str, dict[str, float]]) -> Cluster:
    """``cluster`` with the device types of ``figures`` (name -> {field: value}) replaced, on every
    device and in its catalog: the per-type figures a cluster file cannot state (they belong to the
    catalog entry), applied after parsing."""
    if not figures:
        return cluster
    replaced = {name: replace(t, **figures[name]) for name, t in cluster.device_types.items() if name in figures}
    nodes = tuple(with_device_types(cluster.nodes, replaced))
    return Cluster(
        name=cluster.name,
        nodes=nodes,
        network=cluster.network,
        groups=cluster.groups,
        overrides=cluster.overrides,
        catalog=cluster.catalog.with_types(replaced),
        file=cluster.file,
        description=cluster.description,
        collective_efficiency=cluster.collective_efficiency,
        calibrated=cluster.calibrated,
    )


def _scale_times(times: dict[int, Timing], factor: float, source: str | None) -> dict[int, Timing]:
    return {
        m: Timing(
            fwd=t.fwd * factor,
            bwd=t.bwd * factor,
            source=source or t.source,
            spread=t.spread,
            recompute=t.recompute * factor if t.recompute is not None else None,
        )
        for m, t in times.items()
    }


def _scale_block(block: Block, updates: dict[str, tuple[str, float, str | None]]) -> Block:
    """``block`` with each type's times (``name -> (source key, factor, new source)``) rescaled, at
    degree 1 and at every tensor-parallel degree that has the source key's times."""
    times = dict(block.times)
    for name, (key, factor, source) in updates.items():
        times[name] = _scale_times(block.times[key], factor, source)
    degrees = {}
    for t, tp in block.tensor_parallel.items():
        tp_times = dict(tp.times)
        for name, (key, factor, source) in updates.items():
            if key in tp.times:
                tp_times[name] = _scale_times(tp.times[key], factor, source)
        degrees[t] = replace(tp, times=tp_times)
    return replace(block, times=times, tensor_parallel=degrees)


@dataclass
class Model:
    """The input profile and cluster, and how to rebuild both for given parameter values."""

    profile: ModelProfile
    raw_cluster: dict[str, Any]
    cluster: Cluster
    catalog: Catalog
    params: list[Param]
    _timed: dict[str, tuple[str, float]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._timed = timed_types(self.profile, self.cluster)

    def build_profile(self, values: dict[Param, float]) -> ModelProfile:
        """The profile with each fitted type's times scaled by its compute factor(s).

        A fitted type gets times under its own name (its base type's times x its emulation slowdown x
        the factor, for an emulated type), marked ``calibrated``. An unfitted emulated type whose base
        type's times were just rescaled is pinned to its input times, so that a factor fitted for one
        type does not leak into another that no measurement saw."""
        factors: dict[str, dict[str | None, float]] = {}
        for p, v in values.items():
            if p.kind == "compute":
                type_name, kind = p.target
                factors.setdefault(type_name, {})[kind] = v
        if not factors:
            return self.profile
        scales = self._timed
        source = {name: scales[name] for name in factors}
        pinned = {name: ks for name, ks in scales.items() if name not in factors and ks[0] in factors}
        blocks = []
        for block in self.profile.blocks:
            updates: dict[str, tuple[str, float, str | None]] = {}
            for name, by_kind in factors.items():
                key, scale = source[name]
                updates[name] = (key, scale * by_kind.get(block.kind, by_kind.get(None, 1.0)), "calibrated")
            for name, (key, scale) in pinned.items():
                updates[name] = (key, scale, None)
            blocks.append(_scale_block(block, updates))
        return replace(self.profile, blocks=blocks)

    def build_raw_cluster(self, values: dict[Param, float]) -> dict[str, Any]:
        """The cluster's raw mapping with each fitted link figure and the collective efficiency replaced."""
        raw = copy.deepcopy(self.raw_cluster)
        for p, v in values.items():
            if p.kind in ("compute", *TYPE_FIELDS):
                continue
            if p.kind == "collective":
                raw["collective_efficiency"] = v
                continue
            key = "bandwidth" if p.kind == "bandwidth" else "latency"
            where = p.target
            if where[0] == "node":
                raw["nodes"][where[1]]["link"][key] = v
            elif where[0] == "network":
                raw["network"][key] = v
            elif where[0] == "group":
                raw["network"]["groups"][where[1]][key] = v
            else:
                raw["network"]["overrides"][where[1]][key] = v
        return raw

    def build(self, values: dict[Param, float]) -> tuple[ModelProfile, Cluster]:
        """Profile and cluster for ``values`` (parameters not given keep their input values)."""
        raw = self.build_raw_cluster(values)
        cluster = parse_cluster(raw, file=self.cluster.file, catalog=self.catalog)
        return self.build_profile(values), with_type_figures(cluster, self.type_figures(values))

    def type_figures(self, values: dict[Param, float]) -> dict[str, dict[str, float]]:
        """The per-type figures of ``values`` (overhead, overlap): type name -> {field: value}."""
        figures: dict[str, dict[str, float]] = {}
        for p, v in values.items():
            if p.kind in TYPE_FIELDS:
                figures.setdefault(p.target[0], {})[TYPE_FIELDS[p.kind]] = v
        return figures
