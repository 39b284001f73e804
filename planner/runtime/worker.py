"""One rank: ``python -m planner.runtime.worker RANK_CONFIG (--node NAME | --device NODE/INDEX) --steps N``.

Launched by torchrun (one process per device of a node: the device is the node's LOCAL_RANK-th) or by
``hetplan launch`` (which names the device). Ranks exchange their device addresses after joining, so
torchrun's rank order does not matter. On any failure the rank prints one line naming itself, the
step and the action it was waiting on, and exits with code 3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

__all__ = ["main"]

# the torch profiler (the CPU peak-memory measurement) prints its start and stop on stderr unless
# told otherwise before torch loads; a rank's stderr is for its one-line errors
os.environ.setdefault("KINETO_LOG_LEVEL", "5")


def run(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from planner.contracts.runlog import RUNLOG_SCHEMA
    from planner.errors import HetplanError
    from planner.runtime.checkpoint import load_blocks, save_blocks
    from planner.runtime.comm import RankFailureError
    from planner.runtime.config import load_rank_config
    from planner.runtime.executor import RankExecutor
    from planner.runtime.memtrack import measure_peak
    from planner.runtime.validate import validate_programs
    from planner.schedule.compile import compile_plan

    config = load_rank_config(args.config)
    if args.device:
        address = args.device
    else:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        try:
            address = config.nodes[args.node][local]
        except (KeyError, IndexError):
            raise HetplanError(
                f"node {args.node!r} has no device for LOCAL_RANK {local} in the rank config",
                file=config.file,
                field="nodes",
            ) from None
    if address not in config.devices:
        raise HetplanError(f"device {address} is not in the plan", file=config.file, field="devices")
    backend = args.backend or config.backend
    if backend == "nccl" and not torch.cuda.is_available():
        raise HetplanError("backend nccl needs CUDA, and this machine has none; use --backend gloo", field="--backend")
    # the GPU is the device's own index (NODE/INDEX), not LOCAL_RANK: a plan may leave a node's other
    # GPUs idle, and torchrun starts one process per *used* device
    device = torch.device("cuda", int(address.split("/")[1])) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = config.dtype == "tf32"
        torch.backends.cudnn.allow_tf32 = config.dtype == "tf32"
    torch.set_num_threads(args.threads)
    dist.init_process_group(backend, timeout=timedelta(seconds=config.timeout_s))
    rank = dist.get_rank()
    addresses: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(addresses, address)
    missing = sorted(set(config.devices) - set(addresses))
    if missing or len(set(addresses)) != len(addresses):
        raise HetplanError(
            f"ranks joined as {addresses}; the plan needs each of {sorted(config.devices)} once"
            + (f" (missing {missing})" if missing else ""),
            file=config.file,
            field="devices",
        )
    rank_of = {a: r for r, a in enumerate(addresses)}
    compiled = compile_plan(config.plan, config.n_blocks)
    validate_programs({a: p.actions for a, p in compiled.programs.items()})
    mine = compiled.programs[address].render()
    if mine != config.devices[address].actions:
        raise HetplanError(
            f"the action list of {address} differs from the one emitted (another hetplan version?)",
            file=config.file,
            field=f"devices[{address}].actions",
        )
    executor = RankExecutor(
        config, compiled, address, rank_of, device, emulate=args.emulate, blocking_allreduce=args.blocking_allreduce
    )
    start_step = 0
    if args.resume:
        start_step = load_blocks(args.resume, executor.blocks, executor.precision, names=executor.names)
    log = open(args.log, "a", encoding="utf-8") if args.log else None  # noqa: SIM115 - closed below
    entry = config.devices[address]
    try:
        # peak tensor memory: on CUDA every step (the allocator keeps the peak); on CPU one step under
        # the profiler's memory tracking, the second of the run once the optimizer state exists
        measured_step = start_step + (1 if args.steps > 1 else 0)
        peak: float | None = None
        for step in range(start_step, start_step + args.steps):
            try:
                if device.type == "cuda" or step == measured_step:
                    peak, stats = measure_peak(
                        lambda step=step: executor.run_step(step), held=executor.held_tensors(), device=device
                    )
                else:
                    stats = executor.run_step(step)
            except RankFailureError as exc:
                raise RankFailureError(str(exc)) from None
            record = {
                "schema": RUNLOG_SCHEMA,
                "step": step,
                "rank": rank,
                "pipeline": entry.pipeline,
                "stage": entry.stage,
                "device": address,
                "iteration_s": stats.iteration_s,
                "compute_s": stats.compute_s,
                "wait_s": stats.wait_s,
                "comm_s": stats.comm_s,
                "loss": stats.loss_sum,
                "peak_memory_bytes": peak,
                "memory_measured": "cuda allocator" if device.type == "cuda" else "cpu allocator profile",
                "dtype": config.dtype,
            }
            if config.dtype == "fp16":
                record["loss_scale"] = stats.extra["loss_scale"]
                record["skipped_step"] = stats.skipped
            if executor.slowdown > 1.0:
                record["emulated_slowdown"] = executor.slowdown
            if log:
                log.write(json.dumps(record) + "\n")
                log.flush()
        if args.save:
            dist.barrier()
            owned = {i: b for i, b in executor.blocks.items() if min(rank_of[a] for a in _holders(compiled, i)) == rank}
            save_blocks(args.save, owned, executor.precision, step=start_step + args.steps, names=executor.names)
            dist.barrier()
    finally:
        if log:
            log.close()
    dist.destroy_process_group()


def _holders(compiled, block: int) -> tuple[str, ...]:
    for g in compiled.groups:
        if block in g.blocks:
            return g.devices
    return ()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m planner.runtime.worker", description=__doc__)
    parser.add_argument("config")
    parser.add_argument("--node", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--log", default=None)
    parser.add_argument("--emulate", action="store_true")
    parser.add_argument("--save", default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--backend", default=None, choices=("gloo", "nccl"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--blocking-allreduce",
        action="store_true",
        help="issue each all-reduce at its AR action and wait there (for benchmarks: the old behaviour)",
    )
    args = parser.parse_args(argv)
    if not args.node and not args.device:
        parser.error("give --node NAME (under torchrun) or --device NODE/INDEX")
    if args.log and not args.device:
        args.log = str(Path(args.log))
    try:
        run(args)
    except Exception as exc:
        from planner.errors import HetplanError
        from planner.runtime.comm import RankFailureError

        known = isinstance(exc, (HetplanError, RankFailureError))
        text = str(exc) if known else f"{type(exc).__name__}: {exc}"
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        print(f"error: {first}", file=sys.stderr, flush=True)
        sys.stderr.flush()
        os._exit(3)  # no lingering threads or process-group teardown that could hang
    time.sleep(0)


if __name__ == "__main__":
    main()
