"""Checkpoints keyed by block, written with ``torch.distributed.checkpoint`` and published atomically.

A checkpoint folder ``DIR`` holds::

    DIR/step-000120/          a finished checkpoint: the state after 120 steps (step 120 runs next)
        .metadata             DCP's index: per key, its file, offset, length, shape and dtype
        __0_0.distcp          DCP's data files, one per rank that wrote something
        manifest.json         hetplan's: step, model, plan, blocks and their writers, loss scale,
                              and a sha256 per file
    DIR/step-000123.tmp/      a save in progress, or one that died: never read, removed later
    DIR/latest                "step-000120": the newest finished checkpoint

**Keyed by block name**, not by rank or stage: ``<block>/param/<state-dict key>`` (parameters and
buffers, at the run's dtype), ``<block>/master/<parameter>`` (the fp32 master copy of an fp16/bf16
run, which is what the optimizer updates), ``<block>/optim/<parameter>/<state key>`` (per-parameter
optimizer state). A rank of any later plan loads exactly the keys of the blocks it then holds, so a
run saved under one plan resumes under another. The step, the loss scale and everything else that
is not a tensor is JSON in the manifest.

**Writing (one collective ``dcp.save``).** Every rank passes only the blocks it is the *first
holder* of (the lowest rank among the devices holding the block; replicas hold the same values
after the gradient all-reduce), so the ranks' keys are disjoint. DCP's planning is a gather of the
ranks' local plans to rank 0, which merges them into one global plan and one ``.metadata`` (with
disjoint keys its de-duplication has nothing to do), then every rank writes its own file and rank 0
writes the index once all have reported. That keeps one ordinary DCP checkpoint (DCP's own tools
read it), where a save per rank with ``no_dist=True`` would give one index per rank and a layout of
our own. A rank that holds no first copy still takes part (with nothing to write). The coordination
runs on the process group the caller passes: gloo's default group on CPU; with NCCL a gloo group,
so that it moves no CUDA tensors.

**Full blocks under tensor parallelism and ZeRO-1.** A tensor-parallel block's writer gathers its
shards from its TP group before writing (every member of the writer's group takes part in one
all-gather per sharded tensor), and a ZeRO-1 group's holders gather its optimizer state and masters
(:meth:`~hetplan.runtime.parallel.zero.Zero1Group.state_dict`): the checkpoint holds every block whole, as a
one-process run would, so a plan of any degree or sharding loads it, each member cutting its shard
(:class:`~hetplan.models.gpt_tp.ShardSpec`). Gathering on save, rather than a file per shard,
keeps one layout whatever saved it: the loader never needs the saving plan's degrees.

**Publishing.** Everything is written into ``step-N.tmp/``; once ``dcp.save`` has returned (every
rank's files are written and fsynced, the index too), rank 0 hashes the files, writes
``manifest.json`` (write, fsync, rename), renames the folder to ``step-N`` and rewrites ``latest``
(write, fsync, ``os.replace``); a barrier then lets every rank go on. A save that dies at any
point before the folder rename leaves only a ``.tmp`` folder: ``latest`` and the previous
checkpoint are untouched.

**Reading never unpickles code.** DCP reads tensors with ``torch.load(weights_only=True)``; its
``.metadata`` index is a pickle, which is read here by an unpickler that accepts only DCP's
metadata classes, ``torch.Size`` and torch dtypes (anything else is refused with one line), after
its checksum is checked against the manifest. Each rank checks the checksum of every data file it
reads. Loading is per rank (``no_dist=True``): it needs no collective, so a rank that cannot load
says why at once instead of leaving the others waiting in one.

The folder must be one that every rank sees (a shared file system across nodes), as DCP's
``FileSystemWriter`` requires; one job at a time may save into it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
import shutil
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.futures import Future

from hetplan import __version__
from hetplan.contracts.fields import Fields
from hetplan.errors import HetplanError
from hetplan.models.gpt_tp import ShardSpec, shard_specs
from hetplan.runtime.parallel.zero import Zero1Group
from hetplan.runtime.precision import Precision

__all__ = [
    "CHECKPOINT_SCHEMA",
    "Manifest",
    "SavedBlock",
    "checkpoint_state",
    "load_checkpoint",
    "read_block",
    "read_blocks",
    "read_manifest",
    "resolve_checkpoint",
    "save_checkpoint",
    "step_folder",
]

CHECKPOINT_SCHEMA = "hetplan/checkpoint/v1"
MANIFEST = "manifest.json"
LATEST = "latest"
DCP_INDEX = ".metadata"
#: A non-tensor optimizer-state value (a Python number) is stored as a 0-d tensor under its key plus this.
_ITEM = "#item"
_FINISHED = re.compile(r"step-(\d+)")


def step_folder(step: int) -> str:
    """The folder name of the checkpoint taken after ``step`` steps."""
    return f"step-{step:06d}"


# -- the state of some blocks, as flat {key: tensor} ------------------------------------------------


def _sharded(block: nn.Module, pname: str, like: torch.Tensor) -> ShardSpec | None:
    """The cut of parameter ``pname`` of a tensor-parallel block, for a tensor of its shape."""
    spec = shard_specs(block).get(pname)
    if spec is None or tuple(like.shape) != tuple(block.get_parameter(pname).shape):
        return None
    return spec


def checkpoint_state(
    blocks: dict[int, nn.Module],
    precision: Precision,
    names: list[str],
    zero: Mapping[int, tuple[torch.Tensor | None, Mapping[str, Any]]] | None = None,
) -> dict[str, torch.Tensor]:
    """The tensors of ``blocks`` (index -> module) keyed by block name: what one rank saves.

    A tensor-parallel block's shards (weights, masters, optimizer state) are gathered whole from its
    group (:mod:`hetplan.models.gpt_tp`): every member of the group calls this with the same blocks,
    in the same order, and gets the full tensors, so a checkpoint holds full blocks whatever degree
    saved it and any degree can load it.
    ``zero`` gives, by ``id(parameter)``, the full fp32 master (None under fp32) and optimizer state of
    the parameters a ZeRO-1 group steps (:meth:`hetplan.runtime.parallel.zero.Zero1Group.state_dict`, gathered
    by the caller): they are saved as a replicated optimizer's, so any sharding can load them.
    """
    state: dict[str, torch.Tensor] = {}

    def whole(block: nn.Module, pname: str, value: torch.Tensor) -> torch.Tensor:
        spec = _sharded(block, pname, value)
        return value.detach() if spec is None else spec.join(block.group.gather(value.detach()))

    for index, block in blocks.items():
        name = names[index]
        params = dict(block.named_parameters())
        for key, value in block.state_dict().items():
            state[f"{name}/param/{key}"] = whole(block, key, value) if key in params else value.detach()
        for pname, p in block.named_parameters():
            if zero is not None and id(p) in zero:
                master, optim = zero[id(p)]
                if master is not None:
                    state[f"{name}/master/{pname}"] = whole(block, pname, master)
            else:
                master = precision.master_of(p)
                if master is not p:
                    state[f"{name}/master/{pname}"] = whole(block, pname, master)
                optim = precision.optimizer.state.get(master, {})
            for skey, value in optim.items():
                key = f"{name}/optim/{pname}/{skey}"
                if torch.is_tensor(value):
                    state[key] = whole(block, pname, value)
                elif isinstance(value, (bool, int, float)):
                    state[key + _ITEM] = torch.tensor(value)
                elif value is not None:
                    raise HetplanError(
                        f"optimizer state {skey!r} of {name}.{pname} is a {type(value).__name__}, which a "
                        "checkpoint cannot hold (tensors and numbers only)",
                        field="optimizer",
                    )
    return state


# -- saving -------------------------------------------------------------------------------------------


class _Writer(dcp.FileSystemWriter):
    """DCP's file writer, with a hook once this rank's data files are written (for fault tests)."""

    def __init__(self, path: Path, after_write: Callable[[], None] | None) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=1)
        self._after_write = after_write

    def write_data(self, plan: dcp.SavePlan, planner: dcp.SavePlanner) -> Future:
        future = super().write_data(plan, planner)
        if self._after_write is not None:
            future.wait()  # the files are on disk; now fail as a test asks
            self._after_write()
        return future


def save_checkpoint(
    root: str | Path,
    state: dict[str, torch.Tensor],
    *,
    step: int,
    info: dict[str, Any],
    group: dist.ProcessGroup | None = None,
    keep_last: int | None = None,
    after_write: Callable[[], None] | None = None,
) -> Path:
    """Save ``state`` (this rank's share) as ``root/step-N``; every rank of ``group`` calls this.

    ``info`` is what the manifest says about the run (model, plan, dtype, blocks, loss scale); it
    is the same on every rank and rank 0 writes it. ``keep_last`` removes all but that many
    finished checkpoints (the newest steps), once the new one is published. Without an initialised
    process group this is a single-process save. Returns the published folder.
    """
    folder = Path(root)
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank(group) if distributed else 0
    name = step_folder(step)
    tmp = folder / f"{name}.tmp"
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        if tmp.exists():  # a save of this step that died: start it again
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier(group, distributed, f"waiting for rank 0 to prepare {tmp}")  # nobody writes into it before
    try:
        with _single_process_quietly():
            dcp.save(state, storage_writer=_Writer(tmp, after_write), process_group=group, no_dist=not distributed)
    except (Exception, dcp.CheckpointException) as exc:  # DCP's is a BaseException; or a dead rank's collective
        raise HetplanError(f"saving {name} failed: {_reason(exc)}", file=str(tmp)) from None
    final = folder / name
    if rank == 0:
        _publish(folder, tmp, final, step=step, info=info, keep_last=keep_last)
    _barrier(group, distributed, f"waiting for rank 0 to publish {final}")  # every rank returns after it
    return final


def _barrier(group: dist.ProcessGroup | None, distributed: bool, what: str) -> None:
    if not distributed:
        return
    try:
        dist.barrier(group)
    except Exception as exc:  # a rank that died: gloo says the connection closed
        raise HetplanError(f"{what}: {_first_line(exc)}") from None


def _publish(root: Path, tmp: Path, final: Path, *, step: int, info: dict[str, Any], keep_last: int | None) -> None:
    files = {
        p.name: {"sha256": _sha256(p), "bytes": p.stat().st_size}
        for p in sorted(tmp.iterdir())
        if p.is_file() and p.name != MANIFEST
    }
    manifest = {
        "schema": CHECKPOINT_SCHEMA,
        "step": step,
        "tool": {"name": "hetplan", "version": __version__, "torch": torch.__version__},
        "format": "torch.distributed.checkpoint (FileSystemWriter)",
        **info,
        "files": files,
    }
    _write_atomic(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    _fsync_dir(tmp)
    if final.exists():  # the same step saved again (a run resumed from an earlier one): replace it
        old = final.with_name(final.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(root)
    _write_atomic(root / LATEST, final.name + "\n")
    _prune(root, keep_last=keep_last, keep=final.name)


def _prune(root: Path, *, keep_last: int | None, keep: str) -> None:
    """Remove unfinished folders (``.tmp``, ``.old``) and, with ``keep_last``, older checkpoints."""
    finished: list[tuple[int, Path]] = []
    for path in root.iterdir():
        if not path.is_dir():
            continue
        if path.name.endswith((".tmp", ".old")) and _FINISHED.fullmatch(path.name.rsplit(".", 1)[0]):
            shutil.rmtree(path, ignore_errors=True)
        elif (m := _FINISHED.fullmatch(path.name)) and (path / MANIFEST).is_file():
            finished.append((int(m.group(1)), path))
    if keep_last:
        finished.sort(reverse=True)
        for _, path in finished[keep_last:]:
            if path.name != keep:
                shutil.rmtree(path, ignore_errors=True)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _single_process_quietly() -> Iterator[None]:
    """DCP warns on every ``no_dist`` call that it assumes one process: here that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is .*single process")
        yield


def _reason(exc: BaseException) -> str:
    """One line: for DCP's CheckpointException (one traceback per rank), the first rank's error."""
    failures = getattr(exc, "failures", None)
    if isinstance(exc, dcp.CheckpointException) and failures:
        rank = min(failures)
        inner = failures[rank][0]
        return f"rank {rank}: {type(inner).__name__}: {_first_line(inner)}"
    return _first_line(exc)


def _first_line(exc: BaseException) -> str:
    # without the C++ source location gloo puts first ("[.../pair.cc:553] Connection closed by peer")
    text = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", str(exc)).strip()
    return text.splitlines()[0][:160] if text else type(exc).__name__


# -- finding and checking a checkpoint ---------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    """What ``manifest.json`` says, checked field by field."""

    folder: Path
    step: int
    model: Any
    dtype: str
    blocks: dict[str, int]  # block name -> index
    files: dict[str, str]  # file name -> sha256
    loss_scale: tuple[float, int] | None  # (scale, good steps) of an fp16 run
    data: dict[str, Any]  # the whole manifest, for tools

    @property
    def path(self) -> Path:
        return self.folder / MANIFEST


def resolve_checkpoint(root: str | Path, step: int | None = None) -> Path:
    """The folder to load: ``root/step-N`` for a given step, else what ``root/latest`` names, else
    ``root`` itself when it is a finished checkpoint folder."""
    folder = Path(root)
    if step is not None:
        chosen = folder / step_folder(step)
        if not (chosen / MANIFEST).is_file():
            found = ", ".join(str(s) for s in _finished_steps(folder)) or "none"
            raise HetplanError(f"no finished checkpoint of step {step} (finished steps: {found})", file=str(chosen))
        return chosen
    if (folder / MANIFEST).is_file():
        return folder
    latest = folder / LATEST
    if latest.is_file():
        text = latest.read_text(encoding="utf-8", errors="replace").strip()
        if not _FINISHED.fullmatch(text):
            raise HetplanError(f"expected a folder name such as step-000120, got {text[:60]!r}", file=str(latest))
        return folder / text
    if not folder.is_dir():
        raise HetplanError("no such checkpoint folder", file=str(folder))
    if any(folder.glob("block-*.pt")):
        raise HetplanError(
            "a checkpoint of an older hetplan (block-*.pt files, read by unpickling); this version reads "
            "only torch.distributed.checkpoint folders: resume it with the older version and save again",
            file=str(folder),
        )
    steps = _finished_steps(folder)
    hint = f" (finished steps here: {', '.join(map(str, steps))}; pick one with --resume-step)" if steps else ""
    raise HetplanError(f"missing: no finished checkpoint points here{hint}", file=str(latest))


def _finished_steps(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(
        int(m.group(1)) for p in folder.iterdir() if (m := _FINISHED.fullmatch(p.name)) and (p / MANIFEST).is_file()
    )


def read_manifest(folder: str | Path) -> Manifest:
    """Read and check ``folder/manifest.json``; every problem is one line naming the file and field."""
    base = Path(folder)
    path = base / MANIFEST
    if not base.is_dir():
        raise HetplanError("missing: the checkpoint folder does not exist", file=str(base))
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HetplanError(
            "missing: not a finished checkpoint (a save that died before publishing?)", file=str(path)
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HetplanError(f"cannot read: {_first_line(exc)}", file=str(path)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HetplanError(f"corrupt: not JSON ({exc.msg} at line {exc.lineno})", file=str(path)) from None
    f = Fields(data, file=str(path))
    schema = f.str("schema")
    if schema != CHECKPOINT_SCHEMA:
        raise f.error(f"expected {CHECKPOINT_SCHEMA}, got {schema!r}", "schema")
    step = f.integer("step", minimum=0)
    model = f.raw("model")
    dtype = f.str("dtype")
    listed = f.child("blocks")
    blocks = {str(name): listed.sub(name, entry).integer("index", minimum=0) for name, entry in listed.data.items()}
    listed = f.child("files")
    files = {str(name): listed.sub(name, entry).str("sha256") for name, entry in listed.data.items()}
    if DCP_INDEX not in files:
        raise f.error(f"no entry for DCP's index {DCP_INDEX}", "files")
    loss_scale = None
    scale = f.child("loss_scale", None)
    if scale is not None:
        loss_scale = (scale.number("scale", positive=True), scale.integer("good_steps", minimum=0))
    return Manifest(
        folder=base,
        step=step,
        model=model,
        dtype=dtype,
        blocks=blocks,
        files=files,
        loss_scale=loss_scale,
        data=data,
    )


def _verify(manifest: Manifest, name: str) -> Path:
    """The path of ``name`` in the checkpoint, after checking its sha256 against the manifest."""
    path = manifest.folder / name
    expected = manifest.files.get(name)
    if expected is None:
        raise HetplanError(f"the manifest lists no file {name!r}", file=str(manifest.path), field="files")
    if not path.is_file():
        raise HetplanError("missing: the manifest lists it", file=str(path))
    if _sha256(path) != expected:
        raise HetplanError(
            "checksum mismatch: the file changed or is damaged since it was saved",
            file=str(path),
            field=f"{MANIFEST}: files.{name}.sha256",
        )
    return path


# -- reading DCP's index without unpickling code ------------------------------------------------------

_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", n)
    for n in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name ("torch.strided"); a lookup, nothing else
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class _IndexUnpickler(pickle.Unpickler):
    """Builds only DCP's metadata classes, torch dtypes, layouts and sizes: nothing that runs code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refusing {module}.{name}: not part of a checkpoint index")


def _read_index(manifest: Manifest) -> Metadata:
    path = _verify(manifest, DCP_INDEX)
    try:
        with open(path, "rb") as f:
            metadata = _IndexUnpickler(f).load()
    except Exception as exc:  # any unpickling problem is a damaged or foreign file
        raise HetplanError(f"not a checkpoint index this version reads: {_first_line(exc)}", file=str(path)) from None
    if not isinstance(metadata, Metadata):
        raise HetplanError(f"expected DCP metadata, found a {type(metadata).__name__}", file=str(path))
    return metadata


class _Reader(dcp.FileSystemReader):
    """DCP's file reader, handed the index already read (safely) and checked."""

    def __init__(self, path: Path, metadata: Metadata) -> None:
        super().__init__(path)
        self._metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if getattr(self._metadata, "storage_meta", None) is None:
            self._metadata.storage_meta = StorageMeta()
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata


def _load_keys(manifest: Manifest, metadata: Metadata, keys: list[str]) -> dict[str, torch.Tensor]:
    """Read ``keys`` into fresh CPU tensors of their saved shape and dtype, checking each file read."""
    state: dict[str, torch.Tensor] = {}
    for key in keys:
        md = metadata.state_dict_metadata.get(key)
        if not isinstance(md, TensorStorageMetadata):
            raise HetplanError(
                "missing or not a tensor in the checkpoint index", file=str(manifest.folder / DCP_INDEX), field=key
            )
        state[key] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    wanted = set(keys)
    for name in sorted({info.relative_path for index, info in metadata.storage_data.items() if index.fqn in wanted}):
        _verify(manifest, name)
    if state:
        try:
            with _single_process_quietly():
                dcp.load(state, storage_reader=_Reader(manifest.folder, metadata), no_dist=True)
        except (Exception, dcp.CheckpointException) as exc:
            raise HetplanError(f"cannot load: {_reason(exc)}", file=str(manifest.folder)) from None
    return state


# -- loading --------------------------------------------------------------------------------------------


def load_checkpoint(
    root: str | Path,
    blocks: dict[int, nn.Module],
    precision: Precision,
    *,
    names: list[str],
    step: int | None = None,
    model: Any = None,
    zero: Sequence[Zero1Group] = (),
) -> Manifest:
    """Load the held ``blocks`` (and their optimizer state, masters, the loss scale) from a checkpoint.

    ``root`` is a checkpoint folder (``latest`` is loaded unless ``step`` names one) or one
    ``step-N`` folder. ``model``, when given, must equal the model the checkpoint was saved for.
    A tensor-parallel block cuts its shard from the full saved tensors (any degree saved them); the
    ZeRO-1 groups in ``zero`` (parameters named ``<block>/<parameter>``) keep their shard of the
    saved optimizer state and masters. Returns the manifest: ``.step`` is the step to continue from.
    """
    manifest = read_manifest(resolve_checkpoint(root, step))
    if model is not None and manifest.model != model:
        raise HetplanError(
            f"saved for another model ({_brief(manifest.model)}); this run trains {_brief(model)}",
            file=str(manifest.path),
            field="model",
        )
    metadata = _read_index(manifest)
    present = list(metadata.state_dict_metadata)
    keys: list[str] = []
    for index, block in blocks.items():
        name = names[index]
        if name not in manifest.blocks:
            raise HetplanError(
                f"no block {name!r} (block {index}) in this checkpoint", file=str(manifest.path), field="blocks"
            )
        for key, tensor in block.state_dict().items():
            full = f"{name}/param/{key}"
            md = metadata.state_dict_metadata.get(full)
            if not isinstance(md, TensorStorageMetadata):
                raise HetplanError(
                    "missing from the checkpoint index", file=str(manifest.folder / DCP_INDEX), field=full
                )
            spec = _sharded(block, key, tensor) if key in dict(block.named_parameters()) else None
            shape = spec.full_shape(tuple(tensor.shape), block.group.size) if spec else tuple(tensor.shape)
            if tuple(md.size) != shape:
                raise HetplanError(
                    f"saved with shape {list(md.size)}, this model's is {list(shape)}",
                    file=str(manifest.folder / DCP_INDEX),
                    field=full,
                )
        keys += [k for k in present if k.startswith(f"{name}/")]
    loaded = _load_keys(manifest, metadata, keys)
    for index, block in blocks.items():
        _restore_block(block, names[index], loaded, precision)
    if zero:
        by_name = {f"{names[i]}/{pname}": (b, pname) for i, b in blocks.items() for pname, _ in b.named_parameters()}
        for group in zero:
            optim: dict[str, dict[str, Any]] = {}
            masters: dict[str, torch.Tensor] = {}
            for full_name in group.names:
                block, pname = by_name[full_name]
                entry = _saved_param_state(block, full_name.split("/", 1)[0], pname, loaded)
                optim[full_name] = entry[1]
                if entry[0] is not None:
                    masters[full_name] = entry[0]
            group.load_state_dict(optim, masters if len(masters) == len(group.names) else None)
    if precision.scaler.enabled and manifest.loss_scale and manifest.dtype == "fp16":
        precision.scaler.scale, precision.scaler.good_steps = manifest.loss_scale
    return manifest


# -- top-k's error-feedback residuals (per device: each holder keeps its own) ----------------------------

#: The key prefix of a device's top-k residuals: ``topk-residual/<device address>/<name>``.
RESIDUAL = "topk-residual"


def residual_state(address: str, residuals: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A device's top-k residuals (:meth:`hetplan.runtime.sync.topk.TopK.state_dict`) as checkpoint keys.

    Every holder saves its own (the residuals differ between holders, unlike the weights), so the
    keys carry the device's address and are disjoint across ranks."""
    return {f"{RESIDUAL}/{address}/{name}": t.detach().cpu() for name, t in residuals.items()}


def load_residuals(root: str | Path, address: str, *, step: int | None = None) -> dict[str, torch.Tensor]:
    """The top-k residuals a checkpoint holds for ``address`` (empty when it holds none: a run saved
    under all-reduce, or by another plan's devices, resumes with zero residuals)."""
    manifest = read_manifest(resolve_checkpoint(root, step))
    metadata = _read_index(manifest)
    prefix = f"{RESIDUAL}/{address}/"
    keys = sorted(k for k in metadata.state_dict_metadata if k.startswith(prefix))
    return {k[len(prefix) :]: v for k, v in _load_keys(manifest, metadata, keys).items()}


def _mine(block: nn.Module, pname: str, full: torch.Tensor) -> torch.Tensor:
    """A member's shard of a full saved tensor of parameter ``pname`` (the tensor itself when the
    block is not tensor-parallel, the parameter replicated, or the tensor not of its shape)."""
    spec = shard_specs(block).get(pname)
    if spec is None or full.dim() == 0:
        return full
    if tuple(full.shape) != spec.full_shape(tuple(block.get_parameter(pname).shape), block.group.size):
        return full
    return spec.cut(full, block.group.size, block.group.rank)


def _saved_param_state(
    block: nn.Module, name: str, pname: str, loaded: dict[str, torch.Tensor]
) -> tuple[torch.Tensor | None, dict[str, Any]]:
    """The saved fp32 master (or None) and optimizer state of one parameter, cut to this member."""
    master = loaded.get(f"{name}/master/{pname}")
    prefix = f"{name}/optim/{pname}/"
    state: dict[str, Any] = {}
    for key, value in loaded.items():
        if key.startswith(prefix):
            skey = key[len(prefix) :]
            if skey.endswith(_ITEM):
                state[skey[: -len(_ITEM)]] = value.item()
            else:
                state[skey] = _mine(block, pname, value)
    return (_mine(block, pname, master) if master is not None else None), state


def _restore_block(block: nn.Module, name: str, loaded: dict[str, torch.Tensor], precision: Precision) -> None:
    """Load one block's tensors; a tensor-parallel member cuts its shard from the full saved ones.
    The master and optimizer state of a parameter a ZeRO-1 group steps are that group's to load."""

    def mine(pname: str, full: torch.Tensor) -> torch.Tensor:
        return _mine(block, pname, full)

    block.load_state_dict({key: mine(key, loaded[f"{name}/param/{key}"]) for key in block.state_dict()})
    for pname, p in block.named_parameters():
        if not precision.holds(p):
            continue
        master = precision.master_of(p)
        saved = loaded.get(f"{name}/master/{pname}")
        saved = mine(pname, saved) if saved is not None else None
        with torch.no_grad():
            if master is not p:  # fp16/bf16: the fp32 copy, saved or (from an fp32 run) the saved weights
                master.copy_(saved if saved is not None else mine(pname, loaded[f"{name}/param/{pname}"]))
                p.copy_(master)
            elif saved is not None:  # an fp16/bf16 checkpoint resumed in fp32: the precise copy
                p.copy_(saved)
        prefix = f"{name}/optim/{pname}/"
        state: dict[str, Any] = {}
        for key, value in loaded.items():
            if not key.startswith(prefix):
                continue
            skey = key[len(prefix) :]
            if skey.endswith(_ITEM):
                state[skey[: -len(_ITEM)]] = value.item()
            else:  # scalars (Adam's step) stay on the CPU, as the optimizer keeps them
                state[skey] = mine(pname, value).to(master.device) if value.dim() > 0 else value
        if state:
            precision.optimizer.state[master] = state


def _brief(model: Any) -> str:
    text = json.dumps(model, sort_keys=True, default=str)
    return text if len(text) <= 100 else text[:97] + "..."


# -- reading one block, for tools and tests -----------------------------------------------------------


@dataclass(frozen=True)
class SavedBlock:
    """One block's saved tensors: parameters and buffers, fp32 masters, optimizer state."""

    name: str
    params: dict[str, torch.Tensor]
    master: dict[str, torch.Tensor]
    optimizer: dict[str, dict[str, Any]]


def read_block(root: str | Path, block: int | str, *, step: int | None = None) -> SavedBlock:
    """Read one block (by index or name) of a checkpoint, without building a model."""
    manifest = read_manifest(resolve_checkpoint(root, step))
    if isinstance(block, int):
        found = [n for n, i in manifest.blocks.items() if i == block]
        if not found:
            raise HetplanError(f"no block {block} in this checkpoint", file=str(manifest.path), field="blocks")
        name = found[0]
    else:
        name = block
    return read_blocks(manifest.folder, [name])[name]


def read_blocks(root: str | Path, names: Sequence[str], *, step: int | None = None) -> dict[str, SavedBlock]:
    """Read the blocks ``names`` of a checkpoint at once (its index read, each file checked, once)."""
    manifest = read_manifest(resolve_checkpoint(root, step))
    for name in names:
        if name not in manifest.blocks:
            raise HetplanError(f"no block {name!r} in this checkpoint", file=str(manifest.path), field="blocks")
    metadata = _read_index(manifest)
    wanted = {f"{name}/" for name in names}
    keys = [k for k in metadata.state_dict_metadata if k[: k.find("/") + 1] in wanted]
    loaded = _load_keys(manifest, metadata, keys)
    out = {}
    for name in names:
        params, master, optimizer = {}, {}, {}
        for key, value in loaded.items():
            owner, kind, rest = key.split("/", 2)
            if owner != name:
                continue
            if kind == "param":
                params[rest] = value
            elif kind == "master":
                master[rest] = value
            elif kind == "optim":
                pname, skey = rest.rsplit("/", 1)
                entry = optimizer.setdefault(pname, {})
                if skey.endswith(_ITEM):
                    entry[skey[: -len(_ITEM)]] = value.item()
                else:
                    entry[skey] = value
        out[name] = SavedBlock(name=name, params=params, master=master, optimizer=optimizer)
    return out
