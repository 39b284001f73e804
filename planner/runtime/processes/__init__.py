"""The runtime's processes around the ranks: how they start, stop, are watched and share devices.

* :mod:`.forked_rank`: a rank forked from the fork server (``HETPLAN_RANK_START=forkserver``).
* :mod:`.interrupt`: SIGTERM, SIGINT and SIGHUP to the launching process.
* :mod:`.watch`: a running job's steps, read from its ranks' logs as they grow.
* :mod:`.crossover`: two jobs on the same devices, a turn per device.

The two entry points stay at the top of the runtime: ``python -m hetplan.runtime.worker`` (one rank,
what launch files run) and ``hetplan.runtime.launcher`` (a plan's ranks on this machine).
"""
