#!/usr/bin/env python3
"""One script for a GPU at hand: every GPU path of hetplan exercised once, each figure recorded.

    python3 benchmarks/gpu_check.py --out $OUT              # on a machine with one GPU: < 8 minutes
    python3 benchmarks/gpu_check.py --cpu --out /tmp/check  # every section on this CPU, tiny sizes
    python3 benchmarks/gpu_check.py --sections probe,nccl-collectives --out /tmp/check

Sections (each a child process of this script, with its own time limit, so one failure, hang or
crash loses nothing else; they run one of each kind first, then the other dtypes, so a run short of
time skips the least needed; ``SECTIONS`` below has the order and the limits):

* ``environment``: the Python, torch, CUDA/ROCm and packages found; the GPU and its catalog type.
* ``probe``: ``hetplan probe`` (GPUs in PCI order, matmul TFLOP/s per dtype, copy bandwidths,
  differences from the catalog).
* ``profile-fp32``, ``profile-bf16``, ``profile-fp16``: ``hetplan profile`` of the zoo GPT measured
  on the GPU, saved as ``profiles/models/<model>.<GPU type>.yaml``, beside the analytic estimate's
  error per block (same type, dtype and micro-batch).
* ``nccl-collectives``: every torch.distributed call the runtime makes, on a one-rank NCCL group.
* ``train-2stage-{fp16,bf16}``, ``train-2pipe-{fp16,bf16}``: a 2-stage and a 2-pipeline plan, both
  ranks on the one GPU through the host-staged transport (gloo), losses against the same plan in
  one process and against the one-process reference; peak memory per rank measured vs predicted.
* ``sync-topk``, ``sync-adasum``, ``sync-wsp``, ``sync-sdpipe``: a few steps of each sync mode.
* ``nccl-runtime``: one-device plans trained on NCCL at world size 1 under each sync mode.
* ``hf-train-gpt2``: a Hugging Face GPT-2 (tied LM head) from a config, 2 stages sharing the GPU on
  a user's token dataset, against the same plan in one process and the plain transformers loop on
  the same GPU.
* ``checkpoint-bf16``: 2 stages sharing the GPU save after 2 steps and resume for 2 more, under the
  same plan and under 2 pipelines, against 4 uninterrupted steps.
* ``hf-profile-bf16``: ``hetplan profile`` of real models' shapes from their configs (GPT-2 small;
  TinyLlama-1.1B's Llama config, grouped-query attention), saved under ``profiles/models/``.
* ``sync-fp16``: every sync mode in fp16 (SGD) with 2 pipelines sharing the GPU, clean and with an
  overflow forced on one rank: the step skipped wherever the update depends on it.

Results go under ``--out`` (default: this checkout) as ``benchmarks/results/gpu_check-<TYPE>.json``
and ``.md`` and ``profiles/models/*.yaml``: at most 5 files. The script installs nothing: it runs with
the Python it was started with (``--python`` picks another), imports ``hetplan`` from this checkout
(a link in a scratch folder; no install needed), and says in ``environment`` what is missing.
``--cpu`` runs every section on the CPU with tiny sizes and gloo instead of NCCL: what tests run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path("benchmarks") / "results"
MODELS_DIR = Path("profiles") / "models"
SEED = 0
#: The whole script, on a GPU: the sections share it, the later ones shortened or skipped.
DEFAULT_BUDGET_S = 450.0
#: A section with less time than this left is skipped (recorded as such).
MIN_SECTION_S = 15.0
#: Seconds after SIGTERM before a section's process group is killed (the launcher stops its ranks).
TERM_GRACE_S = 15.0


@dataclass(frozen=True)
class Section:
    """One check: its name, its time limit on a GPU and on the CPU (seconds), what it shows."""

    name: str
    gpu_limit_s: float
    cpu_limit_s: float
    what: str


#: In order of importance (a run out of time skips the last): one of each kind first, then the other
#: dtypes. Limits: seconds on a GPU, then on the CPU (--cpu, on 2 cores shared with other work).
SECTIONS: tuple[Section, ...] = (
    Section("environment", 60, 120, "Python, torch, CUDA/ROCm, packages; the GPU and its catalog type"),
    Section("probe", 90, 120, "hetplan probe: GPUs in PCI order, matmul TFLOP/s, copy bandwidths vs the catalog"),
    Section("profile-bf16", 90, 180, "hetplan profile of the zoo GPT on the GPU, bf16, vs the analytic estimate"),
    Section("nccl-collectives", 60, 120, "every torch.distributed call of the runtime on a one-rank NCCL group"),
    Section("train-2stage-bf16", 100, 360, "2 stages sharing the GPU (host-staged gloo), bf16, vs one process"),
    Section("train-2pipe-fp16", 100, 360, "2 pipelines sharing the GPU (host-staged gloo), fp16, vs one process"),
    Section(
        "nccl-runtime", 180, 240, "one-device plans on NCCL at world size 1: allreduce, top-k, Adasum, WSP, SDPipe"
    ),
    Section("sync-topk", 90, 240, "top-k (ratio 0.05), 2 pipelines sharing the GPU, a few steps"),
    Section("sync-adasum", 90, 240, "Adasum, 2 pipelines sharing the GPU, a few steps"),
    Section("sync-wsp", 90, 240, "WSP (staleness 1), 2 pipelines sharing the GPU, a few steps"),
    Section("sync-sdpipe", 90, 240, "SDPipe, 2 pipelines sharing the GPU, a few steps"),
    Section("profile-fp32", 90, 180, "the zoo GPT profile in fp32"),
    Section("profile-fp16", 90, 180, "the zoo GPT profile in fp16"),
    Section("train-2stage-fp16", 100, 360, "2 stages sharing the GPU, fp16"),
    Section("train-2pipe-bf16", 100, 360, "2 pipelines sharing the GPU, bf16"),
    Section("hf-train-gpt2", 120, 300, "HF GPT-2 (tied head), 2 stages sharing the GPU on tokens, vs the plain loop"),
    Section("checkpoint-bf16", 120, 360, "2 stages sharing the GPU, bf16: save, resume (same plan and another)"),
    Section("hf-profile-bf16", 200, 300, "hetplan profile of HF GPT-2 small and a 1.1B Llama config on the GPU, bf16"),
    Section("sync-fp16", 200, 400, "every sync mode in fp16 on the GPU, a forced overflow skipped on every rank"),
)
SECTION_NAMES = tuple(s.name for s in SECTIONS)

#: The zoo GPT profiled (large enough that a GPU's matmuls, not kernel launches, dominate) and the
#: one trained (small: the one-process reference of each run also runs, on the CPU).
PROFILE_MODEL = {"name": "gpt-medium", "config": {"layers": 4, "hidden": 1024, "heads": 16, "seq": 256, "vocab": 8192}}
TRAIN_MODEL = {"layers": 4, "hidden": 128, "heads": 4, "seq": 64, "vocab": 512}
CPU_MODEL = {"name": "gpt-tiny", "config": {"layers": 2, "hidden": 64, "heads": 2, "seq": 32, "vocab": 256}}
TRAIN_STEPS = 3
GLOBAL_BATCH = 8
#: Losses of the same plan on the same device, one process vs several: the runtime's stated
#: tolerance (docs/runtime.md, Precision). Against the CPU reference on a GPU the kernels differ,
#: so a looser bound, stated here and in the results.
SAME_DEVICE_TOLERANCE = 1e-3
CPU_REFERENCE_TOLERANCE_ON_GPU = 2e-2


# =========================================================================== the parent
def _shim(work: Path) -> Path:
    """A folder holding a link ``hetplan -> <checkout>/planner``, put first on PYTHONPATH: the
    children import this checkout's hetplan whether or not (and wherever) it is installed."""
    folder = work / "import"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "hetplan"
    if not link.exists():
        link.symlink_to(ROOT / "planner", target_is_directory=True)
    return folder


def _tail(path: Path, lines: int = 15) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the section's process group (the launcher then stops its ranks), SIGKILL after a grace."""
    for sig, wait in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_section(
    section: Section, *, limit: float, python: str, env: dict[str, str], work: Path, out: Path, cpu: bool
) -> dict[str, Any]:
    """Run one section as a child process within ``limit`` seconds; its result, pass or fail."""
    result_file, log_file = work / f"{section.name}.json", work / f"{section.name}.log"
    result_file.unlink(missing_ok=True)
    cmd = [python, str(Path(__file__).resolve()), "--child", section.name, "--work", str(work), "--out", str(out)]
    if cpu:
        cmd.append("--cpu")
    began = time.perf_counter()
    with open(log_file, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        try:
            code = proc.wait(timeout=limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            code, timed_out = proc.returncode, True
    seconds = time.perf_counter() - began
    record: dict[str, Any] = {
        "section": section.name,
        "what": section.what,
        "seconds": round(seconds, 1),
        "limit_s": round(limit, 1),
    }
    reported = None
    if result_file.is_file():
        try:
            reported = json.loads(result_file.read_text(encoding="utf-8"))
        except ValueError:
            reported = None
    if timed_out:
        record.update(status="fail", error=f"timed out after {limit:.0f} s", log_tail=_tail(log_file))
    elif reported is None:
        record.update(status="fail", error=f"exited with code {code} and no result", log_tail=_tail(log_file))
    else:
        record.update(reported)
        if code != 0 and record.get("status") == "pass":
            record.update(status="fail", error=f"exited with code {code}")
        if record.get("status") != "pass":
            record.setdefault("log_tail", _tail(log_file))
    return record


def _python_for(args: argparse.Namespace) -> str:
    return args.python or sys.executable


def main_parent(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve() if args.out else ROOT
    names = [n.strip() for n in args.sections.split(",")] if args.sections else list(SECTION_NAMES)
    unknown = [n for n in names if n not in SECTION_NAMES]
    if unknown:
        print(f"error: --sections: unknown {', '.join(unknown)}; expected some of {', '.join(SECTION_NAMES)}")
        return 2
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_shim(work)), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if args.cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU mode never touches a GPU, even where one is
    budget = args.budget if args.budget is not None else (DEFAULT_BUDGET_S if not args.cpu else 1e9)
    began = time.perf_counter()
    records: list[dict[str, Any]] = []
    for section in (s for s in SECTIONS if s.name in names):
        left = budget - (time.perf_counter() - began)
        limit = min(section.cpu_limit_s if args.cpu else section.gpu_limit_s, left)
        if limit < MIN_SECTION_S:
            records.append(
                {
                    "section": section.name,
                    "what": section.what,
                    "status": "skipped",
                    "error": f"out of time: {left:.0f} s of the {budget:.0f} s budget left",
                }
            )
        else:
            records.append(
                run_section(section, limit=limit, python=_python_for(args), env=env, work=work, out=out, cpu=args.cpu)
            )
        r = records[-1]
        print(
            f"[{time.perf_counter() - began:6.1f} s] {r['section']}: {r['status']}"
            + (f" ({r.get('error')})" if r["status"] != "pass" else ""),
            flush=True,
        )
    total = time.perf_counter() - began
    device = next((r.get("figures", {}).get("device_type") for r in records if r["section"] == "environment"), None)
    tag = device or ("cpu" if args.cpu else "unknown")
    report = {
        "schema": "hetplan/gpu-check/v1",
        "mode": "cpu" if args.cpu else "gpu",
        "device_type": tag,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - total)),
        "seconds": round(total, 1),
        "budget_s": budget,
        "sections": records,
    }
    results = out / RESULTS_DIR
    results.mkdir(parents=True, exist_ok=True)
    (results / f"gpu_check-{tag}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (results / f"gpu_check-{tag}.md").write_text(markdown(report), encoding="utf-8")
    print(summary_text(report))
    print(f"wrote {results / f'gpu_check-{tag}.json'} and .md (work files: {work})")
    return 0 if all(r["status"] == "pass" for r in records) else 1


# =========================================================================== reports
def _fmt(value: Any) -> str:
    """A table cell: floats to 4 significant digits, pipes escaped (a markdown table's separator)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def summary_text(report: dict[str, Any]) -> str:
    lines = [f"gpu_check ({report['mode']} mode, {report['device_type']}): {report['seconds']:.0f} s"]
    for r in report["sections"]:
        line = f"  {r['status']:7s} {r['section']:18s} {r.get('seconds', 0):6.1f} s  {r.get('headline', '')}"
        if r["status"] != "pass":
            line += f"  {r.get('error', '')}"
        lines.append(line.rstrip())
    passed = sum(r["status"] == "pass" for r in report["sections"])
    lines.append(f"  {passed}/{len(report['sections'])} sections passed")
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    """The short human report: the summary table, then each section's figures."""
    out = [
        f"# gpu_check: {report['device_type']} ({report['mode']} mode)",
        "",
        f"`{report['command']}` on {report['host']}, started {report['started']}, {report['seconds']:.0f} s "
        + (f"(budget {report['budget_s']:.0f} s)." if report["budget_s"] < 1e8 else "(no budget)."),
        "",
        "| section | status | seconds | result |",
        "|---|---|---:|---|",
    ]
    for r in report["sections"]:
        text = r.get("headline", "") if r["status"] == "pass" else r.get("error", "")
        out.append(f"| {r['section']} | {r['status']} | {r.get('seconds', '-')} | {_fmt(text)} |")
    for r in report["sections"]:
        tables = r.get("tables") or []
        tail = r.get("log_tail") or []
        if not tables and not tail:
            continue
        out += ["", f"## {r['section']}", "", r.get("what", "")]
        for table in tables:
            out += [
                "",
                f"{table['title']}",
                "",
                "| " + " | ".join(table["columns"]) + " |",
                "|" + "---|" * len(table["columns"]),
            ]
            out += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in table["rows"]]
        if tail:
            out += ["", "last lines of its output:", "", "```", *tail, "```"]
    return "\n".join(out) + "\n"


# =========================================================================== the child
class Check:
    """What a section child knows: the mode, where to write, and helpers to run hetplan."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.cpu: bool = args.cpu
        self.out = Path(args.out)
        self.work = Path(args.work)
        self.figures: dict[str, Any] = {}
        self.tables: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.failures: list[str] = []
        self.headline = ""

    # -- results
    def expect(self, ok: bool, message: str) -> None:
        """Record a failed expectation (the section goes on, and fails at the end)."""
        if not ok:
            self.failures.append(message)

    def table(self, title: str, columns: list[str], rows: list[list[Any]]) -> None:
        self.tables.append({"title": title, "columns": columns, "rows": rows})

    # -- the device
    @property
    def device(self) -> str:
        return "cpu" if self.cpu else "cuda"

    def device_type(self) -> str:
        """The catalog type of the GPU (or ``cpu``); a GPU the catalog lacks is named ``this-gpu``."""
        if self.cpu:
            return "cpu"
        import torch

        from hetplan.contracts import load_catalog
        from hetplan.profile.measure import cuda_device_type

        props = torch.cuda.get_device_properties(0)
        return cuda_device_type(props.name, props.total_memory, load_catalog()) or "this-gpu"

    def cluster(self, devices: int):
        """One node of ``devices`` devices of this GPU's type (or the CPU) sharing the machine."""
        from hetplan.contracts.cluster import parse_cluster

        kind = self.device_type()
        entry: dict[str, Any] = {"type": kind, "count": devices}
        if kind == "this-gpu":
            import torch

            memory = torch.cuda.get_device_properties(0).total_memory
            entry["spec"] = {
                "memory": float(memory),
                "memory_bandwidth": "1000GB/s",
                "tflops": {"fp32": 20, "fp16": 100, "bf16": 100},
            }
        data = {
            "schema": "hetplan/cluster/v1",
            "name": "gpu-check",
            "description": "ranks sharing one device through host memory (gpu_check.py)",
            "nodes": [{"name": "n0", "devices": [entry], "link": {"bandwidth": "10GB/s", "latency": "20us"}}],
            "network": {"bandwidth": "10GB/s", "latency": "20us"},
        }
        return parse_cluster(data)

    def hetplan(self, *argv: str, timeout: float) -> subprocess.CompletedProcess:
        """Run ``hetplan ARGV`` (this checkout's, with this Python); its output kept for the log."""
        proc = subprocess.run(
            [sys.executable, "-m", "hetplan.cli", *argv], capture_output=True, text=True, timeout=timeout, cwd=self.work
        )
        print(f"$ hetplan {' '.join(argv)}\n{proc.stdout}{proc.stderr}", flush=True)
        if proc.returncode != 0:
            last = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"hetplan {argv[0]} exited with {proc.returncode}: {' / '.join(last)}")
        return proc


def _models(check: Check) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the profiled model, the trained model) as zoo model sections, by mode."""
    if check.cpu:
        tiny = {"family": "gpt", "config": dict(CPU_MODEL["config"])}
        return tiny, tiny
    return ({"family": "gpt", "config": dict(PROFILE_MODEL["config"])}, {"family": "gpt", "config": dict(TRAIN_MODEL)})


# --------------------------------------------------------------------------- environment
def section_environment(check: Check) -> None:
    import importlib.util

    figures = check.figures
    figures["python"] = f"{platform.python_version()} ({sys.executable})"
    missing = [m for m in ("torch", "yaml", "click", "rich", "numpy") if importlib.util.find_spec(m) is None]
    figures["missing_packages"] = missing
    optional = ("scipy", "pulp", "transformers", "safetensors", "torchvision")
    figures["optional_missing"] = [m for m in optional if importlib.util.find_spec(m) is None]
    check.expect(not missing, f"missing packages: {', '.join(missing)} (carry them as wheels)")
    if "torch" in missing:
        return
    import torch

    import hetplan

    figures["torch"] = torch.__version__
    figures["cuda"] = torch.version.cuda
    figures["hip"] = getattr(torch.version, "hip", None)
    figures["hetplan_from"] = str(Path(hetplan.__file__).resolve().parent)
    check.expect(
        Path(hetplan.__file__).resolve().parent == (ROOT / "planner").resolve(),
        f"hetplan imported from {figures['hetplan_from']}, not this checkout",
    )
    figures["cuda_available"] = torch.cuda.is_available()
    figures["cuda_device_order"] = os.environ.get("CUDA_DEVICE_ORDER", "")
    figures["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    if check.cpu:
        figures["device_type"] = "cpu"
        check.headline = f"torch {torch.__version__}, CPU mode"
        return
    check.expect(torch.cuda.is_available(), "torch sees no GPU (use --cpu on a machine without one)")
    if not torch.cuda.is_available():
        return
    figures["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    version = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else None
    figures["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else version
    figures["device_type"] = check.device_type()
    check.expect(figures["device_type"] != "this-gpu", f"{figures['gpus'][0]} maps to no catalog type")
    check.headline = (
        f"{figures['gpus'][0]} -> {figures['device_type']}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    )


# --------------------------------------------------------------------------- probe
def section_probe(check: Check) -> None:
    record = check.work / "probe.json"
    node = check.work / "probe-node.yaml"
    argv = [
        "probe",
        "-o",
        str(node),
        "--name",
        "node0",
        "--json",
        str(record),
        "--seconds",
        "0.05" if check.cpu else "0.2",
    ]
    if check.cpu:
        argv.append("--cpu")
    check.hetplan(*argv, timeout=240)
    from hetplan.contracts import load_cluster

    load_cluster(node)  # the entry validates
    data = json.loads(record.read_text(encoding="utf-8"))
    check.figures["node_entry"] = node.read_text(encoding="utf-8")
    check.figures["differences"] = data["differences"]
    rows = []
    for d in data["devices"]:
        gpu = d["kind"] != "cpu"
        rows.append(
            [
                d["position"],
                d["name"],
                d["pci_bus_id"] or "-",
                d["entry_type"],
                f"{d['memory_bytes'] / 2**30:.1f}",
                ", ".join(f"{k} {v:.4g}" for k, v in d["matmul_tflops"].items()),
                f"{d['memory_bandwidth'] / 1e9:.4g}",
                f"{d['host_to_device'] / 1e9:.1f}" if gpu else "-",
                f"{d['device_to_host'] / 1e9:.1f}" if gpu else "-",
            ]
        )
    check.table(
        "Devices seen (PCI order), measured",
        [
            "#",
            "name",
            "PCI",
            "type",
            "GiB",
            "matmul TFLOP/s",
            "memory copy GB/s",
            "host->device GB/s",
            "device->host GB/s",
        ],
        rows,
    )
    check.table(
        "Measured vs the catalog (peak x achieved fraction)",
        ["device", "what", "measured", "catalog", "unit", "difference", "basis"],
        [
            [c["device"], c["what"], c["measured"], c["expected"], c["unit"], f"{c['difference']:+.0%}", c["basis"]]
            for c in data["comparisons"]
        ],
    )
    first = data["devices"][0]
    check.headline = (
        f"{len(data['devices'])} device(s), {first['entry_type']}: "
        + ", ".join(f"{k} {v:.4g}" for k, v in first["matmul_tflops"].items())
        + f" TFLOP/s; {len(data['differences'])} figure(s) > 20% from the catalog"
    )


# --------------------------------------------------------------------------- profile
def _profile_file(check: Check, dtype: str) -> Path:
    name = CPU_MODEL["name"] if check.cpu else PROFILE_MODEL["name"]
    stem = name if dtype == "fp32" else f"{name}-{dtype}"
    return check.out / MODELS_DIR / f"{stem}.{check.device_type()}.yaml"


def section_profile(check: Check, dtype: str) -> None:
    from hetplan.contracts import load_catalog
    from hetplan.contracts.model_profile import load_profile
    from hetplan.profile.analytic import analytic_profile

    model, _ = _models(check)
    target = _profile_file(check, dtype)
    settings = [f"--{k}={v}" for k, v in model["config"].items()]
    micro = "1,2" if check.cpu else "1,2,4,8"
    repeat = "1" if check.cpu else "5"
    argv = [
        "profile",
        "gpt",
        *settings,
        "--device",
        check.device,
        "--dtype",
        dtype,
        "--micro-batches",
        micro,
        "--repeat",
        repeat,
        "--warmup",
        "1",
        "-o",
        str(target),
    ]
    check.hetplan(*argv, timeout=300)
    measured = load_profile(target)
    kind = check.device_type()
    catalog = load_catalog()
    device_type = catalog.get(kind) if kind in catalog else None
    check.figures["profile_file"] = (
        str(target.relative_to(check.out)) if target.is_relative_to(check.out) else str(target)
    )
    if device_type is None:
        check.notes.append(f"{kind} is not in the catalog: no analytic estimate to compare")
        return
    estimate = analytic_profile(
        "gpt",
        model["config"],
        devices=[device_type],
        dtype=dtype,
        micro_batches=tuple(sorted(measured.blocks[0].times[kind])),
    )
    if [b.name for b in measured.blocks] != [b.name for b in estimate.blocks]:
        check.expect(False, "the analytic profile's blocks are not the measured ones")
        return
    rows, errors = [], []
    for m, e in zip(measured.blocks, estimate.blocks, strict=True):
        sizes = sorted(m.times[kind])
        largest = sizes[-1]
        mt, et = m.times[kind][largest], e.times[device_type.name][largest]
        measured_s, estimated_s = mt.fwd + mt.bwd, et.fwd + et.bwd
        for size in sizes:
            a, b = m.times[kind][size], e.times[device_type.name][size]
            if a.fwd + a.bwd > 0:
                errors.append((b.fwd + b.bwd) / (a.fwd + a.bwd) - 1.0)
        rows.append(
            [
                m.name,
                largest,
                f"{measured_s * 1e3:.3f}",
                f"{estimated_s * 1e3:.3f}",
                f"{estimated_s / measured_s - 1.0:+.0%}" if measured_s > 0 else "-",
            ]
        )
    median_abs = statistics.median(abs(x) for x in errors)
    check.figures["analytic_error_median_abs"] = median_abs
    check.figures["analytic_error_range"] = [min(errors), max(errors)]
    check.table(
        f"{dtype}: measured fwd+bwd per block at the largest micro-batch vs the analytic estimate",
        ["block", "micro-batch", "measured ms", "analytic ms", "analytic error"],
        rows,
    )
    check.headline = (
        f"{check.figures['profile_file']}; analytic error median abs {median_abs:.0%}, "
        f"range {min(errors):+.0%}..{max(errors):+.0%} over blocks and micro-batches"
    )


# --------------------------------------------------------------------------- training
def _stage(start: int, end: int, device: str):
    from hetplan.contracts.plan import Stage

    return Stage(start, end, (device,), (1.0,))


def _plan(structure: str, n_blocks: int, dtype: str, *, sync: str = "allreduce", options: dict | None = None):
    """``2stage``: one pipeline cut in two; ``2pipe``: two one-stage pipelines; ``1proc``: one device."""
    from hetplan.contracts.plan import Pipeline, Plan

    cut = n_blocks // 2
    if structure == "2stage":
        pipelines = [Pipeline(GLOBAL_BATCH, (2, 2, 2, 2), (_stage(0, cut, "n0/0"), _stage(cut, n_blocks, "n0/1")))]
    elif structure == "2pipe":
        pipelines = [Pipeline(GLOBAL_BATCH // 2, (2, 2), (_stage(0, n_blocks, f"n0/{i}"),)) for i in range(2)]
    else:
        pipelines = [Pipeline(GLOBAL_BATCH, (2, 2, 2, 2), (_stage(0, n_blocks, "n0/0"),))]
    return Plan(GLOBAL_BATCH, pipelines, dtype=dtype, optimizer="adam", sync=sync, sync_options=dict(options or {}))


def _train_profile(check: Check, dtype: str):
    """The trained model measured here at ``dtype`` (its activation bytes feed the memory walk);
    measured once per run and dtype, then read back by the later sections."""
    from hetplan.contracts.model_profile import load_profile
    from hetplan.profile.measure import measure_profile

    cached = check.work / f"train-profile-{dtype}.yaml"
    if cached.is_file():
        return load_profile(cached)
    _, model = _models(check)
    profile = measure_profile(
        model,
        micro_batches=(1, 2, 4),
        device=check.device,
        dtype=dtype,
        warmup=1,
        repeat=1,
        device_type_name=check.device_type(),
    )
    profile.save(cached)
    return profile


def host_staged(config: dict[str, Any], *, gpu: bool) -> dict[str, Any]:
    """The rank config of ranks that share one GPU through host memory: gloo with
    ``training.compute_device: cuda`` (the host-staged transport, hetplan.runtime.device.staged;
    local ranks wrap around the visible GPUs). On the CPU: plain gloo, every rank's tensors through
    the transport's CPU stand-in (``HETPLAN_STAGE_ON_CPU=1``), the same staging code."""
    config = dict(config)
    training = dict(config["training"], backend="gloo")
    if gpu:
        training["compute_device"] = "cuda"
    else:
        os.environ["HETPLAN_STAGE_ON_CPU"] = "1"  # inherited by the ranks this process launches
    config["training"] = training
    return config


def _launch(
    check: Check,
    plan,
    profile,
    cluster,
    *,
    name: str,
    backend: str = "gloo",
    steps: int = TRAIN_STEPS,
    timeout_s: float = 60.0,
):
    """Train ``plan`` with every rank here; (records, rank config)."""
    from hetplan.contracts.yamlio import write_yaml
    from hetplan.emit import build_rank_config
    from hetplan.runtime.launcher import launch_local

    config = build_rank_config(plan, profile, cluster, seed=SEED, backend=backend, timeout_s=timeout_s)
    if backend == "gloo":
        config = host_staged(config, gpu=not check.cpu)
    if check.device_type() == "this-gpu":  # a GPU the catalog lacks: the plan's type is a stand-in
        config["training"] = dict(config["training"], accept_device_mismatch=True)
    path = check.work / f"{name}.rank-config.yaml"
    write_yaml(config, path)
    result = launch_local(path, steps=steps, log=check.work / f"{name}.jsonl")
    return result.records, config


def _rank0_losses(records: list[dict[str, Any]]) -> list[float]:
    return [r["loss"] for r in sorted(records, key=lambda r: r["step"]) if r["rank"] == 0]


def _on_expected_device(check: Check, records: list[dict[str, Any]], what: str, *, staged: bool = True) -> None:
    """The ranks ran where they should: on the GPU (its allocator measured their memory), through the
    host-staged transport when ``staged`` (the run log says so)."""
    want = "cpu allocator profile" if check.cpu else "cuda allocator"
    seen = sorted({str(r.get("memory_measured")) for r in records if r.get("memory_measured")})
    transports = sorted({str(r.get("transport", "direct")) for r in records})
    check.figures.setdefault("ranks_memory_measured_by", {})[what] = seen
    check.figures.setdefault("transport", {})[what] = transports
    check.expect(
        seen == [want],
        f"{what}: ranks measured memory with {seen}, expected {want!r} (did the ranks run on the device?)",
    )
    if staged:
        check.expect(transports == ["host-staged"], f"{what}: transport {transports}, expected host-staged")


def _one_process(check: Check, n_blocks: int, dtype: str, profile, cluster) -> list[dict[str, Any]]:
    """The same global batch and micro-batches on one rank of the same device; run once per dtype
    (the two plan shapes of a dtype compare with the same run)."""
    cached = check.work / f"train-1proc-{dtype}.records.json"
    if cached.is_file():
        return json.loads(cached.read_text(encoding="utf-8"))
    records, _ = _launch(check, _plan("1proc", n_blocks, dtype), profile, cluster, name=f"train-1proc-{dtype}")
    cached.write_text(json.dumps(records), encoding="utf-8")
    return records


def section_train(check: Check, structure: str, dtype: str) -> None:
    from hetplan.runtime.reference import train_reference
    from hetplan.schedule.compile import compile_plan
    from hetplan.simulate.memory import plan_memory

    profile = _train_profile(check, dtype)
    n = len(profile.blocks)
    cluster = check.cluster(2)
    plan = _plan(structure, n, dtype)
    records, config = _launch(check, plan, profile, cluster, name=f"train-{structure}-{dtype}")
    _on_expected_device(check, records, f"{structure} {dtype}")
    one = _one_process(check, n, dtype, profile, cluster)
    _, model = _models(check)
    reference, _ = train_reference(
        model,
        global_batch=GLOBAL_BATCH,
        optimizer="adam",
        lr=config["training"]["lr"],
        seed=SEED,
        steps=TRAIN_STEPS,
        dtype=dtype,
    )
    mine, single = _rank0_losses(records), _rank0_losses(one)
    same = max(abs(a - b) for a, b in zip(mine, single, strict=True))
    vs_ref = max(abs(a - b) for a, b in zip(mine, reference, strict=True))
    ref_tolerance = SAME_DEVICE_TOLERANCE if check.cpu else CPU_REFERENCE_TOLERANCE_ON_GPU
    check.expect(
        same <= SAME_DEVICE_TOLERANCE, f"losses differ from one process by {same:.2e} > {SAME_DEVICE_TOLERANCE}"
    )
    if check.cpu:
        check.expect(vs_ref <= ref_tolerance, f"losses differ from the reference by {vs_ref:.2e} > {ref_tolerance}")
    elif vs_ref > ref_tolerance:  # other kernels on the CPU: recorded, the same-device check decides
        check.notes.append(f"losses differ from the CPU reference by {vs_ref:.2e} > {ref_tolerance}")
    check.table(
        f"{structure} {dtype}: loss per step",
        ["step", "ranks sharing the device", "one process", "one-process reference (CPU)"],
        [[i, a, b, c] for i, (a, b, c) in enumerate(zip(mine, single, reference, strict=True))],
    )
    predicted = plan_memory(compile_plan(plan, n), profile, cluster, optimizer=plan.optimizer, dtype=dtype, plan=plan)
    rows = []
    for r in sorted(records, key=lambda r: (r["rank"], r["step"])):
        if r.get("peak_memory_bytes") is None or any(row[0] == r["rank"] for row in rows):
            continue
        want = predicted[r["device"]].tensor_bytes
        rows.append(
            [
                r["rank"],
                r["device"],
                r["step"],
                f"{r['peak_memory_bytes'] / 2**20:.2f}",
                f"{want / 2**20:.2f}",
                f"{r['peak_memory_bytes'] / want - 1.0:+.0%}",
            ]
        )
    check.expect(bool(rows), "no rank measured its peak memory")
    check.table(
        f"{structure} {dtype}: peak memory per rank, measured vs predicted (the memory walk)",
        ["rank", "device", "step", "measured MiB", "predicted MiB", "error"],
        rows,
    )
    check.figures.update(
        max_loss_diff_one_process=same,
        max_loss_diff_reference=vs_ref,
        losses=mine,
        memory=[{"rank": r[0], "measured_mib": r[3], "predicted_mib": r[4]} for r in rows],
    )
    check.headline = f"losses vs one process {same:.1e}, vs CPU reference {vs_ref:.1e}; peak memory " + ", ".join(
        f"rank {r[0]} {r[5]}" for r in rows
    )


# --------------------------------------------------------------------------- sync modes
SYNC_OPTIONS = {"topk": {"ratio": 0.05}, "adasum": {}, "wsp": {"staleness": 1}, "sdpipe": {}}


def section_sync(check: Check, sync: str) -> None:
    import math

    profile = _train_profile(check, "fp32")
    plan = _plan("2pipe", len(profile.blocks), "fp32", sync=sync, options=SYNC_OPTIONS[sync])
    records, _ = _launch(check, plan, profile, check.cluster(2), name=f"sync-{sync}", steps=4)
    _on_expected_device(check, [r for r in records if r.get("device") != "central"], sync)
    losses = _rank0_losses(records)
    check.expect(len(losses) == 4 and all(math.isfinite(x) for x in losses), f"losses {losses}")
    times = [r["iteration_s"] for r in records if r["rank"] == 0 and r.get("iteration_s") is not None]
    check.figures.update(losses=losses, iteration_s=times)
    median = f"; median step {statistics.median(times[1:]) * 1e3:.1f} ms" if len(times) > 1 else ""
    check.headline = "losses " + ", ".join(f"{x:.4f}" for x in losses) + median


# --------------------------------------------------------------------------- NCCL at world size 1
def section_nccl_collectives(check: Check) -> None:
    """Every torch.distributed call the runtime makes (planner/runtime), on a one-rank group."""
    import torch
    import torch.distributed as dist

    backend = "gloo" if check.cpu else "nccl"
    device = torch.device("cpu") if check.cpu else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    done: list[list[Any]] = []

    def run(name: str, call: Callable[[], Any], check_value: Callable[[], bool]) -> None:
        try:
            call()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            ok = bool(check_value())
            done.append([name, "ok" if ok else "WRONG RESULT"])
            check.expect(ok, f"{name}: wrong result")
        except Exception as exc:  # one call failing must not hide the others
            done.append([name, f"{type(exc).__name__}: {exc}"[:200]])
            check.expect(False, f"{name}: {type(exc).__name__}: {exc}"[:300])

    x = torch.arange(8, dtype=torch.float32, device=device)
    run("all_reduce (sum)", lambda: dist.all_reduce(x), lambda: x.sum().item() == 28.0)
    avg = torch.ones(4, device=device)
    op = dist.ReduceOp.AVG if backend == "nccl" else dist.ReduceOp.SUM
    run(
        f"all_reduce ({'avg' if backend == 'nccl' else 'sum'})",
        lambda: dist.all_reduce(avg, op=op),
        lambda: bool((avg == 1).all()),
    )
    half = torch.ones(4, dtype=torch.bfloat16, device=device)
    run("all_reduce bf16", lambda: dist.all_reduce(half), lambda: bool((half == 1).all()))
    out = [torch.empty(8, device=device)]
    run("all_gather", lambda: dist.all_gather(out, x), lambda: torch.equal(out[0], x))
    r = torch.full((3,), 2.0, device=device)
    run("reduce", lambda: dist.reduce(r, dst=0), lambda: bool((r == 2).all()))
    b = torch.full((3,), 5.0, device=device)
    run("broadcast", lambda: dist.broadcast(b, src=0), lambda: bool((b == 5).all()))
    run("barrier", lambda: dist.barrier(), lambda: True)
    objects: list[Any] = [None]
    run("all_gather_object", lambda: dist.all_gather_object(objects, {"rank": 0}), lambda: objects == [{"rank": 0}])
    group = dist.new_group([0], backend=backend)
    g = torch.ones(2, device=device)
    run("new_group + all_reduce", lambda: dist.all_reduce(g, group=group), lambda: bool((g == 1).all()))
    gloo = dist.new_group([0], backend="gloo")
    c = torch.ones(2)
    run("gloo side group (CPU tensors)", lambda: dist.all_reduce(c, group=gloo), lambda: bool((c == 1).all()))
    done.append(["send / recv / batch_isend_irecv", "not run: a one-rank group has no peer (torch refuses self)"])
    dist.destroy_process_group()
    check.table(f"torch.distributed calls of the runtime on a one-rank {backend} group", ["call", "result"], done)
    check.headline = f"{sum(d[1] == 'ok' for d in done)}/{len(done) - 1} calls ok on {backend}"


def section_nccl_runtime(check: Check) -> None:
    """One-device plans trained by the runtime on NCCL at world size 1, under each sync mode."""
    import math

    backend = "gloo" if check.cpu else "nccl"
    profile = _train_profile(check, "fp32")
    cluster = check.cluster(1)
    rows = []
    # the CPU mode runs one of the five (the loop is one code path; wsp adds a central process)
    modes = ("wsp",) if check.cpu else ("allreduce", "topk", "adasum", "wsp", "sdpipe")
    for sync in modes:
        plan = _plan("1proc", len(profile.blocks), "fp32", sync=sync, options=SYNC_OPTIONS.get(sync, {}))
        began = time.perf_counter()
        try:
            records, _ = _launch(
                check, plan, profile, cluster, name=f"nccl-{sync}", backend=backend, steps=2, timeout_s=30
            )
            losses = _rank0_losses(records)
            _on_expected_device(check, [r for r in records if r.get("device") != "central"], sync, staged=False)
            ok = len(losses) == 2 and all(math.isfinite(x) for x in losses)
            rows.append([sync, "ok" if ok else f"losses {losses}", f"{time.perf_counter() - began:.1f}"])
            check.expect(ok, f"{sync}: losses {losses}")
        except Exception as exc:
            rows.append([sync, f"{type(exc).__name__}: {exc}"[:200], f"{time.perf_counter() - began:.1f}"])
            check.expect(False, f"{sync}: {type(exc).__name__}: {exc}"[:300])
    check.table(f"one-device plans on {backend}, 2 steps each", ["sync", "result", "seconds"], rows)
    check.headline = f"{sum(r[1] == 'ok' for r in rows)}/{len(rows)} sync modes ran on {backend} at world size 1"


# --------------------------------------------------------------------------- Hugging Face models
#: GPT-2 trained on the GPU (tied LM head; dropout off so runs compare), on a user's token dataset.
HF_TRAIN_GPT2 = {
    "hf": "gpt2",
    "config": {"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 256, "n_positions": 64,
               "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
    "seq": 64,
}  # fmt: skip
#: Real models' shapes, built from their configs (no weights needed to time them): GPT-2 small
#: (124M) and TinyLlama-1.1B's config (22 layers, hidden 2048, 32 heads, 4 key-value heads).
HF_PROFILES = {
    "hf-gpt2-small": ("gpt2", "n_layer=12,n_embd=768,n_head=12,vocab_size=50257,n_positions=1024", 1024),
    "hf-llama-1.1b": (
        "llama",
        "num_hidden_layers=22,hidden_size=2048,num_attention_heads=32,num_key_value_heads=4,"
        "intermediate_size=5632,vocab_size=32000,max_position_embeddings=2048",
        2048,
    ),
}
HF_PROFILES_CPU = {
    "hf-gpt2-tiny": ("gpt2", "n_layer=2,n_embd=32,n_head=2,vocab_size=128,n_positions=32", 16),
}
TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair."
)
#: A user's dataset module: a text file's bytes as token ids in windows; labels = the ids.
TEXT_MODULE = """
import torch
from torch.utils.data import Dataset


class CharWindows(Dataset):
    def __init__(self, path, seq=8):
        self.ids = torch.tensor(list(open(path, "rb").read()), dtype=torch.long)
        self.seq = seq

    def __len__(self):
        return len(self.ids) // self.seq

    def __getitem__(self, i):
        window = self.ids[i * self.seq : (i + 1) * self.seq]
        return window, window.clone()


def build(path, seq=8):
    return CharWindows(path, seq)
"""


def _hf_model(check: Check) -> dict[str, Any]:
    if check.cpu:
        return {
            "hf": "gpt2",
            "config": {**HF_TRAIN_GPT2["config"], "n_embd": 16, "n_head": 2, "n_positions": 16},
            "seq": 8,
        }
    return {"hf": "gpt2", "config": dict(HF_TRAIN_GPT2["config"]), "seq": HF_TRAIN_GPT2["seq"]}


def _token_dataset(check: Check, seq: int) -> tuple[str, dict[str, Any]]:
    """The dataset module and text file in the work folder, importable by the ranks."""
    (check.work / "gpu_check_text.py").write_text(TEXT_MODULE, encoding="utf-8")
    book = check.work / "book.txt"
    book.write_text(TEXT * 8, encoding="utf-8")
    sys.path.insert(0, str(check.work))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(check.work), os.environ.get("PYTHONPATH")]))
    return "gpu_check_text:build", {"path": str(book), "seq": seq}


def section_hf_train(check: Check) -> None:
    """HF GPT-2 from a config, 2 stages sharing the GPU (host-staged gloo) on a token dataset, fp32:
    against the same plan in one process and the plain transformers loop on the same GPU."""
    import torch
    import transformers

    from hetplan.contracts.model_profile import Block, ModelProfile, Timing
    from hetplan.contracts.plan import Pipeline, Plan
    from hetplan.contracts.yamlio import write_yaml
    from hetplan.emit import build_rank_config
    from hetplan.models import resolve_model
    from hetplan.runtime.dataset import UserDataset
    from hetplan.runtime.launcher import launch_local

    spec = _hf_model(check)
    zoo = resolve_model(spec)
    dataset = _token_dataset(check, spec["seq"])
    kind = check.device_type()
    timing = {kind: {1: Timing(1e-3, 2e-3)}}
    profile = ModelProfile(
        model=zoo.model,
        dtype="fp32",
        blocks=[Block(n, "zoo", 0, 0.0, 0.0, 0.0, 0.0, timing) for n in zoo.block_names()],
    )
    n, cut = zoo.n_blocks, zoo.n_blocks // 2
    layouts = {
        "2stage": [Pipeline(GLOBAL_BATCH, (2, 2, 2, 2), (_stage(0, cut, "n0/0"), _stage(cut, n, "n0/1")))],
        "1proc": [Pipeline(GLOBAL_BATCH, (2, 2, 2, 2), (_stage(0, n, "n0/0"),))],
    }
    losses: dict[str, list[float]] = {}
    lr = 1e-3
    for name, pipelines in layouts.items():
        plan = Plan(GLOBAL_BATCH, pipelines, optimizer="adam")
        config = build_rank_config(
            plan, profile, check.cluster(2), seed=SEED, backend="gloo", timeout_s=120,
            dataset=dataset[0], dataset_kwargs=dataset[1],
        )  # fmt: skip
        config = host_staged(config, gpu=not check.cpu)
        lr = config["training"]["lr"]
        write_yaml(config, check.work / f"hf-{name}.rank-config.yaml")
        result = launch_local(
            check.work / f"hf-{name}.rank-config.yaml", steps=TRAIN_STEPS, log=check.work / f"hf-{name}.jsonl"
        )
        if name == "2stage":
            _on_expected_device(check, result.records, f"hf gpt2 {name}")
        losses[name] = _rank0_losses(result.records)
    # the plain transformers loop on the same device from the blocks' initial weights
    device = torch.device(check.device)
    model = transformers.AutoModelForCausalLM.from_config(zoo.hf_config())
    start = {}
    for i, block in enumerate(zoo.build_blocks(0, zoo.n_blocks, SEED)):
        keys = zoo.state_dict_keys(i)
        start.update({keys[k]: v for k, v in block.state_dict().items()})
    model.load_state_dict(start, strict=False)
    model.to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
    data = UserDataset(dataset[0], dataset[1], zoo=zoo, global_batch=GLOBAL_BATCH, seed=SEED)
    plain = []
    for step in range(TRAIN_STEPS):
        ids, labels = data.read(step, 0, GLOBAL_BATCH)
        optimizer.zero_grad()
        loss = model(input_ids=ids.to(device), labels=labels.to(device)).loss
        loss.backward()
        optimizer.step()
        plain.append(float(loss.detach()))
    same = max(abs(a - b) for a, b in zip(losses["2stage"], losses["1proc"], strict=True))
    vs_plain = max(abs(a - b) for a, b in zip(losses["2stage"], plain, strict=True))
    check.expect(same <= SAME_DEVICE_TOLERANCE, f"2 stages vs one process: {same:.2e} > {SAME_DEVICE_TOLERANCE}")
    check.expect(vs_plain <= SAME_DEVICE_TOLERANCE, f"vs the plain transformers loop: {vs_plain:.2e}")
    check.expect(plain[-1] < plain[0], f"the plain loop does not learn: {plain}")
    check.table(
        "HF GPT-2 (tied head), fp32: loss per step",
        ["step", "2 stages sharing the device", "one process", "plain transformers loop"],
        [[i, a, b, c] for i, (a, b, c) in enumerate(zip(losses["2stage"], losses["1proc"], plain, strict=True))],
    )
    check.figures.update(losses=losses["2stage"], max_diff_one_process=same, max_diff_plain_loop=vs_plain)
    check.headline = (
        f"losses vs one process {same:.1e}, vs the plain transformers loop on {check.device} {vs_plain:.1e}"
    )


def section_checkpoint(check: Check, dtype: str) -> None:
    """Save after 2 steps, resume for 2 more under the same plan and under another (2 pipelines):
    against 4 uninterrupted steps of the same plan, on the GPU."""
    from hetplan.contracts.yamlio import write_yaml
    from hetplan.emit import build_rank_config
    from hetplan.runtime.launcher import launch_local

    profile = _train_profile(check, dtype)
    n = len(profile.blocks)
    cluster = check.cluster(2)

    def config_for(structure: str) -> Path:
        config = build_rank_config(
            _plan(structure, n, dtype), profile, cluster, seed=SEED, backend="gloo", timeout_s=60
        )
        config = host_staged(config, gpu=not check.cpu)
        path = check.work / f"ckpt-{structure}-{dtype}.rank-config.yaml"
        write_yaml(config, path)
        return path

    stages, pipes = config_for("2stage"), config_for("2pipe")
    whole = launch_local(stages, steps=4, log=check.work / "ckpt-whole.jsonl").records
    _on_expected_device(check, whole, f"checkpoint {dtype}")
    folder = check.work / f"ckpt-{dtype}"
    launch_local(stages, steps=2, save=folder, log=check.work / "ckpt-first.jsonl")
    same = launch_local(stages, steps=2, resume=folder, log=check.work / "ckpt-same.jsonl").records
    other = launch_local(pipes, steps=2, resume=folder, log=check.work / "ckpt-other.jsonl").records
    a, b, c = _rank0_losses(whole), _rank0_losses(same), _rank0_losses(other)
    tail = a[-len(b) :] if b else []
    diff_same = max((abs(x - y) for x, y in zip(tail, b, strict=True)), default=float("inf"))
    diff_other = max((abs(x - y) for x, y in zip(a[-len(c) :], c, strict=True)), default=float("inf"))
    check.expect(len(b) >= 1, f"the resumed run logged no steps: {b}")
    check.expect(diff_same <= 1e-6, f"resumed under the same plan differs from uninterrupted by {diff_same:.2e}")
    check.expect(diff_other <= SAME_DEVICE_TOLERANCE, f"resumed under 2 pipelines differs by {diff_other:.2e}")
    check.table(
        f"{dtype}: loss per step, uninterrupted vs saved at 2 and resumed",
        ["run", "losses"],
        [["uninterrupted 2 stages", a], ["resumed, 2 stages", b], ["resumed, 2 pipelines", c]],
    )
    check.figures.update(losses=a, resumed_same_diff=diff_same, resumed_other_diff=diff_other)
    check.headline = f"resumed vs uninterrupted: same plan {diff_same:.1e}, another plan {diff_other:.1e}"


def section_hf_profile(check: Check, dtype: str) -> None:
    """Real models' shapes from their configs, profiled on the GPU and saved under profiles/models/;
    with the analytic-free roofline carry to catalog types beside it (--estimate-for)."""
    from hetplan.contracts.model_profile import load_profile

    rows = []
    models = HF_PROFILES_CPU if check.cpu else HF_PROFILES
    for stem, (family, kwargs, seq) in models.items():
        target = check.out / MODELS_DIR / f"{stem}.{check.device_type()}.{dtype}.yaml"
        began = time.perf_counter()
        check.hetplan(
            "profile", f"hf:{family}", "--kwargs", kwargs, "--seq", str(seq), "--device", check.device,
            "--dtype", dtype, "--micro-batches", "1,2" if check.cpu else "1,2,4",
            "--repeat", "1" if check.cpu else "3", "--warmup", "1", "-o", str(target), timeout=240,
        )  # fmt: skip
        profile = load_profile(target)
        kind = check.device_type()
        total = sum(b.times[kind][1].fwd + b.times[kind][1].bwd for b in profile.blocks if 1 in b.times.get(kind, {}))
        rows.append([stem, len(profile.blocks), f"{total * 1e3:.2f}", f"{time.perf_counter() - began:.0f}"])
        check.figures.setdefault("profiles", []).append(
            str(target.relative_to(check.out)) if target.is_relative_to(check.out) else str(target)
        )
    check.table(
        f"{dtype}: HF models profiled here",
        ["model", "blocks", "fwd+bwd at micro-batch 1, ms", "seconds to profile"],
        rows,
    )
    check.headline = "; ".join(f"{r[0]} {r[1]} blocks, {r[2]} ms/sample" for r in rows)


def _print_rank_logs(message: str, lines: int = 25) -> None:
    """The last lines of each rank's log named in a launch error (``rank logs: DIR``)."""
    import re

    found = re.search(r"rank logs: ([^)\s]+)", message)
    if not found or not Path(found.group(1)).is_dir():
        return
    for log in sorted(Path(found.group(1)).rglob("*.log")):
        if log.is_file():
            print(f"--- {log.name}", *_tail(log, lines), sep="\n", flush=True)


def section_sync_fp16(check: Check) -> None:
    """Each sync mode, 2 pipelines sharing the GPU in fp16 (SGD: a scale error would show), with an
    overflow forced on rank 1 at step 1 (``HETPLAN_TEST_OVERFLOW``): every rank whose update depends
    on it skips that step and halves its loss scale; WSP at staleness 0 with one-step waves is the
    all-reduce run."""
    import math

    from hetplan.contracts.plan import Pipeline, Plan

    profile = _train_profile(check, "fp16")
    n = len(profile.blocks)
    modes = {
        "allreduce": {},
        "wsp": {"staleness": 0, "wave": 1},
        "topk": {"ratio": 0.05},
        "adasum": {},
        "sdpipe": {},
    }
    rows, losses = [], {}
    for sync, options in modes.items():
        pipelines = [Pipeline(GLOBAL_BATCH // 2, (2, 2), (_stage(0, n, f"n0/{i}"),)) for i in range(2)]
        plan = Plan(GLOBAL_BATCH, pipelines, dtype="fp16", optimizer="sgd", sync=sync, sync_options=options)
        for forced in (False, True):
            if forced:
                os.environ["HETPLAN_TEST_OVERFLOW"] = "1:1"
            else:
                os.environ.pop("HETPLAN_TEST_OVERFLOW", None)
            name = f"fp16-{sync}-{'overflow' if forced else 'clean'}"
            try:
                records, _ = _launch(check, plan, profile, check.cluster(2), name=name, steps=3)
            except Exception as exc:  # one mode failing must not hide the others: record, go on
                check.expect(False, f"{name}: {exc}"[:300])
                rows.append([sync, "overflow" if forced else "none", "failed", str(exc)[:200]])
                _print_rank_logs(str(exc))
                continue
            devices = [r for r in records if r.get("device") != "central"]
            _on_expected_device(check, devices, name)
            skipped = {s: sorted({bool(r.get("skipped_step")) for r in devices if r["step"] == s}) for s in range(3)}
            # the job's loss: every mode's merged run log gives the global batch's on each line
            mine = [statistics.fmean(r["loss"] for r in devices if r["step"] == s) for s in range(3)]
            if not forced:
                losses[sync] = mine
                ok = all(math.isfinite(x) for x in mine) and skipped == {0: [False], 1: [False], 2: [False]}
            elif sync == "sdpipe":  # each pipeline steps on its own gradients: only rank 1's skips
                ok = skipped[1] == [False, True] and skipped[2] == [False]
            else:
                ok = skipped == {0: [False], 1: [True], 2: [False]}
            check.expect(ok, f"{name}: skipped per step {skipped}, losses {mine}")
            rows.append([sync, "overflow at step 1 on rank 1" if forced else "none", str(skipped), mine])
    os.environ.pop("HETPLAN_TEST_OVERFLOW", None)
    if "wsp" not in losses or "allreduce" not in losses:
        check.table("fp16, SGD, 2 pipelines sharing the device", ["sync", "forced", "skipped per step", "losses"], rows)
        return
    wsp_diff = max(abs(a - b) for a, b in zip(losses["wsp"], losses["allreduce"], strict=True))
    check.expect(wsp_diff <= SAME_DEVICE_TOLERANCE, f"wsp (staleness 0, waves of 1) vs all-reduce: {wsp_diff:.2e}")
    check.table("fp16, SGD, 2 pipelines sharing the device", ["sync", "forced", "skipped per step", "losses"], rows)
    check.figures.update(wsp_vs_allreduce=wsp_diff, losses=losses)
    check.headline = (
        f"{sum(1 for r in rows)} runs; overflow skipped as expected: {not check.failures}; "
        f"wsp D=0 vs all-reduce {wsp_diff:.1e}"
    )


# --------------------------------------------------------------------------- dispatch
def _section_functions() -> dict[str, Callable[[Check], None]]:
    table: dict[str, Callable[[Check], None]] = {
        "environment": section_environment,
        "probe": section_probe,
        "nccl-collectives": section_nccl_collectives,
        "nccl-runtime": section_nccl_runtime,
    }
    for dtype in ("fp32", "bf16", "fp16"):
        table[f"profile-{dtype}"] = lambda c, d=dtype: section_profile(c, d)
    for structure in ("2stage", "2pipe"):
        for dtype in ("fp16", "bf16"):
            table[f"train-{structure}-{dtype}"] = lambda c, s=structure, d=dtype: section_train(c, s, d)
    for sync in SYNC_OPTIONS:
        table[f"sync-{sync}"] = lambda c, s=sync: section_sync(c, s)
    table["hf-train-gpt2"] = section_hf_train
    table["checkpoint-bf16"] = lambda c: section_checkpoint(c, "bf16")
    table["hf-profile-bf16"] = lambda c: section_hf_profile(c, "bf16")
    table["sync-fp16"] = section_sync_fp16
    return table


def main_child(args: argparse.Namespace) -> int:
    check = Check(args)
    result: dict[str, Any]
    try:
        _section_functions()[args.child](check)
        status = "pass" if not check.failures else "fail"
        result = {"status": status}
        if check.failures:
            result["error"] = "; ".join(check.failures)[:1000]
    except Exception as exc:
        traceback.print_exc()
        result = {"status": "fail", "error": f"{type(exc).__name__}: {exc}"[:1000]}
    result.update(figures=check.figures, tables=check.tables, notes=check.notes, headline=check.headline)
    (Path(args.work) / f"{args.child}.json").write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="Root to write results under (default: this checkout).")
    parser.add_argument("--cpu", action="store_true", help="Every section on the CPU, tiny sizes, gloo for NCCL.")
    parser.add_argument("--sections", default=None, help=f"Comma-separated subset of: {', '.join(SECTION_NAMES)}.")
    parser.add_argument(
        "--budget", type=float, default=None, help=f"Total seconds (GPU default {DEFAULT_BUDGET_S:.0f})."
    )
    parser.add_argument("--python", default=None, help="The interpreter for the sections (default: this one).")
    parser.add_argument("--work", default=None, help="Scratch folder (default: a new temporary one).")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return main_child(args) if args.child else main_parent(args)


if __name__ == "__main__":
    sys.exit(main())
