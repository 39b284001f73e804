"""How pipelines combine their updates, one module per sync mode and its parts (docs/sync-modes.md).

* :mod:`.group_sync`: one gradient group's combine by mode (all-reduce, top-k, Adasum);
  :mod:`.topk` (sparsified gradients with error feedback), :mod:`.adasum` and :mod:`.adasum_step`
  (Adasum on gradients, or on an adaptive optimizer's parameter changes).
* :mod:`.central`: the extra process the decentralised modes run; :mod:`.param_server` (HetPipe's
  WSP server) and :mod:`.group_scheduler` (SDPipe's progress grouping) live in it;
  :mod:`.wave_sync` is a device's side of both.
"""
