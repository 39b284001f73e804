"""Peak host memory of one rank while it builds its blocks: its share only, against the whole model.

    python benchmarks/bench_startup_memory.py               # about a minute on 2 shared cores

A user's factory model of 8 equal blocks (each ``Linear(W, W)`` + GELU, initialised by the
factory's own ``normal_(std=0.02)``), so one rank of an 8-stage pipeline holds 1/8 of it. Each case
runs in a fresh process; the peak is the process's high-water mark of resident memory (``VmHWM``,
reset through ``/proc/self/clear_refs`` once torch and hetplan are imported), minus the resident
memory at that point:

* ``whole model``: the factory called in full on the CPU and one block kept, which is what every
  rank did before it built only its share;
* ``rank share, seeded``: :func:`hetplan.runtime.weights.materialise.build_rank_blocks` for one
  block, seeded (:mod:`hetplan.models.partial_build`): the model is shaped on meta, then only the
  block's tensors are made, with the factory's own values (checked equal to the whole build here);
* ``rank share, --init-from``: the same block built on meta and loaded from a ``.safetensors`` file
  of the whole model (only its tensors are read).

``resolve_model`` (which probes the factory, on meta) is inside the measured window in every case.
Prints a Markdown table and the command.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = """
import torch
from torch import nn


def init_weights(m):
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, std=0.02)
        nn.init.zeros_(m.bias)


def eight(width=2048):
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(8)])
    model.apply(init_weights)
    return model
"""
CASES = ("whole model", "rank share, seeded", "rank share, --init-from")


def _status(field: str) -> float:
    """A ``/proc/self/status`` memory figure in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def run_case(case: str, width: int, block: int, folder: Path) -> dict[str, float]:
    """One case in this process: the peak resident memory it adds, in MiB, and its seconds."""
    import torch

    from hetplan.models import resolve_model
    from hetplan.runtime.weights.materialise import build_rank_blocks

    sys.path.insert(0, str(folder))

    def start_rank(width: int, source: str | None) -> torch.nn.Module:
        zoo = resolve_model({"factory": "bench_models:eight", "config": {"width": width}, "input_shape": [width]})
        if case == "whole model":
            blocks, _ = zoo._call(0)  # the factory in full, as every rank called it before
            return blocks[block], zoo
        return build_rank_blocks(zoo, block, block + 1, 0, init_from=source)[0], zoo

    # a tiny model first, the same way: what is loaded or set up once (modules, kernels) is not counted
    tiny = folder / "tiny.safetensors" if case == "rank share, --init-from" else None
    start_rank(8, str(tiny) if tiny else None)
    source = str(folder / "whole.safetensors") if tiny else None
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark
    base = _status("VmRSS")
    start = time.perf_counter()
    mine, zoo = start_rank(width, source)
    seconds = time.perf_counter() - start
    for t in mine.state_dict().values():  # every value read once, as training will (a lazily mapped page counts)
        t.sum()
    peak = _status("VmHWM") - base
    expected = torch.load(folder / f"block{block}.pt", weights_only=True)
    same = all(torch.equal(mine.state_dict()[k], v) for k, v in expected.items())
    return {"peak_mib": peak, "seconds": seconds, "equal": same, "built_whole": zoo.built_whole is not None}


def prepare(folder: Path, width: int, block: int) -> float:
    """The model's module, its whole weights (safetensors) and block ``block``'s values; its MiB."""
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(folder))
    (folder / "bench_models.py").write_text(MODULE)
    from hetplan.models import resolve_model

    for name, w in (("tiny", 8), ("whole", width)):
        zoo = resolve_model({"factory": "bench_models:eight", "config": {"width": w}, "input_shape": [w]})
        blocks, _ = zoo._call(0)
        state = {f"{i}.{k}": v for i, b in enumerate(blocks) for k, v in b.state_dict().items()}
        save_file(state, str(folder / f"{name}.safetensors"))
    torch.save(blocks[block].state_dict(), folder / f"block{block}.pt")
    return sum(v.numel() * v.element_size() for v in state.values()) / 2**20


#: glibc keeps freed blocks above its (self-raising) mmap threshold in the heap for reuse, so a
#: process that allocates and frees a block-sized scratch tensor over and over grows its resident
#: set beyond its live tensors; a fixed threshold returns each freed block to the system at once
MALLOC = {"glibc default": {}, "MALLOC_MMAP_THRESHOLD_=131072": {"MALLOC_MMAP_THRESHOLD_": "131072"}}


def main() -> None:
    import os

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048, help="each block is Linear(W, W): 4 W^2 bytes")
    parser.add_argument("--block", type=int, default=5, help="the rank's block (0-7)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case (the table shows the largest peak)")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.width, args.block, args.folder)))
        return
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        total = prepare(folder, args.width, args.block)
        for case in CASES:
            for malloc, env in MALLOC.items():
                for _ in range(args.repeat):
                    out = subprocess.run(
                        [sys.executable, __file__, "--case", case, "--width", str(args.width), "--block",
                         str(args.block), "--folder", str(folder)],
                        check=True, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env},
                    )  # fmt: skip
                    results.setdefault((case, malloc), []).append(json.loads(out.stdout.strip().splitlines()[-1]))
    share = total / 8
    print(f"model: 8 blocks x Linear({args.width}, {args.width}), {total:.0f} MiB of fp32; one rank's share "
          f"(block {args.block}): {share:.0f} MiB\n")  # fmt: skip
    heads = " | ".join(f"peak added RSS, {m} (MiB, x share)" for m in MALLOC)
    print(f"| startup | {heads} | seconds | values = whole build | factory called in full |")
    print("|---|" + "---:|" * len(MALLOC) + "---:|---|---|")
    for case in CASES:
        cells, runs = [], []
        for malloc in MALLOC:
            found = results[(case, malloc)]
            runs += found
            peak = max(r["peak_mib"] for r in found)
            cells.append(f"{peak:.0f} ({peak / share:.2f}x)")
        seconds = min(r["seconds"] for r in runs)
        equal = "yes" if all(r["equal"] for r in runs) else "NO"
        whole = "yes" if case == "whole model" or any(r["built_whole"] for r in runs) else "no"
        print(f"| {case} | {' | '.join(cells)} | {seconds:.2f} | {equal} | {whole} |")
    print(f"\ncommand: python benchmarks/{Path(__file__).name} {shlex.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
