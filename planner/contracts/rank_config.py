"""The rank config's identity: what ``hetplan emit`` writes and every rank reads (one constant).

The writer is :func:`hetplan.emit.rank_config.build_rank_config`, the reader
:func:`hetplan.runtime.config.load_rank_config`; both take the schema from here, so the two sides
cannot drift apart. The format: docs/runtime.md ("What emit writes").
"""

from __future__ import annotations

__all__ = ["RANK_CONFIG_SCHEMA"]

RANK_CONFIG_SCHEMA = "hetplan/rank-config/v1"
