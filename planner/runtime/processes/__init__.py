"""The runtime's processes around the ranks: how they start, stop, are watched and share devices.

* :mod:`.forked_rank`: a rank forked from the fork server (``HETPLAN_RANK_START=forkserver``).
* :mod:`.fork_server`: that fork server started as a fork of the agent (torch already imported).
* :mod:`.agent_start`: torchrun's agent spawned fresh, or forked from the launching process's fork server.
* :mod:`.warm`: what every rank would do once (torch's first meta-device operation), done in the server.
* :mod:`.interrupt`: SIGTERM, SIGINT and SIGHUP to the launching process.
* :mod:`.watch`: a running job's steps, read from its ranks' logs as they grow.
* :mod:`.crossover`: two jobs on the same devices, a turn per device.

The two entry points stay at the top of the runtime: ``python -m hetplan.runtime.worker`` (one rank,
what launch files run) and ``hetplan.runtime.launcher`` (a plan's ranks on this machine).
"""
