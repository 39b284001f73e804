"""The bundled runtime: trains a plan for real on torch.distributed (gloo on CPU, NCCL on GPU).

Each rank reads the rank config, builds only its own blocks, compiles the plan into the same action
lists the simulator timed, checks them, and executes them step by step. It imports no solver.

    python -m hetplan.runtime.worker launch/rank-config.yaml --node node0      # under torchrun
    hetplan launch plan.yaml --steps 20                                        # every rank, here

By concern: the rank's step (``executor``, ``precision``, ``optim``, ``checkpoint``, ``validate``, the
data modules) at the top beside the two entry points (``worker``, ``launcher``); :mod:`.sync` (the
sync modes), :mod:`.parallel` (tensor parallelism, ZeRO-1, recomputation, tied weights),
:mod:`.processes` (rank start, signals, watching, co-runs), :mod:`.device` (CPU/GPU, transports,
emulated links), :mod:`.weights` (loading and consolidating a model's own weights).
"""
