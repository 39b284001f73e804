"""What a running job has done so far, step by step, read from its ranks' run logs as they grow.

    watcher = StepWatcher(run_dir, world=4, global_batch=32, steps=100)
    for line in watcher.poll():          # the steps every rank has finished since the last look
        print(line.text())               # 'step 3/100  loss 6.2113  41.2 ms/step  776.7 samples/s'

The launcher (:mod:`hetplan.runtime.launcher`) polls one of these while the ranks train, so that a
run under ``nohup``, SLURM or a CI log prints one line per step (``hetplan launch --log-every N``)
and a terminal's progress bar shows the same figures. A step is reported once every rank has logged
it: its time is the slowest rank's iteration (a step lasts that long, as the summary and ``hetplan
report`` count it), its loss the global batch's mean (rank 0's under the all-reduce modes, the same
on every rank; under wsp and sdpipe, where each rank logs its pipeline's ``pipeline_loss``, the
pipelines' sample-weighted mean, as the merged run log has it), its rate the global batch over that time.

Each rank appends one JSON line per step and flushes it; a line read half-written is left for the
next look, so nothing is parsed twice or torn.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetplan.contracts.runlog import global_batch_losses

__all__ = ["StepLine", "StepWatcher"]


@dataclass(frozen=True)
class StepLine:
    """One finished step of the job, as every rank logged it."""

    step: int  #: the step's index (0-based; a resumed run continues the count)
    done: int  #: steps this run has finished, this one included
    steps: int  #: steps this run was asked for
    loss: float | None  #: the global batch's mean loss (None on a step whose loss was not finite)
    step_s: float  #: the slowest rank's iteration time
    samples_per_s: float  #: global batch / step_s
    nonfinite: str | None = None  #: what was not finite ("nan", "inf", "gradient"), the update skipped
    skipped: int = 0  #: non-finite steps skipped so far in this run, this one included

    def text(self) -> str:
        """The line a log shows for this step: ``step 3/100`` and :meth:`figures`."""
        return f"step {self.done}/{self.steps}  {self.figures()}"

    def figures(self) -> str:
        """Loss, step time, samples/s and skips: what a progress bar shows beside its count."""
        loss = f"loss {self.loss:.4f}" if self.loss is not None else f"loss {self.nonfinite or 'none'}"
        out = f"{loss}  {self.step_s * 1e3:.1f} ms/step  {self.samples_per_s:.1f} samples/s"
        if self.nonfinite:
            out += "  (non-finite: update skipped)"
        if self.skipped:
            out += f"  [{self.skipped} skipped]"
        return out


class StepWatcher:
    """Reads the ranks' ``rank-R.jsonl`` files in ``run_dir`` incrementally; :meth:`poll` returns the
    steps that every one of the ``world`` ranks has logged since the last call, in step order."""

    def __init__(self, run_dir: str | Path, *, world: int, global_batch: int, steps: int) -> None:
        self.paths = [Path(run_dir) / f"rank-{r}.jsonl" for r in range(world)]
        self.offsets = [0] * world
        self.global_batch = global_batch
        self.steps = steps
        #: step -> rank -> record, for the steps not every rank has logged yet
        self.pending: dict[int, dict[int, dict[str, Any]]] = {}
        self.done = 0
        self.skipped = 0

    def _read_new(self, rank: int) -> list[dict[str, Any]]:
        try:
            with self.paths[rank].open("rb") as f:
                f.seek(self.offsets[rank])
                chunk = f.read()
        except OSError:
            return []
        end = chunk.rfind(b"\n") + 1  # whole lines only: a half-written one waits for the next look
        self.offsets[rank] += end
        out = []
        for line in chunk[:end].splitlines():
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue  # not a record (the log is written by the ranks alone: never expected)
        return out

    def poll(self) -> list[StepLine]:
        """The steps newly finished on every rank (oldest first)."""
        for rank in range(len(self.paths)):
            for record in self._read_new(rank):
                self.pending.setdefault(int(record["step"]), {})[rank] = record
        ready = sorted(s for s, by_rank in self.pending.items() if len(by_rank) == len(self.paths))
        lines = []
        for step in ready:
            by_rank = self.pending.pop(step)
            step_s = max(float(r["iteration_s"]) for r in by_rank.values())
            loss = by_rank[0].get("loss")
            if loss is None and by_rank[0].get("pipeline_loss") is not None:  # wsp, sdpipe
                lines_of_step = (
                    (step, r["pipeline"], r.get("pipeline_loss"), r.get("pipeline_batch")) for r in by_rank.values()
                )
                loss = global_batch_losses(lines_of_step, global_batch=self.global_batch).get(step)
            nonfinite = by_rank[0].get("nonfinite")
            self.done += 1
            self.skipped += 1 if nonfinite else 0
            lines.append(
                StepLine(
                    step=step,
                    done=self.done,
                    steps=self.steps,
                    loss=float(loss) if loss is not None and math.isfinite(loss) else None,
                    step_s=step_s,
                    samples_per_s=self.global_batch / step_s if step_s > 0 else float("inf"),
                    nonfinite=nonfinite,
                    skipped=self.skipped,
                )
            )
        return lines
