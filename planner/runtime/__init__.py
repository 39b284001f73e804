"""The bundled runtime: trains a plan for real on torch.distributed (gloo on CPU, NCCL on GPU).

Each rank reads the rank config, builds only its own blocks, compiles the plan into the same action
lists the simulator timed, checks them, and executes them step by step. It imports no solver.

    python -m hetplan.runtime.worker launch/rank-config.yaml --node node0      # under torchrun
    hetplan launch plan.yaml --steps 20                                        # every rank, here
"""
