"""Load any contract file by what it says it is (its ``schema:`` line, or ``.jsonl`` for run logs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetplan.contracts.catalog import CATALOG_SCHEMA, load_catalog
from hetplan.contracts.cluster import CLUSTER_SCHEMA, parse_cluster
from hetplan.contracts.measurements import MEASUREMENTS_SCHEMA, parse_measurements
from hetplan.contracts.model_profile import PROFILE_SCHEMA, parse_profile
from hetplan.contracts.plan import PLAN_SCHEMA, parse_plan
from hetplan.contracts.pool import POOL_SCHEMA, parse_pool
from hetplan.contracts.runlog import load_run_log
from hetplan.contracts.yamlio import read_mapping, schema_of
from hetplan.errors import HetplanError

__all__ = ["KINDS", "load_any"]

KINDS = {
    CATALOG_SCHEMA: "catalog",
    CLUSTER_SCHEMA: "cluster",
    PROFILE_SCHEMA: "profile",
    PLAN_SCHEMA: "plan",
    MEASUREMENTS_SCHEMA: "measurements",
    POOL_SCHEMA: "pool",
}


def load_any(path: str | Path) -> tuple[str, Any]:
    """``(kind, object)`` for a catalog, cluster, profile, plan, measurements or run log file."""
    if str(path).endswith(".jsonl"):
        return "runlog", load_run_log(path)
    data = read_mapping(path)
    schema = schema_of(data, path)
    kind = KINDS.get(schema)
    if kind is None:
        same_contract = [s for s in KINDS if s.rsplit("/", 1)[0] == schema.rsplit("/", 1)[0]]
        if same_contract and "/" in schema:
            raise HetplanError(
                f"unsupported schema version {schema!r}; this hetplan reads {same_contract[0]}",
                file=str(path),
                field="schema",
            )
        known = ", ".join(KINDS)
        raise HetplanError(f"unknown schema {schema!r}; expected one of {known}", file=str(path), field="schema")
    name = str(path)
    if kind == "catalog":
        return kind, load_catalog(path)
    if kind == "cluster":
        return kind, parse_cluster(data, file=name)
    if kind == "profile":
        return kind, parse_profile(data, file=name)
    if kind == "measurements":
        return kind, parse_measurements(data, file=name)
    if kind == "pool":
        return kind, parse_pool(data, file=name)
    return kind, parse_plan(data, file=name)
