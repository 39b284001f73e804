"""One rank: ``python -m hetplan.runtime.worker RANK_CONFIG (--node-name NAME | --device NODE/INDEX) --steps N``.

Launched by torchrun, one process per device: the device is the ``LOCAL_RANK``-th of
``--node-name``'s devices (``--node-name a,b`` lists several nodes' devices in that order, which is
how ``hetplan launch`` runs a plan of several nodes under one standalone torchrun here), or named by
``--device``. (``--node`` and ``--log`` are the older spellings of ``--node-name`` and
``--run-log``; torchrun's parser refuses them as ambiguous prefixes of its own options.) Ranks
exchange their device addresses after joining, so torchrun's rank order does not matter. On any
failure the rank prints one line naming itself, the step and the action it was waiting on, and
exits with code 3.

SIGTERM (torchrun's agent ends the other workers when one fails) does not end a rank at once: it
has a few seconds to report what it was waiting on (a receive from a dead peer fails within
milliseconds), then it ends with a line saying where it was stopped: the transfer or collective
it is still blocked in, if any (its peer is often the rank that failed). SIGINT and SIGHUP (which
torchrun's agent passes on when it receives them) do the same, so that a rank blocked in a
collective still ends within seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

__all__ = ["TERM_GRACE_S", "main"]


#: Seconds a rank keeps going after SIGTERM, to report what it was waiting on before it ends.
TERM_GRACE_S = 3.0


@dataclass
class _Where:
    """Where this rank is, for the line it prints when it is stopped from outside."""

    rank: int | None = None
    address: str | None = None
    step: int | None = None
    doing: str = "starting"

    def __str__(self) -> str:
        who = f"rank {self.rank if self.rank is not None else '?'}" + (f" ({self.address})" if self.address else "")
        return who + (f" step {self.step}" if self.step is not None else "")


def _stop_after_grace_on_sigterm(where: _Where) -> None:
    """Turn SIGTERM, SIGINT and SIGHUP into "end in TERM_GRACE_S seconds", however the main thread
    is blocked.

    A Python handler would run only once the main thread leaves a blocking collective; instead
    the signals are blocked in every thread (this runs before torch starts any) and one thread waits
    for them with ``sigwait``. One the process ignores (``nohup``'s SIGHUP) stays ignored.
    """
    if not hasattr(signal, "pthread_sigmask"):  # not POSIX: keep the default (end at once)
        return
    stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    stops = {s for s in stops if signal.getsignal(s) is not signal.SIG_IGN}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    # the rank's stderr as it is now: the CPU memory measurement points descriptor 2 at /dev/null
    # for a moment (hetplan.runtime.memtrack), and a line written then would be lost
    stderr = os.dup(2)

    def watch() -> None:
        got = signal.Signals(signal.sigwait(stops))
        time.sleep(TERM_GRACE_S)
        try:
            os.write(stderr, f"error: {_stopped_line(where, got)}\n".encode(errors="replace"))
        finally:  # a stderr that cannot be written (a closed pipe, a full disk) must not keep the rank
            os._exit(128 + got)

    threading.Thread(target=watch, name="hetplan-sigterm", daemon=True).start()


def _stopped_line(where: _Where, got: signal.Signals) -> str:
    """What a rank says when it is stopped from outside: the collective or transfer it is blocked
    in, if any (:func:`hetplan.runtime.comm.waiting_on`, read without importing torch), else what
    it was doing."""
    comm = sys.modules.get("hetplan.runtime.comm")
    waiting = comm.waiting_on() if comm is not None else None
    return f"{waiting}: stopped by {got.name}" if waiting else f"{where}: stopped by {got.name} while {where.doing}"


def _address_of(config, args: argparse.Namespace) -> str:
    """This rank's device: ``--device``, or the LOCAL_RANK-th device of the ``--node`` list."""
    from hetplan.errors import HetplanError
    from hetplan.runtime.sync.central import CENTRAL

    if args.device:
        address = args.device
    else:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        devices: list[str] = []
        for node in args.node.split(","):
            if node not in config.nodes:
                raise HetplanError(
                    f"node {node!r} is not in the rank config (nodes: {', '.join(config.nodes)})",
                    file=config.file,
                    field="nodes",
                )
            devices += config.nodes[node]
        # wsp and sdpipe: the local rank after the devices of the central node's agent is the central
        # process (hetplan.runtime.sync.central), which holds no device
        if config.central_node in args.node.split(",") and local == len(devices):
            return CENTRAL
        if not 0 <= local < len(devices):
            raise HetplanError(
                f"node {args.node!r} has no device for LOCAL_RANK {local} in the rank config",
                file=config.file,
                field="nodes",
            )
        address = devices[local]
    if address not in config.devices:
        raise HetplanError(f"device {address} is not in the plan", file=config.file, field="devices")
    return address


def _write_status(folder: str, rank: int) -> None:
    """``rank-R.json`` (rank, pid) for a supervising launcher: how it reaches this process, which
    torchrun starts in a session of its own. Written first thing, before torch loads."""
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")), "pid": os.getpid()}
    tmp = target / f"rank-{rank}.json.tmp"
    tmp.write_text(json.dumps(record), encoding="utf-8")
    os.replace(tmp, target / f"rank-{rank}.json")


def run(args: argparse.Namespace, where: _Where) -> None:
    import torch
    import torch.distributed as dist

    from hetplan.contracts.rank_config import load_rank_config
    from hetplan.contracts.runlog import RUNLOG_SCHEMA, central_record
    from hetplan.errors import HetplanError
    from hetplan.runtime.checkpoint import load_checkpoint
    from hetplan.runtime.comm import RankFailureError
    from hetplan.runtime.device.rank_device import choose_device
    from hetplan.runtime.device.transport import check_transport, p2p_groups, start_transport, warm_p2p_group
    from hetplan.runtime.executor import RankExecutor
    from hetplan.runtime.memtrack import measure_peak
    from hetplan.runtime.sync.central import CENTRAL, process_group_backend, run_central
    from hetplan.runtime.validate import validate_p2p_groups, validate_programs
    from hetplan.schedule.compile import compile_plan

    config = load_rank_config(args.config)
    address = where.address = _address_of(config, args)
    backend = args.backend or config.backend
    if backend == "nccl" and config.crossover is not None:
        raise HetplanError(
            "co-running jobs share devices on gloo only: under NCCL a compute's device synchronisation would "
            "also wait for the job's collectives while holding the device's turn; use --backend gloo",
            file=config.file,
            field="crossover",
        )
    # the GPU: the local rank's among the visible ones (PCI order), checked against the plan's type;
    # the central process of wsp/sdpipe holds none (it moves CPU tensors only, over gloo)
    choice = choose_device(
        config,
        None if address == CENTRAL else address,
        backend=backend,
        compute=args.compute_device or config.compute_device,
        accept_mismatch=args.accept_device_mismatch or config.accept_device_mismatch,
    )
    device = choice.device
    check_transport(config, staged=choice.staged)
    start_transport(choice)  # host-staged under gloo on a GPU; waits settle on the device
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = config.dtype == "tf32"
        torch.backends.cudnn.allow_tf32 = config.dtype == "tf32"
    torch.set_num_threads(args.threads)
    where.doing = "joining the job"
    # NCCL with a central process: cpu:gloo,cuda:nccl (its exchanges move CPU tensors, over gloo)
    dist.init_process_group(
        process_group_backend(backend, central=config.central_node is not None),
        timeout=timedelta(seconds=config.timeout_s),
    )
    rank = where.rank = dist.get_rank()
    addresses: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(addresses, address)
    missing = sorted(set(config.devices) - set(addresses))
    if config.central_node is not None and CENTRAL not in addresses:
        missing.append(CENTRAL)
    if missing or len(set(addresses)) != len(addresses):
        raise HetplanError(
            f"ranks joined as {addresses}; the plan needs each of {sorted(config.devices)} once"
            + (f" (missing {missing})" if missing else ""),
            file=config.file,
            field="devices",
        )
    central_rank = addresses.index(CENTRAL) if CENTRAL in addresses else None
    rank_of = {a: r for r, a in enumerate(addresses) if a != CENTRAL}
    compiled = compile_plan(config.plan, config.n_blocks)
    # checkpoint coordination moves Python objects: on a gloo group (the default one on CPU), created
    # before the executor's groups so that every rank, the central one too, creates its groups in the
    # same order; sdpipe's leaves the central process out (it holds no state)
    ckpt_group = _checkpoint_group(args, backend, config, rank_of)
    save_steps = _save_steps(args, config) if args.save or args.resume else ()
    log_path = args.log.replace("{rank}", str(rank)) if args.log else None  # this rank's run log
    if address == CENTRAL:
        where.doing = f"serving as the {config.plan.sync} central process"
        checkpoints = None
        if config.plan.sync == "wsp" and (args.save or args.resume):
            from hetplan.runtime.sync.central import CentralCheckpoints

            checkpoints = CentralCheckpoints(
                save=args.save,
                steps=save_steps if args.save else (),
                keep_last=args.keep_last,
                resume=args.resume,
                resume_step=args.resume_step,
                group=ckpt_group,
                info={**_checkpoint_info(config, compiled, rank_of), "loss_scale": {"scale": 1.0, "good_steps": 0}},
            )
        try:
            peak = run_central(config, compiled, rank_of, checkpoints)
        except HetplanError as exc:
            raise RankFailureError(f"{where}: {exc}") from None
        if peak is not None and log_path:
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(json.dumps(central_record(rank, config.plan.sync, peak)) + "\n")
        dist.destroy_process_group()
        return
    programs = {a: p.actions for a, p in compiled.programs.items()}
    validate_programs(programs, tp_groups={a: p.tp_group for a, p in compiled.programs.items()})
    validate_p2p_groups(programs, p2p_groups(config, backend), semantics="nccl" if backend == "nccl" else "gloo")
    mine = compiled.programs[address].render()
    if mine != config.devices[address].actions:
        raise HetplanError(
            f"the action list of {address} differs from the one emitted (another hetplan version?)",
            file=config.file,
            field=f"devices[{address}].actions",
        )
    executor = RankExecutor(
        config,
        compiled,
        address,
        rank_of,
        device,
        emulate=args.emulate,
        blocking_allreduce=args.blocking_allreduce,
        central_rank=central_rank,
    )
    if backend == "nccl":  # every device rank, before any batched send/receive (p2p_groups says so)
        where.doing = "initialising the pipelines' transfer group"
        warm_p2p_group(executor.transfer_group, device, timeout_s=config.timeout_s, what=f"{where}: the group warm-up")
    start_step = 0
    if args.resume:
        where.doing = "loading the checkpoint"
        restored = load_checkpoint(
            args.resume,
            executor.blocks,
            executor.precision,
            names=_resume_names(args, config, compiled, executor),
            step=args.resume_step,
            model=config.model,
            zero=[executor.zero[gid] for gid in sorted(executor.zero)],
        )
        start_step = restored.step
        if hasattr(executor.group_sync, "load_state_dict"):  # top-k: this device's residuals
            from hetplan.runtime.checkpoint import load_residuals

            executor.group_sync.load_state_dict(load_residuals(args.resume, address, step=args.resume_step))
    end_step = start_step + args.steps
    if config.crossover is not None:  # a co-run: every job's ranks start their first step together
        from hetplan.runtime.processes.crossover import wait_for_co_runners

        where.doing = "waiting for the other co-run jobs to start"
        try:
            wait_for_co_runners(config.crossover, address, timeout_s=config.timeout_s)
        except TimeoutError as exc:
            raise RankFailureError(f"{where}: {exc}") from None
    saver = _Saver(args, config, compiled, executor, rank_of, ckpt_group, where) if args.save else None
    log = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115 - closed below
    entry = config.devices[address]
    try:
        # peak tensor memory: on CUDA every step (the allocator keeps the peak); on CPU one step under
        # the profiler's memory tracking, the second of the run once the optimizer state exists
        measured_step = start_step + (1 if args.steps > 1 else 0)
        peak: float | None = None
        for step in range(start_step, end_step):
            where.step, where.doing = step, "training"
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
            record.update(getattr(stats, "log", None) or {})  # the executor's optional keys (lr, ...)
            if record.get("pipeline_loss") is not None:  # wsp, sdpipe: this pipeline's loss only; the
                record["loss"] = None  # merged log sets the global batch's (contracts.runlog.fill_global_loss)
            if executor.slowdown > 1.0:
                record["emulated_slowdown"] = executor.slowdown
            if choice.staged:  # gloo carried this rank's device tensors through host memory
                record["transport"] = "host-staged"
            if "emulated_link_s" in stats.extra:  # seconds slept to make emulated links as slow as stated
                record["emulated_link_s"] = stats.extra["emulated_link_s"]
            nonfinite = getattr(stats, "nonfinite", None)  # the same on every rank: an all-reduced loss
            if nonfinite:
                record["loss"], record["nonfinite"] = None, nonfinite
            if log:
                log.write(json.dumps(record) + "\n")
                log.flush()
            if nonfinite and not args.skip_nonfinite:
                break  # every rank stops here together; the launcher names the step
            if saver and args.save_every and (step + 1) % args.save_every == 0:
                saver.save(step + 1)
        else:
            if saver and saver.last != end_step:
                saver.save(end_step)
        executor.close()
    finally:
        if log:
            log.close()
    dist.destroy_process_group()


def _checkpoint_group(args, backend: str, config, rank_of: dict[str, int]):
    """The process group of a checkpoint's collective save (every rank calls this, in one place):
    sdpipe's device ranks (its scheduler holds no state); otherwise every rank, on the default group
    under gloo and on a gloo group of its own under NCCL."""
    import torch.distributed as dist

    if not args.save:
        return None
    if config.plan.sync == "sdpipe":
        return dist.new_group(sorted(rank_of.values()), backend="gloo")
    return dist.new_group(backend="gloo") if backend != "gloo" else None


def _save_steps(args, config) -> tuple[int, ...]:
    """The steps this run saves after (``--save-every`` multiples and the last); for wsp, a one-line
    refusal unless the resumed step and every saved one end a wave: between waves a device holds a
    partial gradient sum that no checkpoint carries."""
    from hetplan.errors import HetplanError
    from hetplan.runtime.checkpoint import read_manifest, resolve_checkpoint

    start = read_manifest(resolve_checkpoint(args.resume, args.resume_step)).step if args.resume else 0
    end = start + args.steps
    steps = tuple(k for k in range(start + 1, end + 1) if (args.save_every and k % args.save_every == 0) or k == end)
    if config.plan.sync == "wsp":
        wave = int(config.plan.sync_option("wave"))
        if start % wave:
            raise HetplanError(
                f"checkpoint of step {start} is not at a wave's end (wave {wave}): sync wsp resumes only there",
                file=config.file,
                field="--resume",
            )
        odd = [k for k in steps if k % wave] if args.save else []
        if odd:
            raise HetplanError(
                f"sync wsp saves only at a wave's end (every {wave} steps), and step {odd[0]} is not one: "
                "choose --steps and --save-every as multiples of the wave",
                file=config.file,
                field="--save-every" if args.save_every and odd[0] != end else "--steps",
            )
    return steps


def _checkpoint_info(config, compiled, rank_of: dict[str, int]) -> dict:
    """What a checkpoint's manifest says about the run (the same on every rank, the central one too)."""
    from hetplan.models import resolve_model

    names = resolve_model(config.model).block_names()
    address_of = {r: a for a, r in rank_of.items()}
    writer = {i: min(rank_of[a] for a in _holders(compiled, i, config)) for i in range(config.n_blocks)}
    plan = json.dumps(
        {"global_batch": config.global_batch, "pipelines": [p.to_dict() for p in config.plan.pipelines]},
        sort_keys=True,
    )
    blocks = {
        names[i]: {"index": i, "rank": writer[i], "device": address_of[writer[i]]} for i in range(config.n_blocks)
    }
    sync = config.plan.sync
    if sync == "sdpipe":  # each pipeline's own weights and optimizer state, under <block>@p<pipeline>
        for q in range(len(config.plan.pipelines)):
            for i in range(config.n_blocks):
                blocks[f"{names[i]}@p{q}"] = {"index": i, "pipeline": q}
    return {
        "model": config.model,
        "dtype": config.dtype,
        "optimizer": config.optimizer,
        "plan": {
            "sha256": hashlib.sha256(plan.encode()).hexdigest(),
            "schedule": config.schedule,
            "pipelines": len(config.plan.pipelines),
            "devices": len(rank_of),
        },
        "sync": {"mode": sync, **({"wave": int(config.plan.sync_option("wave"))} if sync == "wsp" else {})},
        "blocks": blocks,
    }


def _resume_names(args, config, compiled, executor) -> list[str]:
    """The block names a resuming rank loads: under sdpipe, from a checkpoint an sdpipe run of the
    same plan saved, its own pipeline's copies (``<block>@p<pipeline>``); otherwise the plain ones
    (from an sdpipe checkpoint: the first holder's pipeline's, which every pipeline then starts from)."""
    from hetplan.runtime.checkpoint import read_manifest, resolve_checkpoint

    names = executor.names
    if config.plan.sync != "sdpipe":
        return names
    saved = read_manifest(resolve_checkpoint(args.resume, args.resume_step)).data
    if saved.get("sync", {}).get("mode") != "sdpipe":
        return names
    mine = _checkpoint_info(config, compiled, executor.rank_of)["plan"]["sha256"]
    if saved.get("plan", {}).get("sha256") != mine:
        return names
    return [f"{n}@p{executor.program.pipeline}" for n in names]


class _Saver:
    """Periodic and final checkpoints: each rank saves the blocks it is the first holder of (whole:
    a tensor-parallel writer gathers the shards of its group's members first).

    wsp: the parameter server writes the weights and optimizer state (:class:`CentralCheckpoints`),
    the devices only their blocks' buffers. sdpipe: the first holder's weights and state under the
    plain block names (what another plan or mode resumes from), and each pipeline's own under
    ``<block>@p<pipeline>``, written by the pipeline's first holder of the block."""

    def __init__(self, args, config, compiled, executor, rank_of: dict[str, int], group, where: _Where) -> None:
        import torch.distributed as dist

        self.args, self.executor, self.group, self.where = args, executor, group, where
        self.sync = config.plan.sync
        self.rank = dist.get_rank()
        self.last: int | None = None
        address_of = {r: a for a, r in rank_of.items()}
        writer = {i: min(rank_of[a] for a in _holders(compiled, i, config)) for i in range(config.n_blocks)}
        self.owned = [i for i in executor.blocks if writer[i] == self.rank]
        # a tensor-parallel block's writer gathers its shards from its group: every member of the
        # writer's group takes part in the gathers (same blocks, same order), the writer writes them
        group = executor.program.tp_group or (address_of[self.rank],)
        self.gathered = [i for i in executor.blocks if address_of[writer[i]] in group]
        # sdpipe: the blocks this rank writes its pipeline's copy of (its pipeline's first holder)
        pipeline = executor.program.pipeline
        self.pipeline_owned = []
        if self.sync == "sdpipe":
            for i in executor.blocks:
                mates = [a for a in _holders(compiled, i, config) if config.devices[a].pipeline == pipeline]
                if min(rank_of[a] for a in mates) == self.rank:
                    self.pipeline_owned.append(i)
        self.info = _checkpoint_info(config, compiled, rank_of)
        crash = args.crash_in_save
        self.crash_step = int(crash.split(":")[1]) if crash and int(crash.split(":")[0]) == self.rank else None

    def save(self, step: int) -> None:
        from hetplan.errors import HetplanError
        from hetplan.runtime.checkpoint import checkpoint_state, save_checkpoint, step_folder
        from hetplan.runtime.comm import RankFailureError

        self.where.doing = f"saving checkpoint {step_folder(step)}"
        executor = self.executor
        scaler = executor.precision.scaler
        info = {**self.info, "loss_scale": {"scale": scaler.scale, "good_steps": scaler.good_steps}}
        # ZeRO-1 groups: every holder gathers its groups' full state (collectives, in group order)
        zero: dict[int, tuple] = {}
        mixed = executor.precision.mixed
        for gid in sorted(executor.zero):
            z = executor.zero[gid]
            full = z.state_dict()
            for name, p in zip(z.names, z.params, strict=True):
                zero[id(p)] = (full["master"][name] if mixed else None, full["optim"][name])
        state = checkpoint_state(
            {i: executor.blocks[i] for i in self.gathered}, executor.precision, executor.names, zero
        )
        mine = {executor.names[i] for i in self.owned}
        state = {k: v for k, v in state.items() if k.split("/", 1)[0] in mine}
        if hasattr(executor.group_sync, "state_dict"):  # top-k: every device saves its own residuals
            from hetplan.runtime.checkpoint import residual_state

            state.update(residual_state(executor.address, executor.group_sync.state_dict()))
        if self.sync == "wsp":  # the server writes weights and optimizer state; the devices the buffers
            params = {
                f"{executor.names[i]}/param/{n}"
                for i in executor.blocks
                for n, _ in executor.blocks[i].named_parameters()
            }
            state = {k: v for k, v in state.items() if "/param/" in k and k not in params}
        if self.pipeline_owned:  # sdpipe: this pipeline's own copy
            q = executor.program.pipeline
            own = [f"{n}@p{q}" for n in executor.names]
            state.update(
                checkpoint_state({i: executor.blocks[i] for i in self.pipeline_owned}, executor.precision, own)
            )
        # fault tests: this rank dies once its files are written, before the checkpoint is published
        die = (lambda: os.kill(os.getpid(), signal.SIGKILL)) if step == self.crash_step else None
        try:
            save_checkpoint(
                self.args.save,
                state,
                step=step,
                info=info,
                group=self.group,
                keep_last=self.args.keep_last,
                after_write=die,
            )
        except HetplanError as exc:
            raise RankFailureError(f"{self.where}: {exc}") from None
        self.last = step


def _holders(compiled, block: int, config) -> tuple[str, ...]:
    """The devices holding ``block``: its gradient group's, or under wsp and sdpipe (no job-wide
    group) every device whose blocks include it, in every pipeline."""
    if config.plan.sync in ("wsp", "sdpipe"):
        return tuple(a for a, e in config.devices.items() if e.start <= block < e.end)
    for g in compiled.groups:
        if block in g.blocks:
            return g.devices
    return ()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hetplan.runtime.worker", description=__doc__)
    parser.add_argument("config")
    # --node-name and --run-log, not --node and --log, under torchrun: its own parser reads the
    # worker's arguments too and refuses a prefix of its options (--node-rank, --log-dir) as ambiguous
    parser.add_argument(
        "--node-name", "--node", dest="node", default=None, help="this node's name (several: comma-separated, in order)"
    )
    parser.add_argument("--device", default=None, help="the device NODE/INDEX (instead of --node and LOCAL_RANK)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--run-log", "--log", dest="log", default=None, help="run log (JSON lines); '{rank}' in it becomes the rank"
    )
    parser.add_argument("--emulate", action="store_true")
    parser.add_argument("--save", default=None, help="checkpoint folder: the final state is saved there")
    parser.add_argument("--save-every", type=int, default=None, help="also save after every N steps")
    parser.add_argument("--keep-last", type=int, default=None, help="keep only the newest K checkpoints")
    parser.add_argument("--resume", default=None, help="checkpoint folder to resume from (its latest)")
    parser.add_argument("--resume-step", type=int, default=None, help="resume from this step's checkpoint")
    parser.add_argument("--backend", default=None, choices=("gloo", "nccl"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--compute-device",
        default=None,
        choices=("cpu", "cuda"),
        help="compute on this (default: the rank config's, else cuda under nccl, cpu under gloo); "
        "cuda under gloo stages tensors through host memory",
    )
    parser.add_argument(
        "--accept-device-mismatch",
        action="store_true",
        help="go on when a rank's GPU is not the plan's device type (default: stop with one line)",
    )
    parser.add_argument(
        "--blocking-allreduce",
        action="store_true",
        help="issue each all-reduce at its AR action and wait there (for benchmarks: the old behaviour)",
    )
    parser.add_argument("--status-dir", default=None, help="write rank-R.json (rank, pid) here, for a launcher")
    parser.add_argument(
        "--skip-nonfinite",
        action="store_true",
        help="go on past a step whose loss is not finite (its update is skipped on every rank); default: stop there",
    )
    parser.add_argument("--crash-in-save", default=None, help=argparse.SUPPRESS)  # RANK:STEP, for fault tests
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.node and not args.device:
        parser.error("give --node-name NAME (under torchrun) or --device NODE/INDEX")
    if args.save_every is not None and (args.save_every < 1 or not args.save):
        parser.error("--save-every needs --save and a number of steps >= 1")
    if args.keep_last is not None and (args.keep_last < 1 or not args.save):
        parser.error("--keep-last needs --save and a count >= 1")
    if args.resume_step is not None and not args.resume:
        parser.error("--resume-step needs --resume")
    where = _Where(rank=int(os.environ.get("RANK", "0")) if os.environ.get("RANK", "0").isdigit() else None)
    _stop_after_grace_on_sigterm(where)
    try:
        if args.status_dir:
            _write_status(args.status_dir, where.rank or 0)
        run(args, where)
    except Exception as exc:
        from hetplan.errors import HetplanError
        from hetplan.runtime.comm import RankFailureError

        known = isinstance(exc, (HetplanError, RankFailureError))
        if not known and os.environ.get("HETPLAN_TRACEBACK"):  # for developers: where an unexpected error came from
            import traceback

            traceback.print_exc()
        text = str(exc) if known else f"{type(exc).__name__}: {exc}"
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        print(f"error: {first}", file=sys.stderr, flush=True)
        sys.stderr.flush()
        os._exit(3)  # no lingering threads or process-group teardown that could hang


if __name__ == "__main__":
    main()
