"""hetplan's command line: parse, call one function in ``planner``, print with rich.

Every bad input ends in one line ``error: FILE: FIELD: reason`` and exit code 2.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from hetplan import __version__
from hetplan.errors import HetplanError

# Piped output (CI logs, files) gets wide tables instead of rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)


def _print_all(items: list[Any]) -> None:
    from hetplan.views import print_all

    print_all(console, items)


def _progress(label: str, target: Console, *, info: bool = False) -> Any:
    """A progress bar (label, bar, done/total, elapsed; with ``info``, a task's ``info`` field
    after them) shown only on a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        *([TextColumn("{task.fields[info]}")] if info else []),
        console=target,
        transient=True,
        disable=not target.is_terminal,
    )


def _step_lines(bar: Any, task: Any, log_every: int) -> Any:
    """``launch``'s ``on_step``: each finished step's figures beside the bar on a terminal; elsewhere
    (nohup, SLURM, CI) a line every ``log_every`` steps and the last."""

    def on_step(line: Any) -> None:  # a hetplan.runtime.processes.watch.StepLine
        bar.update(task, info=line.figures())
        if not console.is_terminal and (line.done % log_every == 0 or line.done == line.steps):
            console.print(line.text(), markup=False, highlight=False)

    return on_step


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def _csv(value: str | None, *, param: str) -> list[str]:
    if value is None:
        return []
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise HetplanError(f"expected a comma-separated list, got {value!r}", field=param)
    return items


def _csv_ints(value: str, *, param: str, ordered: bool = False) -> tuple[int, ...]:
    """Positive integers, comma-separated: sorted and unique (sizes), or as given (``ordered``: a shape)."""
    out = []
    for item in _csv(value, param=param):
        if not item.isdigit() or int(item) < 1:
            example = "3,224,224" if ordered else "1,2,4,8"
            raise HetplanError(f"expected positive integers such as {example}, got {item!r}", field=param)
        out.append(int(item))
    return tuple(out) if ordered else tuple(sorted(set(out)))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="hetplan")
def cli() -> None:
    """Plan and run hybrid pipeline + data parallel training on heterogeneous GPU clusters.

    \b
    Example, end to end on bundled defaults:
      hetplan demo
    """


# --------------------------------------------------------------------------- devices
@cli.command()
@click.option("--catalog", type=click.Path(dir_okay=False), help="A device catalog file (default: the bundled one).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def devices(catalog: str | None, as_json: bool) -> None:
    """List the device catalog: memory, bandwidth and dense peak TFLOP/s per dtype.

    \b
    Example:
      hetplan devices
    """
    from hetplan.contracts.catalog import load_catalog
    from hetplan.views.contracts import renderables, summary

    loaded = load_catalog(catalog)
    if as_json:
        _print_json(summary("catalog", loaded))
    else:
        _print_all(renderables("catalog", loaded))


# --------------------------------------------------------------------------- probe
@cli.command()
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Cluster file to write.")
@click.option("--name", default=None, help="The node's name in the entry (default: this host's name).")
@click.option("--seconds", default=0.2, show_default=True, type=click.FloatRange(min=0.01), help="Seconds per figure.")
@click.option("--long", "long_run", is_flag=True, help="Larger matrices and copies: steadier figures, slower.")
@click.option("--network", default="100Gbps", show_default=True, help="Inter-node link to write (not measured).")
@click.option("--cpu", "force_cpu", is_flag=True, help="Describe the CPU even where a GPU is present.")
@click.option("--json", "json_file", default=None, type=click.Path(dir_okay=False), help="Also write every figure.")
def probe(
    output: str, name: str | None, seconds: float, long_run: bool, network: str, force_cpu: bool, json_file: str | None
) -> None:
    """Measure this node (GPUs in PCI order, matmul TFLOP/s per dtype, copy bandwidths) and write
    its cluster entry; print where it differs from the catalog by more than 20%.

    \b
    Example:
      hetplan probe -o node0.yaml --name node0 --json node0.probe.json
    """
    from hetplan.probe import probe_node

    result = probe_node(seconds=seconds, long=long_run, name=name, network=network, force_cpu=force_cpu)
    result.write(output)
    if json_file:
        result.write_json(json_file)
    for line in result.differences:
        err_console.print(f"note: {line}", markup=False)
    console.print(f"wrote {output}: {result.summary()}", markup=False)


# --------------------------------------------------------------------------- profile
def _family_options(func: Any) -> Any:
    """One option per model setting any family knows (--layers, --hidden, ...)."""
    from hetplan.profile.analytic import FAMILIES

    keys: dict[str, Any] = {}
    for family in FAMILIES.values():
        for key, default in family.defaults.items():
            keys.setdefault(key, type(default))
    for key in sorted(keys, reverse=True):
        kind = keys[key]
        option_type = click.INT if kind is int else (click.FLOAT if kind is float else click.STRING)
        func = click.option(
            f"--{key.replace('_', '-')}",
            key,
            type=option_type,
            default=None,
            help=f"Model setting '{key}' (families that have it).",
        )(func)
    return func


@cli.command()
@click.argument("family", metavar="MODEL")
@_family_options
@click.option("--analytic", is_flag=True, help="Estimate from FLOPs and bytes against the catalog (no torch).")
@click.option("--devices", "device_list", default=None, help="Device types for --analytic, comma-separated.")
@click.option(
    "--device",
    "run_device",
    default="cpu",
    show_default=True,
    type=click.Choice(["cpu", "cuda"]),
    help="Where to measure (without --analytic).",
)
@click.option("--device-type", default=None, help="Catalog name of the measuring device (default: detected).")
@click.option("--estimate-for", default=None, help="Also estimate times for these catalog types (roofline ratio).")
@click.option("--input-shape", default=None, help="Per-sample input shape of a module:factory model, e.g. 3,224,224.")
@click.option("--kwargs", "factory_kwargs", default=None, help="Arguments of a module:factory model, e.g. width=64.")
@click.option("--repeat", default=5, show_default=True, type=click.IntRange(min=1), help="Timed runs per size.")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(min=0), help="Untimed runs first.")
@click.option(
    "--threads",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Torch threads while measuring (1 matches each rank of 'hetplan launch').",
)
@click.option("--dtype", default="fp32", type=click.Choice(["fp32", "tf32", "fp16", "bf16"]), show_default=True)
@click.option("--micro-batches", default="1,2,4,8", show_default=True, help="Micro-batch sizes to time.")
@click.option(
    "--tensor-parallel",
    "tp_degrees",
    default="1",
    show_default=True,
    help="Measured profiles: tensor-parallel degrees to time each block at, e.g. 1,2,4 (--analytic: 1,2,4,8).",
)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Profile file to write.")
def profile(
    family: str,
    analytic: bool,
    device_list: str | None,
    run_device: str,
    device_type: str | None,
    estimate_for: str | None,
    input_shape: str | None,
    factory_kwargs: str | None,
    repeat: int,
    warmup: int,
    threads: int,
    dtype: str,
    micro_batches: str,
    tp_degrees: str,
    output: str,
    **settings: Any,
) -> None:
    """Profile a model's per-block costs into a model-profile YAML file: measured here (torch), or
    estimated with --analytic. MODEL is a zoo family (gpt, bert, resnet, vgg, mlp) or module:factory.

    \b
    Examples:
      hetplan profile gpt --layers 12 --hidden 768 --heads 12 --seq 256 --micro-batches 1,2,4,8 \\
          --estimate-for A100-80GB,V100-16GB -o gpt.profile.yaml
      hetplan profile mymodels:build --input-shape 3,224,224 --kwargs width=64 -o mine.yaml
      hetplan profile gpt --layers 12 --hidden 768 --analytic --devices A100-80GB,T4 -o gpt.yaml
    """
    from hetplan.profile.request import analytic_request, measure_request, model_section, summary_lines

    config = {k: v for k, v in settings.items() if v is not None}
    sizes = _csv_ints(micro_batches, param="--micro-batches")
    if analytic:
        names = _csv(device_list, param="--devices") or ["A100-80GB"]
        result = analytic_request(family, config, names, dtype=dtype, micro_batches=sizes)
    else:
        shape = _csv_ints(input_shape, param="--input-shape", ordered=True) if input_shape else None
        model = model_section(family, config, factory_kwargs=_parse_kwargs(factory_kwargs), input_shape=shape)
        with _progress(f"measuring on {run_device}", err_console) as bar:
            task = bar.add_task("measure", total=None)
            result = measure_request(
                model,
                micro_batches=sizes,
                device=run_device,
                dtype=dtype,
                threads=threads,
                warmup=warmup,
                repeat=repeat,
                estimate_for=_csv(estimate_for, param="--estimate-for"),
                tensor_parallel=tuple(_csv_ints(tp_degrees, param="--tensor-parallel")),
                device_type=device_type,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )
    result.save(output)
    notes, line = summary_lines(result, output)
    for note in notes:
        err_console.print(f"note: {note}", markup=False)
    console.print(line)


def _parse_kwargs(text: str | None, *, param: str = "--kwargs") -> dict[str, Any]:
    """``width=64,act=relu`` -> {"width": 64, "act": "relu"} (ints and floats recognised)."""
    out: dict[str, Any] = {}
    for item in _csv(text, param=param) if text else []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise HetplanError(f"expected key=value, got {item!r}", field=param)
        value: Any = raw.strip()
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                continue
        out[key.strip()] = value
    return out


# --------------------------------------------------------------------------- import
@cli.group(name="import")
def import_() -> None:
    """Import another planner's real per-layer profile (PipeDream, Sailor, Piper).

    \b
    Example:
      hetplan import sailor ../shared/external/sailor/profiles.json --model OPT-350 -o opt350.yaml
    """


def _save_import(result: Any, output: str, estimate_for: str | None = None) -> None:
    if estimate_for:
        from hetplan.contracts.catalog import load_catalog
        from hetplan.profile.carry import carry_times

        catalog = load_catalog()
        targets = [catalog.get(n, field="--estimate-for") for n in _csv(estimate_for, param="--estimate-for")]
        result = carry_times(result, result.device_types()[0], targets, catalog=catalog)
    result.save(output)
    console.print(f"wrote {output}: {len(result.blocks)} blocks, device types {', '.join(result.device_types())}")


@import_.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--device-type", default="V100-16GB", show_default=True, help="GPU the graph was profiled on.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Profiled batch (inferred if omitted).")
@click.option("--estimate-for", default=None, help="Also estimate times for these types (roofline ratio).")
@click.option(
    "--drop-input-time",
    is_flag=True,
    help="Zero the data-loading time PipeDream books on the Input node (its own optimizer does).",
)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False))
def pipedream(
    file: str, device_type: str, batch_size: int | None, estimate_for: str | None, drop_input_time: bool, output: str
) -> None:
    """Import a PipeDream graph.txt.

    \b
    Example:
      hetplan import pipedream ../shared/external/pipedream/vgg16.graph.txt -o vgg16.yaml
    """
    from hetplan.profile.importers import import_pipedream

    _save_import(
        import_pipedream(file, device_type=device_type, batch_size=batch_size, drop_input_time=drop_input_time),
        output,
        estimate_for,
    )


@import_.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--model", required=True, help="Model in the file, for example OPT-350.")
@click.option("--gpu-types", default=None, help="GPU types to take, comma-separated (default: all in the file).")
@click.option(
    "--training-config",
    type=click.Path(dir_okay=False),
    default=None,
    help="Sailor training config (default: the matching training_config_*.json beside FILE).",
)
@click.option(
    "--tensor-parallel",
    type=click.IntRange(min=1),
    default=None,
    help="Import only this degree, as the base times (default: every degree the file has, in one profile).",
)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False))
def sailor(
    file: str, model: str, gpu_types: str | None, training_config: str | None, tensor_parallel: int | None, output: str
) -> None:
    """Import a Sailor profiles.json for one model.

    \b
    Example:
      hetplan import sailor ../shared/external/sailor/profiles.json --model OPT-350 -o opt350.yaml
    """
    from hetplan.profile.importers import import_sailor

    types = _csv(gpu_types, param="--gpu-types") or None
    _save_import(
        import_sailor(
            file, model=model, gpu_types=types, training_config=training_config, tensor_parallel=tensor_parallel
        ),
        output,
    )


@import_.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--device-type", default="A100-80GB", show_default=True, help="GPU the profile was measured on.")
@click.option("--variant", default="vanilla", show_default=True, help="Piper TMPC variant id.")
@click.option("--estimate-for", default=None, help="Also estimate times for these types (roofline ratio).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False))
def piper(file: str, device_type: str, variant: str, estimate_for: str | None, output: str) -> None:
    """Import a Piper JSON profile.

    \b
    Example:
      hetplan import piper ../shared/external/piper/bert32a100.json -o bert32.yaml
    """
    from hetplan.profile.importers import import_piper

    _save_import(import_piper(file, device_type=device_type, variant=variant), output, estimate_for)


# --------------------------------------------------------------------------- validate / show
@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path())
def validate(files: tuple[str, ...]) -> None:
    """Check contract files (catalog, cluster, profile, plan, run log); a plan is also checked
    against the profile and cluster it names.

    \b
    Example:
      hetplan validate profiles/devices.yaml profiles/clusters/*.yaml
    """
    from hetplan.contracts.anyfile import load_any
    from hetplan.contracts.plan import check_plan, load_plan_inputs

    failures = 0
    for path in files:
        try:
            kind, obj = load_any(path)
            if kind == "plan":
                profile_, cluster_ = load_plan_inputs(obj)
                check_plan(obj, cluster_, profile_)
        except HetplanError as exc:
            failures += 1
            err_console.print(f"error: {exc}", markup=False)
            continue
        click.echo(f"ok    {path}  ({kind})")
    if failures:
        raise SystemExit(2)


@cli.command()
@click.argument("file", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def show(file: str, as_json: bool) -> None:
    """Show any contract file as a table a person reads (or JSON with --json).

    \b
    Example:
      hetplan show profiles/clusters/mixed-a100-v100.yaml
    """
    from hetplan.contracts.anyfile import load_any
    from hetplan.views.contracts import renderables, summary

    kind, obj = load_any(file)
    if as_json:
        data = summary(kind, obj)
        if kind == "plan":
            from hetplan.contracts.plan import readable_plan_inputs
            from hetplan.views.cost import step_cost
            from hetplan.views.plan import plan_band

            inputs = readable_plan_inputs(obj)
            data["band"] = plan_band(obj, *inputs).to_dict() if inputs else None
            iteration_s = (obj.predicted or {}).get("iteration_s")
            data["cost"] = step_cost(iteration_s, obj.global_batch, inputs[1].price_per_hour) if inputs else None
        _print_json(data)
    elif kind == "plan":
        from hetplan.contracts.plan import check_plan, load_plan_inputs
        from hetplan.views.plan import plan_summary_renderables

        loaded_profile, loaded_cluster = load_plan_inputs(obj)
        check_plan(obj, loaded_cluster, loaded_profile)
        _print_all(plan_summary_renderables(obj, loaded_cluster, loaded_profile))
    else:
        _print_all(renderables(kind, obj))


# --------------------------------------------------------------------------- plan / compare
@cli.command()
@click.argument("profile_file", metavar="PROFILE", type=click.Path(dir_okay=False))
@click.argument("cluster_file", metavar="CLUSTER", type=click.Path(dir_okay=False))
@click.option("--batch", "global_batch", required=True, type=click.IntRange(min=1), help="Global batch (samples).")
@click.option("--schedule", default="1f1b", show_default=True, type=click.Choice(["1f1b", "gpipe"]))
@click.option("--optimizer", default="adam", show_default=True, type=click.Choice(["sgd", "momentum", "adam", "adamw"]))
@click.option(
    "--dtype",
    default=None,
    type=click.Choice(["fp32", "tf32", "fp16", "bf16"]),
    help="Must match the profile's dtype (times are per dtype); default: the profile's.",
)
@click.option("--micro-batch-sizes", default=None, help="Micro-batch sizes to consider (default 1,2,4,...,64).")
@click.option("--max-stages", default=16, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--sync",
    default="allreduce",
    show_default=True,
    type=click.Choice(["allreduce", "adasum", "topk", "wsp", "sdpipe"]),
    help="How pipelines combine gradients (docs/sync-modes.md); candidates are scored under it.",
)
@click.option("--sync-option", "sync_option", multiple=True, help="The mode's option KEY=VALUE, e.g. staleness=2.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Plan file to write.")
def plan(
    profile_file: str,
    cluster_file: str,
    global_batch: int,
    schedule: str,
    optimizer: str,
    dtype: str | None,
    micro_batch_sizes: str | None,
    max_stages: int,
    sync: str,
    sync_option: tuple[str, ...],
    output: str,
) -> None:
    """Search for the fastest hybrid pipeline + data parallel plan on a heterogeneous cluster.

    \b
    Example:
      hetplan plan gpt.profile.yaml profiles/clusters/mixed-a100-v100.yaml --batch 512 -o plan.yaml
    """

    from hetplan.contracts.cluster import load_cluster
    from hetplan.contracts.model_profile import load_profile
    from hetplan.solve import PlanOptions, finalize_plan, plan_training
    from hetplan.views.plan import plan_summary_renderables

    loaded_profile = load_profile(profile_file)
    loaded_cluster = load_cluster(cluster_file)
    if dtype is not None and dtype != loaded_profile.dtype:
        raise HetplanError(
            f"the profile was made for {loaded_profile.dtype}, not {dtype}; re-profile with --dtype {dtype}",
            file=profile_file,
            field="dtype",
        )
    sizes = _csv_ints(micro_batch_sizes, param="--micro-batch-sizes") if micro_batch_sizes else None
    opts = PlanOptions(
        global_batch=global_batch,
        schedule=schedule,
        optimizer=optimizer,
        micro_batch_sizes=sizes,
        max_stages=max_stages,
        sync=sync,
        sync_options=_parse_kwargs(",".join(sync_option), param="--sync-option") if sync_option else {},
    )
    with _progress("searching structures", err_console) as bar:
        task = bar.add_task("search", total=None)
        result = plan_training(
            loaded_profile,
            loaded_cluster,
            opts,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    final = finalize_plan(
        result,
        profile_path=profile_file,
        cluster_path=cluster_file,
        output=output,
        cluster=loaded_cluster,
        dtype=loaded_profile.dtype,
    )
    final.save(output)
    _print_all(plan_summary_renderables(final, loaded_cluster, loaded_profile))
    console.print(f"wrote {output}")


#: hetplan.solve.whatif.OBJECTIVES, spelled out so the CLI imports no solver at start (a test checks they agree)
WHAT_IF_OBJECTIVES = (
    "fastest",
    "cheapest-per-step",
    "cheapest-per-sample",
    "cheapest-run",
    "cheapest-meeting",
    "fastest-within-budget",
)


@cli.command(name="what-if")
@click.argument("profile_file", metavar="PROFILE", type=click.Path(dir_okay=False))
@click.argument("cluster_file", metavar="CLUSTER", type=click.Path(dir_okay=False))
@click.option("--batch", "global_batch", required=True, type=click.IntRange(min=1), help="Global batch (samples).")
@click.option("--pool", default=None, type=click.Path(dir_okay=False), help="Nodes one may add (hetplan/pool/v1).")
@click.option("--objective", default="fastest", show_default=True, type=click.Choice(list(WHAT_IF_OBJECTIVES)))
@click.option("--min-samples-per-s", type=click.FloatRange(min=0, min_open=True), help="Throughput to meet.")
@click.option("--deadline-hours", type=click.FloatRange(min=0, min_open=True), help="Finish the run within this.")
@click.option("--samples", type=click.IntRange(min=1), help="Samples in the run ($/run, deadline).")
@click.option("--tokens", type=click.IntRange(min=1), help="Tokens in the run (samples = tokens / seq).")
@click.option("--budget-per-hour", type=click.FloatRange(min=0), help="Most $ per hour the cluster may cost.")
@click.option("--max-plans", default=64, show_default=True, type=click.IntRange(min=1), help="Stop after N plans.")
@click.option("--ladder", default=0, type=click.IntRange(min=0), help="Kinds over this many nodes: count ladder.")
@click.option("--no-marginals", is_flag=True, help="Skip planning one node more and less of each kind.")
@click.option("--micro-batch-sizes", default=None, help="Micro-batch sizes to consider (default 1,2,4,...,64).")
@click.option("--pareto", default=None, type=click.Path(dir_okay=False), help="Pareto front picture (.svg or .png).")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Folder to write the files to.")
def what_if(profile_file: str, cluster_file: str, pareto: str | None, no_marginals: bool, **options: Any) -> None:
    """Which nodes to add, drop or rent: the best plan per candidate cluster, priced, and the chosen one.

    \b
    Example:
      hetplan what-if gpt.yaml cluster.yaml --pool pool.yaml --batch 1024 --objective cheapest-per-step -o wi/
    """
    from hetplan.solve.whatif_job import WhatIfRequest, run_what_if
    from hetplan.views.whatif import pareto_png, pareto_svg, what_if_renderables

    sizes = options.pop("micro_batch_sizes")
    req = WhatIfRequest(
        profile=profile_file,
        cluster=cluster_file,
        marginals=not no_marginals,
        micro_batch_sizes=_csv_ints(sizes, param="--micro-batch-sizes") if sizes else None,
        **options,
    )
    with _progress("planning candidates", err_console) as bar:
        task = bar.add_task("what-if", total=None)
        summary, written = run_what_if(req, progress=lambda n, _counts: bar.update(task, completed=n))
    _print_all(what_if_renderables(summary))
    if pareto:
        picture = pareto_png(summary) if pareto.endswith(".png") else pareto_svg(summary).encode()
        Path(pareto).write_bytes(picture)
        written["pareto"] = Path(pareto)
    console.print("wrote " + ", ".join(str(p) for p in written.values()))


@cli.command()
@click.argument("plan_file", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option(
    "--with", "others", multiple=True, type=click.Path(dir_okay=False), help="Another plan of the same inputs."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--sync-modes",
    is_flag=True,
    help="Instead: the plan's pipelines under every sync mode (allreduce, wsp, sdpipe, adasum, topk), per step.",
)
@click.option(
    "--sync-option",
    "sync_option",
    multiple=True,
    metavar="KEY=VALUE",
    help="With --sync-modes: an option for the modes that take it (e.g. ratio=0.05, staleness=2).",
)
@click.option(
    "--ignore-memory",
    is_flag=True,
    help="Time the plan and --with plans the memory check refuses, showing by how much each device is over.",
)
def compare(
    plan_file: str,
    others: tuple[str, ...],
    as_json: bool,
    sync_modes: bool,
    sync_option: tuple[str, ...],
    ignore_memory: bool,
) -> None:
    """Put a plan beside every baseline (uniform split, DeepSpeed, torchgpipe, homogeneous planners,
    data parallel) and any other plans of the same inputs (--with, e.g. an export), all scored by the
    same simulator, as ratios; or (--sync-modes) its pipelines under every sync mode side by side.

    \b
    Example:
      hetplan compare plan.yaml
      hetplan compare plan.yaml --with megatron/exported-plan.yaml
      hetplan compare plan.yaml --sync-modes --sync-option ratio=0.05
      hetplan compare plan.yaml --with big.yaml --ignore-memory
    """
    from hetplan.contracts.plan import load_plan, load_plan_inputs
    from hetplan.solve.compare import compare_rows, same_inputs, sync_mode_rows
    from hetplan.views.plan import compare_table, sync_table, with_bands

    loaded = load_plan(plan_file)
    loaded_profile, loaded_cluster = load_plan_inputs(loaded)
    if sync_modes:
        options = _parse_kwargs(",".join(sync_option), param="--sync-option") if sync_option else {}
        rows = sync_mode_rows(loaded, loaded_profile, loaded_cluster, options=options)
        if as_json:
            _print_json(rows)
        else:
            console.print(sync_table(rows))
        return
    extra = {_other_plan_name(o): same_inputs(load_plan(o), loaded) for o in others}
    rows = compare_rows(loaded, loaded_profile, loaded_cluster, others=extra, ignore_memory=ignore_memory)
    rows = with_bands(rows, loaded, loaded_profile, loaded_cluster)
    if as_json:
        from hetplan.views.cost import with_costs

        _print_json(with_costs(rows, loaded.global_batch, loaded_cluster.price_per_hour))
    else:
        from hetplan.units import format_bytes

        price = loaded_cluster.price_per_hour
        console.print(compare_table(rows, usd_per_hour=price, global_batch=loaded.global_batch))
        for r in rows:
            for address, over in (r.get("over") or {}).items():
                console.print(f"{r['name']}: {address} is {format_bytes(over)} over its memory", markup=False)


def _other_plan_name(path: str) -> str:
    """A --with plan's row name: its folder (or file stem), and the runtime an export was made for."""
    from hetplan.contracts.plan import load_plan

    name = Path(path).parent.name or Path(path).stem
    runtime = (load_plan(path).details or {}).get("exported_for")
    return f"{runtime} export ({name})" if runtime else name


# --------------------------------------------------------------------------- simulate
@cli.command()
@click.argument("plan_files", metavar="PLAN [PLAN_B]", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option(
    "--profile",
    "profile_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Use this profile instead of the one the plan names.",
)
@click.option(
    "--cluster",
    "cluster_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Use this cluster instead of the one the plan names.",
)
@click.option(
    "--timeline",
    type=click.Path(dir_okay=False),
    default=None,
    help="Draw the iteration to FILE.svg (or FILE.png, with the [png] extra: matplotlib).",
)
@click.option(
    "--trace",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the iteration as a Chrome trace FILE.json: open it in Perfetto (ui.perfetto.dev) or chrome://tracing.",
)
@click.option(
    "--together",
    is_flag=True,
    help="Co-simulate PLAN and PLAN_B on the same GPUs (same cluster; docs/co-scheduling.md).",
)
@click.option(
    "--policy",
    default="first-come",
    show_default=True,
    type=click.Choice(["crossover", "first-come"]),
    help="With --together: which job computes next on a shared device (first-come: what `launch A B` runs).",
)
@click.option(
    "--iterations",
    default=6,
    show_default=True,
    type=click.IntRange(min=1),
    help="With --together: iterations of the slower job (the steady state leaves out the first third).",
)
@click.option(
    "--ignore-memory",
    is_flag=True,
    help="Time a plan the memory check refuses, showing by how much each device is over.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def simulate(
    plan_files: tuple[str, ...],
    profile_file: str | None,
    cluster_file: str | None,
    timeline: str | None,
    trace: str | None,
    together: bool,
    policy: str,
    iterations: int,
    ignore_memory: bool,
    as_json: bool,
) -> None:
    """Simulate one training iteration of a plan: time, bubble, memory, critical path. With
    --together, two plans' jobs sharing the GPUs: each job's steady-state iteration alone and
    together, the combined samples/s, and the timeline with a row per device and job.

    \b
    Examples:
      hetplan simulate plan.yaml --timeline plan.svg
      hetplan simulate plan.yaml --trace plan.trace.json    # one event per task, for Perfetto
      hetplan simulate plan.yaml --ignore-memory            # time it even where a device is over
      hetplan simulate a.yaml b.yaml --together --policy crossover --timeline co.svg
    """
    if together or len(plan_files) > 1:
        together_args = (plan_files, together, policy, iterations, profile_file or cluster_file)
        _simulate_together(*together_args, timeline=timeline, trace=trace, as_json=as_json)
        return
    plan_file = plan_files[0]
    from hetplan.contracts.plan import load_plan, load_plan_inputs
    from hetplan.simulate import check_memory
    from hetplan.simulate import simulate as run_simulation
    from hetplan.simulate.timeline import check_timeline_path, write_timeline
    from hetplan.simulate.trace import check_trace_path, write_trace
    from hetplan.views import plan_is_emulated
    from hetplan.views.simulation import simulation_renderables

    if timeline:  # a file that cannot be written fails before the simulation, not after
        check_timeline_path(timeline)
    if trace:
        check_trace_path(trace)
    plan = load_plan(plan_file)
    loaded_profile, loaded_cluster = load_plan_inputs(plan, profile=profile_file, cluster=cluster_file)
    drawn = timeline is not None or trace is not None
    result = run_simulation(plan, loaded_profile, loaded_cluster, timeline=drawn)
    if not ignore_memory:
        check_memory(result, plan)
    title = f"{Path(plan_file).name} on {loaded_cluster.name}"
    if timeline:
        write_timeline(result, timeline, title=title, cluster=loaded_cluster)
    if trace:
        write_trace(result, trace, cluster=loaded_cluster, title=title)
    if as_json:
        _print_json(result.to_json())
        return
    _print_all(simulation_renderables(result, emulated=plan_is_emulated(plan, loaded_cluster)))
    if timeline:
        console.print(f"timeline written to {timeline}")
    if trace:
        console.print(f"trace written to {trace} (open it in https://ui.perfetto.dev)")


def _simulate_together(
    plan_files: tuple[str, ...],
    together: bool,
    policy: str,
    iterations: int,
    overridden: str | None,
    *,
    timeline: str | None,
    trace: str | None,
    as_json: bool,
) -> None:
    """``simulate PLAN_A PLAN_B --together``: the co-simulation, printed."""
    from hetplan.simulate.together_files import co_simulate_files
    from hetplan.views import plan_is_emulated
    from hetplan.views.together import together_renderables

    if not together:
        raise HetplanError("two plans are simulated only together: add --together (or give one plan)", field="PLAN")
    if overridden:
        raise HetplanError("--profile and --cluster replace one plan's inputs; not with --together", field="--together")
    result, jobs = co_simulate_files(plan_files, policy=policy, iterations=iterations, timeline=timeline, trace=trace)
    if as_json:
        _print_json(result.to_json())
        return
    emulated = any(plan_is_emulated(j.plan, j.cluster) for j in jobs)
    _print_all(together_renderables(result, emulated=emulated))
    if timeline:
        console.print(f"timeline written to {timeline}")
    if trace:
        console.print(f"trace written to {trace} (open it in https://ui.perfetto.dev)")


@cli.command(name="co-plan")
@click.argument("profile_a", metavar="PROFILE_A", type=click.Path(dir_okay=False))
@click.argument("profile_b", metavar="PROFILE_B", type=click.Path(dir_okay=False))
@click.argument("cluster_file", metavar="CLUSTER", type=click.Path(dir_okay=False))
@click.option("--batch-a", required=True, type=click.IntRange(min=1), help="Job A's global batch (samples).")
@click.option("--batch-b", required=True, type=click.IntRange(min=1), help="Job B's global batch (samples).")
@click.option(
    "--fairness",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="Neither job's co-run iteration may exceed X times its solo plan's (its best plan alone on the cluster).",
)
@click.option(
    "--policy",
    default="first-come",
    show_default=True,
    type=click.Choice(["both", "crossover", "first-come"]),
    help="Co-schedule policies to try on shared devices (first-come: what `launch A B` runs).",
)
@click.option(
    "--iterations",
    default=6,
    show_default=True,
    type=click.IntRange(min=1),
    help="Iterations of the slower job in each co-simulation.",
)
@click.option("--schedule", default="1f1b", show_default=True, type=click.Choice(["1f1b", "gpipe"]))
@click.option("--optimizer", default="adam", show_default=True, type=click.Choice(["sgd", "momentum", "adam", "adamw"]))
@click.option("-o", "--output-dir", required=True, type=click.Path(file_okay=False), help="Folder to write.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def co_plan(
    profile_a: str,
    profile_b: str,
    cluster_file: str,
    batch_a: int,
    batch_b: int,
    fairness: float,
    policy: str,
    iterations: int,
    schedule: str,
    optimizer: str,
    output_dir: str,
    as_json: bool,
) -> None:
    """Plan two training jobs for the same GPUs: both plans and their co-schedule, for the most
    combined samples/s with neither job's co-run iteration above --fairness (default 2.0) times its
    solo plan's (the job's best plan alone on the whole cluster). Printed beside the two solo plans
    one after the other, and side by side on split devices (each job planned on half of every node).
    Writes DIR/plan-a.yaml, DIR/plan-b.yaml (plan files) and DIR/summary.yaml.

    \b
    Example:
      hetplan co-plan gpt.yaml bert.yaml profiles/clusters/rtx-mix.yaml --batch-a 256 --batch-b 256 -o co/
      hetplan simulate co/plan-a.yaml co/plan-b.yaml --together --timeline co.svg
    """
    from hetplan.solve.coplan import CoPlanOptions, co_plan_files
    from hetplan.views.together import co_plan_renderables

    policies = ("crossover", "first-come") if policy == "both" else (policy,)
    opts = CoPlanOptions(batch_a, batch_b, fairness, policies, iterations, schedule=schedule, optimizer=optimizer)
    with err_console.status("co-planning") as status:
        _, written, data = co_plan_files(
            profile_a, profile_b, cluster_file, opts, output_dir, progress=lambda text: status.update(text)
        )
    if as_json:
        _print_json(data)
        return
    _print_all(co_plan_renderables(data))
    for path in written:
        console.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)


# --------------------------------------------------------------------------- export
@cli.command()
@click.argument("runtime", metavar="RUNTIME")
@click.argument("plan_file", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("-o", "--output-dir", required=True, type=click.Path(file_okay=False), help="Folder to write.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--write-anyway",
    is_flag=True,
    help="Write an export that hetplan's simulator finds does not fit in memory (refused by default).",
)
def export(runtime: str, plan_file: str, output_dir: str, as_json: bool, write_anyway: bool) -> None:
    """Write the closest configuration RUNTIME (deepspeed, megatron or torchtitan) can express: one
    pipeline shape replicated, with its layer cuts, micro-batch size and count and data-parallel
    degree. Say in one line each what it had to drop, and score it beside the plan by the simulator.

    \b
    The folder gets the runtime's files, one launch script a node, dropped.txt, and exported-plan.yaml: a
    plan file of exactly what the export expresses, on the same inputs (simulate, show, compare read it).
    An export that does not fit in memory by hetplan's simulator is refused in one line naming the rank.
    Examples:
      hetplan export megatron plan.yaml -o megatron/
      hetplan export deepspeed plan.yaml -o ds/ && hetplan simulate ds/exported-plan.yaml --trace ds.json
    """
    from hetplan.export import export_plan, export_rows, runtime_named
    from hetplan.views.plan import compare_table, plan_band

    chosen = runtime_named(runtime)  # an unknown runtime fails before any file is read
    loaded, loaded_profile, loaded_cluster = _plan_and_inputs(plan_file)
    result = export_plan(chosen.name, loaded, loaded_profile, loaded_cluster, output_dir, write_unfit=write_anyway)
    rows = export_rows(loaded, result.exported, loaded_profile, loaded_cluster, name=f"{chosen.title} export")
    rows[0]["band"] = plan_band(loaded, loaded_profile, loaded_cluster).to_dict()  # how far to trust hetplan's time
    if as_json:
        _print_json(
            {
                "runtime": chosen.name,
                "written": [str(p) for p in result.written],
                "dropped": list(result.dropped),
                "notes": result.memory_notes(),
                "compare": rows,
            }
        )
        return
    for path in result.written:
        console.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)
    for line in result.dropped:
        console.print(f"dropped: {line}", markup=False, highlight=False, soft_wrap=True)
    if not result.dropped:
        console.print(f"dropped: nothing ({chosen.title} expresses this plan as it is)")
    for line in result.memory_notes():
        console.print(f"note: {line}", markup=False, highlight=False, soft_wrap=True)
    table = compare_table(rows)
    table.title = f"Plan vs its {chosen.title} export (same inputs, same simulator)"
    console.print(table)


# --------------------------------------------------------------------------- emit / launch / report
def _plan_and_inputs(plan_file: str):
    from hetplan.contracts.plan import check_plan, load_plan, load_plan_inputs

    loaded = load_plan(plan_file)
    loaded_profile, loaded_cluster = load_plan_inputs(loaded)
    check_plan(loaded, loaded_cluster, loaded_profile)
    return loaded, loaded_profile, loaded_cluster


def _device_options() -> list[Any]:
    """Where the ranks compute, and whether a GPU of another type than the plan's is accepted."""
    return [
        click.option(
            "--compute-device",
            default=None,
            type=click.Choice(["cpu", "cuda"]),
            help="What the ranks compute on (default: cuda under nccl, cpu under gloo); cuda with gloo stages "
            "tensors through host memory, so ranks can share a GPU.",
        ),
        click.option(
            "--accept-device-mismatch",
            is_flag=True,
            help="Run a rank whose GPU is not the plan's device type (default: it stops with one line).",
        ),
    ]


def _training_options(func: Any) -> Any:
    """How the ranks train, beyond the plan (``emit`` and ``launch`` both take these)."""
    options = [
        click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0)),
        click.option("--lr", default=None, type=click.FloatRange(min=0, min_open=True), help="Learning rate."),
        click.option(
            "--optimizer",
            default=None,
            type=click.Choice(["sgd", "momentum", "adam", "adamw"]),
            help="Optimizer the ranks step (default: the plan's).",
        ),
        click.option("--weight-decay", default=None, type=click.FloatRange(min=0), help="AdamW's (default 0.01)."),
        click.option(
            "--clip-grad-norm",
            default=None,
            type=click.FloatRange(min=0, min_open=True),
            help="Clip the whole model's gradient to this 2-norm every step (as torch.nn.utils.clip_grad_norm_).",
        ),
        click.option("--warmup-steps", default=0, type=click.IntRange(min=0), help="Linear learning-rate warm-up."),
        click.option(
            "--decay-steps", default=0, type=click.IntRange(min=0), help="Cosine decay after the warm-up (0: none)."
        ),
        click.option("--min-lr", default=0.0, type=click.FloatRange(min=0), help="Floor of the cosine decay."),
        click.option(
            "--data",
            default=None,
            type=click.Path(dir_okay=False),
            help="Train a character-level language model on this text file (gpt models).",
        ),
        click.option(
            "--dataset",
            default=None,
            help="Your map-style dataset: a module:function returning (input, target) pairs; each rank reads "
            "only its samples.",
        ),
        click.option("--dataset-kwargs", default=None, help="Arguments of the --dataset function, e.g. size=1000."),
        *_device_options(),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _training(values: dict[str, Any]) -> Any:
    from hetplan.local_job import TrainingOptions

    values = dict(values)
    values["dataset_kwargs"] = _parse_kwargs(values.pop("dataset_kwargs", None))
    return TrainingOptions(**values)


@cli.command()
@click.argument("plan_file", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("-o", "--output-dir", required=True, type=click.Path(file_okay=False), help="Folder to write.")
@click.option("--master", default="node0:29500", show_default=True, help="HOST:PORT of the rendezvous (first node).")
@click.option("--steps", default=100, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--backend",
    default=None,
    type=click.Choice(["nccl", "gloo"]),
    help="Default: nccl on GPUs, gloo on a CPU-only (or emulated) cluster.",
)
@click.option("--save", default=None, help="Checkpoint folder the ranks save to (relative: to the launch folder).")
@click.option("--save-every", default=None, type=click.IntRange(min=1), help="Also save every N steps (with --save).")
@click.option("--keep-last", default=None, type=click.IntRange(min=1), help="Keep only the last K checkpoints.")
@click.option("--resume", default=None, help="Resume from this checkpoint folder's latest (or --resume-step's).")
@click.option("--resume-step", default=None, type=click.IntRange(min=0), help="The checkpoint step to resume from.")
@click.option("--skip-nonfinite", is_flag=True, help="Go on past a step whose loss is not finite (default: stop).")
@click.option(
    "--init-from",
    default=None,
    help="Weights the ranks start from, as the nodes see the path (a save_pretrained folder or a state_dict "
    "file; relative: to the launch folder).",
)
@_training_options
def emit(plan_file: str, output_dir: str, master: str, steps: int, backend: str | None, **training: Any) -> None:
    """Write launch files: the rank config, a torchrun script per node, a SLURM batch script.

    \b
    Example:
      hetplan emit plan.yaml -o launch/ --master node0.example.org:29500
      # then on each node: bash launch/node-<name>.sh
    """
    from hetplan.emit import emit_launch

    loaded, loaded_profile, loaded_cluster = _plan_and_inputs(plan_file)
    worker_keys = ("save", "save_every", "keep_last", "resume", "resume_step", "skip_nonfinite")
    worker = {k: training.pop(k) for k in worker_keys}
    options = _training(training).rank_config_kwargs()
    for path in emit_launch(
        loaded, loaded_profile, loaded_cluster, output_dir, master=master, steps=steps, backend=backend,
        **worker, **options,
    ):  # fmt: skip
        console.print(f"wrote {path}")


@cli.command()
@click.argument("plan_file", metavar="PLAN", type=click.Path(dir_okay=False))
@click.argument("plan_b_file", metavar="[PLAN_B]", required=False, default=None, type=click.Path(dir_okay=False))
@click.option("--steps", default=20, show_default=True, type=click.IntRange(min=1))
@click.option("--log", "log_file", default=None, type=click.Path(dir_okay=False), help="Run log (JSON lines).")
@click.option("--emulate", is_flag=True, help="Run each rank as its planned device type by its slowdown factor.")
@click.option(
    "--save",
    default=None,
    type=click.Path(file_okay=False),
    help="Checkpoint folder (torch.distributed.checkpoint, keyed by block): the final state, every --save-every steps.",
)
@click.option("--save-every", default=None, type=click.IntRange(min=1), help="Also save every N steps (with --save).")
@click.option("--keep-last", default=None, type=click.IntRange(min=1), help="Keep only the last K checkpoints.")
@click.option(
    "--resume",
    default=None,
    type=click.Path(file_okay=False),
    help="Resume from the folder's latest checkpoint (or --resume-step's), whatever plan saved it.",
)
@click.option("--resume-step", default=None, type=click.IntRange(min=0), help="The checkpoint step to resume from.")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(min=1), help="Torch threads per rank.")
@click.option(
    "--straggler",
    multiple=True,
    help="Emulation (with --emulate): DEVICE:FACTORx@STEP makes a device FACTOR times slower from STEP on.",
)
@click.option(
    "--log-every",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Off a terminal: print step, loss, step time and samples/s every N steps (and the last).",
)
@click.option(
    "--skip-nonfinite",
    is_flag=True,
    help="Go on past a step whose loss is not finite, skipping its update on every rank (default: stop there).",
)
@click.option(
    "--init-from",
    default=None,
    type=click.Path(exists=False),
    help="Start from these weights: a save_pretrained folder (safetensors) or a state_dict file (.pt, .safetensors); "
    "each rank reads only its blocks' tensors.",
)
@_training_options
def launch(
    plan_file: str,
    plan_b_file: str | None,
    steps: int,
    log_file: str | None,
    emulate: bool,
    save: str | None,
    save_every: int | None,
    keep_last: int | None,
    resume: str | None,
    resume_step: int | None,
    threads: int,
    straggler: tuple[str, ...],
    log_every: int,
    skip_nonfinite: bool,
    **training: Any,
) -> None:
    """Train a plan here: spawn every rank on this machine (gloo), show progress, summarise; with a
    second plan, train both jobs at once on the devices they share, taking turns at each device
    (one computes while the other communicates; docs/runtime.md), one run log per job.

    \b
    Examples:
      hetplan launch plan.yaml --steps 20 --emulate --log run.jsonl
      hetplan launch plan.yaml --steps 200 --data book.txt      # a character-level language model
      hetplan launch plan.yaml --dataset mydata:build --optimizer adamw --clip-grad-norm 1 --warmup-steps 10
      hetplan launch a.yaml b.yaml --steps 20 --emulate --log run.jsonl   # two jobs: run-a.jsonl, run-b.jsonl
    """
    from hetplan.contracts.emulation import parse_straggler
    from hetplan.local_job import crowding_warning, train_here, train_together

    stragglers = [parse_straggler(text) for text in straggler]
    if training.get("init_from") and resume:
        raise HetplanError("give --init-from (weights to start from) or --resume (a run to go on with), not both",
                           field="--init-from")  # fmt: skip
    jobs = [_plan_and_inputs(f) for f in (plan_file, plan_b_file) if f]
    label = " (EMULATED device speeds)" if emulate else ""
    ranks = sum(len(plan.all_devices()) for plan, _, _ in jobs)
    if crowded := crowding_warning([plan for plan, _, _ in jobs], threads=threads):
        err_console.print(crowded, markup=False)
    with _progress(f"training {ranks} ranks{label}", console, info=True) as bar:
        task = bar.add_task("steps", total=steps, info="")
        kwargs: dict[str, Any] = dict(
            steps=steps,
            options=_training(training),
            emulate=emulate,
            log=log_file,
            save=save,
            save_every=save_every,
            keep_last=keep_last,
            resume=resume,
            resume_step=resume_step,
            threads=threads,
            progress=lambda done, total: bar.update(task, completed=done),
            stragglers=stragglers,
            skip_nonfinite=skip_nonfinite,
        )
        if len(jobs) > 1:
            job = train_together(jobs, **kwargs)
        else:
            job = train_here(*jobs[0], **kwargs, on_step=_step_lines(bar, task, log_every))
    console.print(job.summary)
    if log_file:
        console.print(f"run log: {', '.join(str(x) for x in getattr(job, 'logs', None) or [log_file])}")


@cli.command()
@click.argument("checkpoint", metavar="CHECKPOINT", type=click.Path())
@click.option("-o", "--output-dir", required=True, type=click.Path(file_okay=False), help="Folder to write.")
@click.option("--step", default=None, type=click.IntRange(min=0), help="The checkpoint step (default: the latest).")
def consolidate(checkpoint: str, output_dir: str, step: int | None) -> None:
    """Write a run's checkpoint as the model's own state_dict (model.safetensors), and for a
    transformers model a folder from_pretrained loads, whatever plan saved it.

    \b
    Example:
      hetplan consolidate ckpt/ -o final/
    """
    from hetplan.runtime.weights.consolidate import consolidate as write

    done = write(checkpoint, output_dir, step=step)
    for path in done.files:
        console.print(f"wrote {path}")
    console.print(f"step {done.step}: {done.tensors} tensors, {done.bytes / 2**20:.1f} MiB")


@cli.command()
@click.argument("log_file", metavar="RUN_LOG", type=click.Path(dir_okay=False))
@click.argument("plan_file", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def report(log_file: str, plan_file: str, as_json: bool) -> None:
    """Put what a run measured beside what the plan predicted, per stage and in total.

    \b
    Example:
      hetplan report run.jsonl plan.yaml
    """
    from hetplan.contracts.plan import load_plan
    from hetplan.contracts.runlog import check_log_matches, load_central_records, load_run_log
    from hetplan.views.report import report_renderables, report_rows

    records, loaded = load_run_log(log_file), load_plan(plan_file)
    check_log_matches(records, loaded, log_file=log_file)
    emulated = False
    try:  # the inputs say whether the plan's devices are emulated; a report works without them
        from hetplan.contracts.plan import load_plan_inputs
        from hetplan.views import plan_is_emulated

        emulated = plan_is_emulated(loaded, load_plan_inputs(loaded)[1])
    except HetplanError:
        pass
    rows = report_rows(records, loaded, emulated_plan=emulated, central=load_central_records(log_file))
    if as_json:
        _print_json(rows)
    else:
        _print_all(report_renderables(rows))


# --------------------------------------------------------------------------- calibrate
@cli.command()
@click.argument("profile_file", metavar="PROFILE", type=click.Path(dir_okay=False))
@click.argument("cluster_file", metavar="CLUSTER", type=click.Path(dir_okay=False))
@click.argument("measurements_file", metavar="MEASUREMENTS", type=click.Path(dir_okay=False))
@click.option("-o", "--output-dir", required=True, type=click.Path(file_okay=False), help="Folder to write.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def calibrate(profile_file: str, cluster_file: str, measurements_file: str, output_dir: str, as_json: bool) -> None:
    """Fit the profile's compute times, the cluster's links, collective efficiency and memory
    reserve to measured runs; write DIR/profile.yaml and DIR/cluster.yaml for plan, simulate, compare.

    \b
    MEASUREMENTS (hetplan/measurements/v1) lists runs: a plan with a run log of 'hetplan launch
    --log', or a plan with the iteration time (and peak memory) any runtime measured.
    Example:
      hetplan calibrate gpt.profile.yaml cluster.yaml measured.yaml -o calibrated/
      hetplan simulate plan-b.yaml --profile calibrated/profile.yaml --cluster calibrated/cluster.yaml
    """
    from hetplan.calibrate import calibrate_files
    from hetplan.calibrate.view import calibration_json, calibration_renderables

    result, written = calibrate_files(profile_file, cluster_file, measurements_file, output_dir)
    if as_json:
        _print_json(calibration_json(result, written))
    else:
        _print_all(calibration_renderables(result, written))


# --------------------------------------------------------------------------- demo
@cli.command()
@click.option("-o", "--output-dir", default="hetplan-demo", show_default=True, type=click.Path(file_okay=False))
def demo(output_dir: str) -> None:
    """Run the main job end to end on bundled defaults and keep every file it writes.

    \b
    Example:
      hetplan demo -o demo/
    """
    from hetplan.demo import run_demo

    run_demo(Path(output_dir), console=console)


# --------------------------------------------------------------------------- entry point
def main(argv: list[str] | None = None) -> None:
    """Run the CLI; bad input becomes one line on stderr and exit code 2."""
    try:
        code = cli.main(args=argv, prog_name="hetplan", standalone_mode=False)
    except HetplanError as exc:
        err_console.print(f"error: {exc}", markup=False)
        raise SystemExit(getattr(exc, "exit_code", 2)) from None  # a stopping signal: 128 + its number
    except click.UsageError as exc:
        where = f"hetplan {exc.ctx.command_path.split(' ', 1)[1]}: " if exc.ctx and " " in exc.ctx.command_path else ""
        err_console.print(f"error: {where}{exc.format_message()} (see --help)", markup=False)
        raise SystemExit(2) from None
    except click.ClickException as exc:
        err_console.print(f"error: {exc.format_message()}", markup=False)
        raise SystemExit(2) from None
    except click.Abort:
        err_console.print("aborted", markup=False)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as exc:  # a bug: still one line unless asked for the traceback
        if os.environ.get("HETPLAN_DEBUG"):
            raise
        err_console.print(
            f"internal error: {type(exc).__name__}: {exc} (set HETPLAN_DEBUG=1 for a traceback)", markup=False
        )
        raise SystemExit(1) from None
    raise SystemExit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
