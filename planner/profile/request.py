"""What ``hetplan profile`` was asked for, as the profiler's inputs: the model section, checked.

    model = model_section("gpt", {"layers": 2}, factory_kwargs={}, input_shape=None)
    model = model_section("pkg.mod:build", {}, factory_kwargs={"width": 64}, input_shape=(3, 32, 32))
    model = model_section("hf:llama", {"seq": 64}, factory_kwargs={"num_hidden_layers": 2}, input_shape=None)
    profile = analytic_request("gpt", {"layers": 2}, ["A100-80GB"], dtype="fp16", micro_batches=(1, 2))

The command line only parses; these say which combinations make sense (a zoo family takes its
settings, a ``module:factory`` model its keyword arguments and a per-sample input shape), with a
one-line error naming the option otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hetplan.contracts.catalog import load_catalog
from hetplan.contracts.model_profile import ModelProfile
from hetplan.errors import HetplanError

__all__ = ["analytic_request", "measure_request", "model_section", "summary_lines"]


def model_section(
    family: str, config: dict[str, Any], *, factory_kwargs: dict[str, Any], input_shape: Sequence[int] | None
) -> dict[str, Any]:
    """The profile's ``model`` section for a zoo family, a ``module:factory`` model, or a Hugging Face
    model ``hf:<model_type or config.json>`` (its config settings in ``--kwargs``, its length ``--seq``)."""
    if family.startswith("hf:"):
        others = sorted(set(config) - {"seq"})
        if input_shape or others:
            what = "--input-shape" if input_shape else f"--{others[0].replace('_', '-')}"
            raise HetplanError(
                f"{what} is not a Hugging Face model's setting; give its config in --kwargs and its length in --seq",
                field=what,
            )
        section: dict[str, Any] = {"hf": family[3:], "config": dict(factory_kwargs)}
        if "seq" in config:
            section["seq"] = config["seq"]
        return section
    if ":" in family:
        if not input_shape:  # a ModelSpec's sample() gives it; otherwise the model says it is missing
            return {"factory": family, "config": dict(factory_kwargs)}
        return {"factory": family, "config": dict(factory_kwargs), "input_shape": list(input_shape)}
    if factory_kwargs or input_shape:
        raise HetplanError(
            "--kwargs and --input-shape are for module:factory models; a zoo family takes --layers, --hidden, ...",
            field="--kwargs",
        )
    return {"family": family, "config": dict(config)}


def analytic_request(
    family: str, config: dict[str, Any], device_names: Sequence[str], *, dtype: str, micro_batches: Sequence[int]
) -> ModelProfile:
    """An analytic profile of a zoo family for catalog types (no torch)."""
    from hetplan.profile.analytic import analytic_profile

    if ":" in family:
        raise HetplanError("--analytic needs a zoo family; a module:factory model is measured", field="MODEL")
    catalog = load_catalog()
    types = [catalog.get(n, field="--devices") for n in device_names]
    return analytic_profile(family, config, devices=types, dtype=dtype, micro_batches=tuple(micro_batches))


def measure_request(
    model: dict[str, Any],
    *,
    micro_batches: Sequence[int],
    device: str,
    dtype: str,
    threads: int | None,
    warmup: int,
    repeat: int,
    estimate_for: Sequence[str],
    device_type: str | None,
    progress: Callable[[int, int], None] | None = None,
    tensor_parallel: Sequence[int] = (1,),
) -> ModelProfile:
    """Measure ``model`` here (torch), carried to the catalog types ``estimate_for`` names.

    ``tensor_parallel``: the degrees to measure each block at (e.g. ``(1, 2, 4)``; 1 always is),
    written as each block's ``tensor_parallel: {t: {...}}`` (:func:`hetplan.profile.measure.measure_profile`).
    """
    try:
        from hetplan.profile.measure import measure_profile
    except ImportError:
        raise HetplanError(
            "measuring needs torch: pip install torch==2.13.0 (or add --analytic)", field="--analytic"
        ) from None
    catalog = load_catalog()
    targets = [catalog.get(n, field="--estimate-for") for n in estimate_for]
    return measure_profile(
        model,
        micro_batches=tuple(micro_batches),
        device=device,
        dtype=dtype,
        threads=threads,
        warmup=warmup,
        repeat=repeat,
        estimate_for=targets,
        device_type_name=device_type,
        progress=progress,
        tensor_parallel=tuple(tensor_parallel),
    )


def summary_lines(profile: ModelProfile, output: str) -> tuple[list[str], str]:
    """Notes worth a look (a measured zoo model whose bytes differ from the analytic formulas) and
    the one line saying what was written."""
    params = profile.total_params
    carried = profile.source.get("carried", {}).get("to", [])
    measured = profile.source.get("measured") is not None or any(
        t.source == "measured" for b in profile.blocks for by_size in b.times.values() for t in by_size.values()
    )
    notes: list[str] = []
    if measured and "family" in profile.model:
        from hetplan.profile.compare import compare_with_analytic

        notes = list(compare_with_analytic(profile, profile.model))
    if measured:
        where = f"measured on {profile.device_types()[0]}" + (
            f", estimated for {', '.join(carried)}" if carried else ""
        )
        return notes, f"wrote {output}: {len(profile.blocks)} blocks, {params:,} parameters, {where}"
    name = profile.model.get("family", "model")
    types = ", ".join(profile.device_types())
    return notes, f"wrote {output}: {name}, {len(profile.blocks)} blocks, {params:,} parameters, estimated for {types}"
