"""Import a Sailor ``profiles.json`` (eth-easl/sailor) as a hetplan ModelProfile.

    from hetplan.profile.importers import import_sailor
    profile = import_sailor("sailor/profiles.json", model="OPT-350")          # config found beside it
    profile = import_sailor("profiles.json", model="opt-30", training_config="opt30.json",
                            gpu_types=["A100-40GB"], tensor_parallel=2)     # degree 2's times as the base
    profile.tp_degrees(1)       # (1, 2, 4): every degree the file has, imported by default

The file is ``model -> gpu_type -> micro_batch_size -> tensor_parallel_degree -> layer_index ->
[forward_s, backward_s, update_s]``: seconds per micro-batch. Layer 0 is the embedding, the last the
head, the ``num_layers`` after layer 0 are transformer layers, and any left between them and the head
(LLaMA's final RMSNorm) are final-norm blocks. Sizes come from the training config (hidden size h,
sequence s, heads a, vocabulary V), in fp16; docs/importers.md gives every formula.

Tensor parallelism: by default (``tensor_parallel=None``) degree 1 is the profile's base and every
other degree the file has becomes the transformer layers' per-degree data (``tensor_parallel:
{t: ...}`` of the profile contract): the file's times at t, and per device the Megatron split's
params ((12h² + 7h)/t + 6h), activations (Korthikanti et al. 2022: s·h·(10 + 24/t + 5·a·s/(h·t))),
selective bytes 5·a·s²/t and all-reduce bytes 2·(2·s·h) (the attention's and the MLP's). Sailor
measured each degree by running Megatron-DeepSpeed layers at that degree on one machine
(Sailor's docs/PROFILING.md), so its times include the layers' all-reduces on that machine's link:
the data says ``allreduce_in_time: true`` and the cost model does not add them again. The
embedding and the head get every degree as well, vocabulary-parallel (:func:`_vocab_at`: the file's
first and last rows at that degree, which Megatron-DeepSpeed ran vocabulary-parallel, as hetplan's
runtime cuts them). A GPU type with no degree-1 times appears only in the degrees it has.
``tensor_parallel=t`` keeps the former behaviour: degree t's times alone, as the base.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetplan.contracts.catalog import load_catalog
from hetplan.contracts.model_profile import Block, ModelProfile, TensorParallel, Timing
from hetplan.errors import HetplanError
from hetplan.profile.importers._common import catalog_name, read_json, require_positive_int

__all__ = ["import_sailor"]

FP16_BYTES = 2
TOKEN_ID_BYTES = 8  # int64 token ids, the batch fed to the embedding


@dataclass(frozen=True)
class _Config:
    """The few model dimensions the byte formulas need (from a Sailor ``training_config_*.json``)."""

    model: str | None
    hidden: int
    seq: int
    layers: int
    heads: int
    vocab: int
    positions: int  # learned positional embeddings (0 for rotary models)
    all_layers: int | None
    file: str


_CONFIG_KEYS = {
    "hidden": ("hidden_size",),
    "seq": ("sequence_length", "seq_length"),
    "layers": ("num_layers",),
    "heads": ("heads", "num_attention_heads"),
    "vocab": ("vocab_size",),
}


def _config_int(data: dict[str, Any], names: tuple[str, ...], *, file: str, required: bool = True) -> int | None:
    for name in names:
        if name in data:
            value = data[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise HetplanError(f"expected a non-negative integer, got {value!r}", file=file, field=name)
            return value
    if required:
        raise HetplanError(
            f"missing {' or '.join(names)} (needed to derive parameter and activation bytes)", file=file, field=names[0]
        )
    return None


def _read_config(path: Path) -> _Config:
    file = str(path)
    data = read_json(path, what="a Sailor training config (JSON)")
    if not isinstance(data, dict):
        raise HetplanError("expected a JSON object with hidden_size, sequence_length, num_layers, ...", file=file)
    dims = {key: _config_int(data, names, file=file) for key, names in _CONFIG_KEYS.items()}
    for key in ("hidden", "seq", "layers", "heads"):
        if dims[key] == 0:
            raise HetplanError("must be positive", file=file, field=_CONFIG_KEYS[key][0])
    positions = _config_int(data, ("max_position_embeddings",), file=file, required=False)
    model = data.get("model")
    return _Config(
        model=model if isinstance(model, str) else None,
        hidden=dims["hidden"],
        seq=dims["seq"],
        layers=dims["layers"],
        heads=dims["heads"],
        vocab=dims["vocab"],
        positions=dims["seq"] if positions is None else positions,
        all_layers=_config_int(data, ("num_all_layers",), file=file, required=False),
        file=file,
    )


def _find_config(profile_path: Path, model: str) -> Path | None:
    """A ``training_config_*.json`` beside the profile whose ``model`` field names ``model``."""
    for candidate in sorted(profile_path.parent.glob("training_config_*.json")):
        try:
            data = json.loads(candidate.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # an unreadable neighbour is not this model's config
        if isinstance(data, dict) and str(data.get("model", "")).lower() == model.lower():
            return candidate
    return None


def _load_config(profile_path: Path, model: str, training_config: str | Path | None) -> _Config:
    if training_config is None:
        found = _find_config(profile_path, model)
        if found is None:
            raise HetplanError(
                f"no training_config_*.json beside the profile describes model {model!r}; pass training_config= "
                "(--training-config): a JSON file with hidden_size, sequence_length, num_layers, heads, vocab_size",
                file=str(profile_path),
                field="training_config",
            )
        return _read_config(found)
    config = _read_config(Path(training_config))
    if config.model is not None and config.model.lower() != model.lower():
        raise HetplanError(
            f"this training config describes model {config.model!r}, not {model!r}", file=config.file, field="model"
        )
    return config


def _pick_model(data: dict[str, Any], model: str, file: str) -> str:
    matches = [key for key in data if isinstance(key, str) and key.lower() == model.lower()]
    if not matches:
        raise HetplanError(
            f"unknown model {model!r}; this file has: {', '.join(map(str, data))}", file=file, field="model"
        )
    return matches[0]


def _layer_sizes(config: _Config, kind: str) -> dict[str, float]:
    """params, activation_bytes, output_bytes, flops_fwd per sample for one block ``kind``, fp16."""
    h, s, a, vocab = config.hidden, config.seq, config.heads, config.vocab
    hidden_state = float(FP16_BYTES * s * h)
    if kind == "embedding":  # token + learned positions; keeps only its dropout mask (1 byte each)
        return {
            "params": vocab * h + config.positions * h,
            "activation": float(s * h),
            "output": hidden_state,
            "flops": 0.0,
        }
    if kind == "transformer":  # Korthikanti et al. 2022, no recomputation, no sequence parallelism
        return {
            "params": 12 * h * h + 13 * h,
            "activation": s * h * (34.0 + 5.0 * a * s / h),
            "output": hidden_state,
            "flops": 24.0 * s * h * h + 4.0 * s * s * h,
        }
    if kind == "final_norm":
        return {"params": 2 * h, "activation": hidden_state, "output": hidden_state, "flops": 0.0}
    if kind == "head":  # untied output projection (+ final norm when no block of its own)
        return {
            "params": vocab * h,
            "activation": 4.0 * s * h * (1.0 + vocab / h),
            "output": 0.0,
            "flops": 2.0 * s * h * vocab,
        }
    raise ValueError(f"unknown Sailor block kind {kind!r}")


def _layer_at(config: _Config, tp: int, times: dict[str, dict[int, list[list[float]]]], row: int) -> TensorParallel:
    """A transformer layer at degree ``tp``, per device (Megatron split, fp16; see the module docstring)."""
    h, s, a = config.hidden, config.seq, config.heads
    params = (12 * h * h + 7 * h) // tp + 6 * h
    return TensorParallel(
        params=params,
        param_bytes=float(params * FP16_BYTES),
        activation_bytes=s * h * (10.0 + 24.0 / tp + 5.0 * a * s / (h * tp)),
        allreduce_bytes=float(2 * FP16_BYTES * s * h),
        selective_bytes=5.0 * a * s * s / tp,
        allreduce_in_time=True,
        times={
            device: {mb: Timing(fwd=rows[row][0], bwd=rows[row][1], source="imported") for mb, rows in by_mb.items()}
            for device, by_mb in times.items()
        },
    )


def _vocab_at(
    config: _Config, kind: str, tp: int, times: dict[str, dict[int, list[list[float]]]], row: int, *, final_norm: bool
) -> TensorParallel:
    """The embedding or the head at degree ``tp``, per device, vocabulary-parallel as Megatron-DeepSpeed
    ran them when Sailor timed them (and as hetplan's runtime cuts them, :mod:`hetplan.models.gpt_tp`):
    ``n = ceil(V/t)`` rows of the token table (the positions whole) or of the head, the loss's fp32
    softmax over the member's ``n`` logits; the embedding's output all-reduce (forward) and the head's
    input-gradient all-reduce (backward) and loss statistics (forward), one pass each, so half of
    them per pass (the cost model prices ``allreduce_bytes`` in both), already in the file's times."""
    h, s = config.hidden, config.seq
    n = -(-config.vocab // tp)
    if kind == "embedding":
        params = n * h + config.positions * h
        activation = float(s * h)  # the dropout mask, as the whole block's
        allreduce = FP16_BYTES * s * h / 2.0
    else:
        params = n * h + (0 if final_norm else 2 * h)
        activation = 4.0 * s * h * (1.0 + n / h)
        allreduce = (FP16_BYTES * s * h + 3 * s * 4) / 2.0
    return TensorParallel(
        params=params,
        param_bytes=float(params * FP16_BYTES),
        activation_bytes=activation,
        allreduce_bytes=allreduce,
        allreduce_in_time=True,
        times={
            device: {mb: Timing(fwd=rows[row][0], bwd=rows[row][1], source="imported") for mb, rows in by_mb.items()}
            for device, by_mb in times.items()
        },
    )


def _replicated_at(config: _Config, times: dict[str, dict[int, list[list[float]]]], row: int) -> TensorParallel:
    """A final norm at any degree: every member holds and runs it whole (Megatron replicates it),
    with the file's times at that degree and no all-reduce."""
    sizes = _layer_sizes(config, "final_norm")
    return TensorParallel(
        params=int(sizes["params"]),
        param_bytes=float(sizes["params"] * FP16_BYTES),
        activation_bytes=sizes["activation"],
        allreduce_bytes=0.0,
        allreduce_in_time=True,
        times={
            device: {mb: Timing(fwd=rows[row][0], bwd=rows[row][1], source="imported") for mb, rows in by_mb.items()}
            for device, by_mb in times.items()
        },
    )


def _file_degrees(by_gpu: dict[str, Any], chosen: dict[str, str]) -> list[int]:
    """Every tensor-parallel degree >= 2 the chosen GPU types have at some micro-batch size."""
    found: set[int] = set()
    for name in chosen.values():
        by_mb = by_gpu[name]
        for by_tp in by_mb.values() if isinstance(by_mb, dict) else ():
            if isinstance(by_tp, dict):
                found.update(int(k) for k in by_tp if str(k).isdigit() and int(k) >= 2)
    return sorted(found)


def _layer_kinds(count: int, config: _Config, file: str) -> list[str]:
    """embedding, num_layers transformer layers, final norm(s) if any are left, head."""
    extra = count - 2 - config.layers
    if config.all_layers is not None and config.all_layers != count:
        raise HetplanError(
            f"the training config says num_all_layers={config.all_layers} but the profile has {count} layers",
            file=config.file,
            field="num_all_layers",
        )
    if extra < 0:
        raise HetplanError(
            f"the profile has {count} layers, fewer than embedding + num_layers={config.layers} + head",
            file=file,
            field="layers",
        )
    return ["embedding"] + ["transformer"] * config.layers + ["final_norm"] * extra + ["head"]


def _layer_times(layers: Any, where: str, file: str) -> list[list[float]]:
    """``{"0": [f, b, u], "1": ...}`` as a list indexed by layer, every entry checked."""
    if not isinstance(layers, dict) or not layers:
        raise HetplanError(
            "expected a non-empty mapping of layer index to [forward_s, backward_s, update_s]", file=file, field=where
        )
    if sorted(layers) != sorted(str(i) for i in range(len(layers))):
        raise HetplanError(f"layer indices must be 0..{len(layers) - 1}", file=file, field=where)
    rows: list[list[float]] = []
    for i in range(len(layers)):
        row = layers[str(i)]
        ok = isinstance(row, list) and len(row) == 3
        ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf for v in row)
        if not ok:
            raise HetplanError(
                f"expected [forward_s, backward_s, update_s], non-negative, got {row!r}",
                file=file,
                field=f"{where}.{i}",
            )
        rows.append([float(v) for v in row])
    return rows


def _gpu_selection(by_gpu: dict[str, Any], gpu_types: list[str] | None, file: str, where: str) -> dict[str, str]:
    """Catalog name -> the file's GPU name, for the requested types (default: all in the file).

    Every GPU type that will be imported must be in the catalog; with ``gpu_types`` given, the
    file's other types are left alone (an unknown one among them is not an error).
    """
    catalog = load_catalog()
    in_file: dict[str, str] = {}
    unknown: list[str] = []
    for name in by_gpu:
        canonical = catalog.canonical(name)
        if canonical is None:
            unknown.append(name)
            continue
        if canonical in in_file:
            raise HetplanError(
                f"GPU types {in_file[canonical]!r} and {name!r} are both {canonical}", file=file, field=where
            )
        in_file[canonical] = name
    if gpu_types is None:
        for name in unknown:
            catalog_name(name, file=file, field=f"{where}.{name}", catalog=catalog)  # raises, naming it
        return in_file
    chosen: dict[str, str] = {}
    for requested in gpu_types:
        canonical = catalog_name(requested, file=file, field="gpu_types", catalog=catalog)
        if canonical not in in_file:
            have = ", ".join(f"{n} ({c})" for c, n in in_file.items())
            raise HetplanError(
                f"GPU type {requested!r} has no times for this model; the file has: {have}",
                file=file,
                field="gpu_types",
            )
        chosen[canonical] = in_file[canonical]
    return chosen


def _collect_times(
    by_gpu: dict[str, Any], chosen: dict[str, str], tp: int, file: str, where: str
) -> tuple[dict[str, dict[int, list[list[float]]]], list[str]]:
    """Per catalog GPU name, per micro-batch size: the layer rows at TP degree ``tp``; and what was skipped."""
    times: dict[str, dict[int, list[list[float]]]] = {}
    skipped: list[str] = []
    for canonical, name in chosen.items():
        by_mb = by_gpu[name]
        if not isinstance(by_mb, dict):
            raise HetplanError(
                "expected a mapping of micro-batch size to tensor-parallel degrees", file=file, field=f"{where}.{name}"
            )
        found: dict[int, list[list[float]]] = {}
        for mb_key, by_tp in by_mb.items():
            mb_where = f"{where}.{name}.{mb_key}"
            if not str(mb_key).isdigit() or int(mb_key) < 1 or not isinstance(by_tp, dict):
                raise HetplanError(
                    "expected a positive micro-batch size mapping to tensor-parallel degrees", file=file, field=mb_where
                )
            if str(tp) not in by_tp:
                has = ", ".join(
                    sorted(map(str, by_tp), key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k))
                )
                skipped.append(f"{name} micro-batch {mb_key}: no tensor-parallel degree {tp} (has {has})")
                continue
            found[int(mb_key)] = _layer_times(by_tp[str(tp)], f"{mb_where}.{tp}", file)
        if found:
            times[canonical] = dict(sorted(found.items()))
        else:
            skipped.append(f"{name}: skipped, no micro-batch size at tensor-parallel degree {tp}")
    return times, skipped


def _blocks(
    kinds: list[str],
    config: _Config,
    times: dict[str, dict[int, list[list[float]]]],
    by_degree: dict[int, dict[str, dict[int, list[list[float]]]]] | None = None,
) -> list[Block]:
    blocks: list[Block] = []
    transformer_index = 0
    for i, kind in enumerate(kinds):
        sizes = _layer_sizes(config, kind)
        if kind == "head" and "final_norm" not in kinds:
            sizes["params"] += 2 * config.hidden
        if kind == "transformer":
            name = f"layer{transformer_index}"
            transformer_index += 1
        else:
            name = kind if kinds.count(kind) == 1 else f"{kind}{i}"
        blocks.append(
            Block(
                name=name,
                kind=kind,
                params=int(sizes["params"]),
                param_bytes=float(sizes["params"] * FP16_BYTES),
                activation_bytes=sizes["activation"],
                output_bytes=sizes["output"] if i < len(kinds) - 1 else 0.0,
                flops_fwd=sizes["flops"],
                times={
                    device: {
                        mb: Timing(fwd=rows[i][0], bwd=rows[i][1], source="imported") for mb, rows in by_mb.items()
                    }
                    for device, by_mb in times.items()
                },
                selective_bytes=5.0 * config.heads * config.seq * config.seq if kind == "transformer" else 0.0,
                tensor_parallel=_degrees_of(kind, config, by_degree or {}, i, final_norm="final_norm" in kinds),
            )
        )
    return blocks


def _degrees_of(
    kind: str,
    config: _Config,
    by_degree: dict[int, dict[str, dict[int, list[list[float]]]]],
    row: int,
    *,
    final_norm: bool,
) -> dict[int, TensorParallel]:
    """A block's per-degree data: a transformer layer's Megatron split, the embedding's and head's
    vocabulary-parallel cut, a final norm whole on every member."""
    if kind == "transformer":
        return {t: _layer_at(config, t, at, row) for t, at in by_degree.items()}
    if kind == "final_norm":
        return {t: _replicated_at(config, at, row) for t, at in by_degree.items()}
    if kind in ("embedding", "head"):
        return {t: _vocab_at(config, kind, t, at, row, final_norm=final_norm) for t, at in by_degree.items()}
    return {}


def _update_times(times: dict[str, dict[int, list[list[float]]]]) -> dict[str, dict[int, Any]]:
    """The optimizer ``update_s`` column: one number per (GPU, micro-batch) when every layer agrees."""
    out: dict[str, dict[int, Any]] = {}
    for device, by_mb in times.items():
        out[device] = {}
        for mb, rows in by_mb.items():
            values = [row[2] for row in rows]
            out[device][mb] = values[0] if len(set(values)) == 1 else values
    return out


def import_sailor(
    path: str | Path,
    *,
    model: str,
    gpu_types: list[str] | None = None,
    training_config: str | Path | None = None,
    tensor_parallel: int | None = None,
) -> ModelProfile:
    """Read one model of a Sailor ``profiles.json``: every (chosen) GPU type, every micro-batch size,
    and (``tensor_parallel=None``) every tensor-parallel degree; an int takes that degree alone."""
    path = Path(path)
    file = str(path)
    every = tensor_parallel is None
    tp = 1 if every else require_positive_int(tensor_parallel, name="tensor_parallel", file=file)
    data = read_json(path, what="a Sailor profiles.json")
    if not isinstance(data, dict) or not data:
        raise HetplanError(
            "expected a JSON object: model -> gpu_type -> micro_batch -> tp_degree -> layer -> [f, b, u]", file=file
        )
    key = _pick_model(data, model, file)
    by_gpu = data[key]
    if not isinstance(by_gpu, dict) or not by_gpu:
        raise HetplanError("expected a non-empty mapping of GPU type to micro-batch sizes", file=file, field=key)
    config = _load_config(path, key, training_config)
    chosen = _gpu_selection(by_gpu, gpu_types, file, key)
    times, skipped = _collect_times(by_gpu, chosen, tp, file, key)
    if not times:
        hint = "; import one degree alone with tensor_parallel= (--tensor-parallel)" if every else ""
        raise HetplanError(
            f"no chosen GPU type has times at tensor-parallel degree {tp}: {'; '.join(skipped)}{hint}",
            file=file,
            field=key,
        )
    by_degree: dict[int, dict[str, dict[int, list[list[float]]]]] = {}
    for t in _file_degrees(by_gpu, chosen) if every else ():
        at, _ = _collect_times(by_gpu, chosen, t, file, key)
        if at:
            by_degree[t] = at
    counts = {
        len(rows)
        for by_mb in [*times.values(), *(x for at in by_degree.values() for x in at.values())]
        for rows in by_mb.values()
    }
    if len(counts) != 1:
        raise HetplanError(
            f"GPU types / micro-batch sizes disagree on the layer count: {sorted(counts)}", file=file, field=key
        )
    kinds = _layer_kinds(counts.pop(), config, file)
    source = {
        "importer": "sailor",
        "file": path.name,
        "model": key,
        "training_config": Path(config.file).name,
        "tensor_parallel": [1, *by_degree] if every else tp,
        "gpu_types": {c: chosen[c] for c in chosen if c in times or any(c in at for at in by_degree.values())},
        "micro_batches": {device: list(by_mb) for device, by_mb in times.items()},
        "update_s": _update_times(times),
        "skipped": skipped,
        "assumptions": "fp16 bytes; activations per Korthikanti et al. 2022 s*h*(34+5*a*s/h), at degree t "
        "s*h*(10+24/t+5*a*s/(h*t)); untied output head (V*h); times are seconds per micro-batch; times at "
        "degree t >= 2 include the layer's all-reduces (measured so); embedding and head at degree 1 only",
    }
    return ModelProfile(
        model={
            "name": key,
            "config": {
                "hidden_size": config.hidden,
                "sequence_length": config.seq,
                "num_layers": config.layers,
                "heads": config.heads,
                "vocab_size": config.vocab,
            },
        },
        dtype="fp16",
        blocks=_blocks(kinds, config, times, by_degree),
        input_bytes=float(TOKEN_ID_BYTES * config.seq),
        source=source,
    )
