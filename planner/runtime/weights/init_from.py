"""Weights a run starts from, read one tensor at a time: a rank reads only its own blocks' tensors.

    with open_weights("gpt2-tiny/") as source:        # a save_pretrained folder, or a .safetensors/.pt file
        load_blocks(source, zoo, {3: block3, 4: block4})
    check_init_from(model_section, "gpt2-tiny/")       # every block's tensor there, of its shape

Sources (``--init-from``):

* a Hugging Face ``save_pretrained`` folder: ``model.safetensors``, or shards listed by
  ``model.safetensors.index.json`` (its ``weight_map``: key -> shard file). Each tensor is read with
  ``safetensors.safe_open(...).get_tensor(key)``, which reads that tensor's bytes and nothing else;
* a ``.safetensors`` file (a state_dict saved with ``safetensors.torch.save_file``);
* a ``.pt`` / ``.pth`` / ``.bin`` file of ``torch.save(model.state_dict())``, loaded with
  ``weights_only=True`` (no code is unpickled) and ``mmap=True``: a rank's memory holds the pages of
  the tensors it copies, not the file.

Names: block ``i``'s state-dict key ``k`` is read under ``zoo.state_dict_keys(i)[k]``: the key in the
model's own full state dict (``transformers`` names for a Hugging Face model, the factory's
``nn.Sequential`` names for a factory, ``<block name>.<key>`` for the zoo); a tied parameter under
its canonical key. A Hugging Face folder saved from the base model (``GPT2Model``, ``LlamaModel``:
no ``transformer.`` / ``model.`` prefix) is read too. Tensors are cast to the block's dtype.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import nn

from hetplan.errors import HetplanError

__all__ = ["SAFETENSORS", "SAFETENSORS_INDEX", "WeightSource", "check_init_from", "load_blocks", "open_weights"]

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
_TORCH_SUFFIXES = (".pt", ".pth", ".bin")
_FIELD = "--init-from"


def _safe_open() -> Any:
    try:
        from safetensors import safe_open
    except ImportError:
        raise HetplanError("reading safetensors needs the safetensors package: pip install safetensors",
                           field=_FIELD) from None  # fmt: skip
    return safe_open


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class WeightSource:
    """Tensors by name, read one at a time (the files stay open until :meth:`close`).

    Attributes:
        path: what ``--init-from`` named.
    """

    def __init__(self, path: Path, files: Mapping[str, Path] | None = None, tensors: Mapping[str, Any] | None = None):
        self.path = path
        self._files = dict(files or {})  # key -> safetensors file
        self._tensors = dict(tensors or {})  # key -> tensor (a mmap'ed torch file)
        self._open: dict[Path, Any] = {}

    def keys(self) -> set[str]:
        return set(self._files) | set(self._tensors)

    def _handle(self, file: Path) -> Any:
        if file not in self._open:
            try:
                self._open[file] = _safe_open()(str(file), framework="pt", device="cpu")
            except HetplanError:
                raise
            except Exception as exc:  # a damaged or foreign file
                raise HetplanError(f"cannot read as safetensors ({_first_line(exc)})", file=str(file)) from None
        return self._open[file]

    def shape(self, key: str) -> tuple[int, ...]:
        if key in self._tensors:
            return tuple(self._tensors[key].shape)
        return tuple(self._handle(self._files[key]).get_slice(key).get_shape())

    def read(self, key: str) -> torch.Tensor:
        """The tensor ``key`` (a fresh CPU tensor; only its bytes are read)."""
        if key in self._tensors:  # a copy: the mmap'ed file is not kept behind a parameter
            return self._tensors[key].clone()
        file = self._files[key]
        try:  # a copy too: safetensors may hand out a view of its mmap of the file
            return self._handle(file).get_tensor(key).clone()
        except HetplanError:
            raise
        except Exception as exc:
            raise HetplanError(f"cannot read tensor {key!r} ({_first_line(exc)})", file=str(file)) from None

    def file_of(self, key: str | None = None) -> str:
        """The file a key is (or would be) read from, for messages."""
        if key is not None and key in self._files:
            return str(self._files[key])
        return str(self.path)

    def close(self) -> None:
        self._open.clear()
        self._tensors.clear()

    def __enter__(self) -> WeightSource:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _safetensors_keys(file: Path) -> list[str]:
    handle = WeightSource(file)._handle(file)
    return list(handle.keys())


def _from_index(index: Path) -> WeightSource:
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HetplanError(f"not a safetensors index ({_first_line(exc)})", file=str(index)) from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise HetplanError("expected a mapping of tensor names to shard files", file=str(index), field="weight_map")
    files = {}
    for key, name in weight_map.items():
        shard = index.parent / name
        if not shard.is_file():
            raise HetplanError(f"the shard {name!r} of tensor {key!r} is missing", file=str(index), field="weight_map")
        files[str(key)] = shard
    return WeightSource(index.parent, files=files)


def _from_torch_file(path: Path) -> WeightSource:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # not a torch file, or one that pickles code
        raise HetplanError(f"cannot load as a state_dict ({_first_line(exc)})", file=str(path)) from None
    if isinstance(data, Mapping) and not all(torch.is_tensor(v) for v in data.values()):
        for wrapper in ("state_dict", "model"):  # {"state_dict": ...}, as training scripts often save
            if isinstance(data.get(wrapper), Mapping):
                data = data[wrapper]
                break
    if not isinstance(data, Mapping) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in data.items()):
        raise HetplanError("expected a state_dict (a mapping of names to tensors)", file=str(path))
    return WeightSource(path, tensors=data)


def open_weights(path: str | Path) -> WeightSource:
    """The weights ``--init-from`` names; every problem is one line naming the file."""
    p = Path(path)
    if p.is_dir():
        if (p / SAFETENSORS_INDEX).is_file():
            return _from_index(p / SAFETENSORS_INDEX)
        if (p / SAFETENSORS).is_file():
            file = p / SAFETENSORS
            return WeightSource(p, files=dict.fromkeys(_safetensors_keys(file), file))
        if (p / "pytorch_model.bin").is_file():  # save_pretrained(safe_serialization=False)
            return _from_torch_file(p / "pytorch_model.bin")
        raise HetplanError(
            f"expected {SAFETENSORS} or {SAFETENSORS_INDEX} in it (a save_pretrained folder with safetensors)",
            file=str(p),
            field=_FIELD,
        )
    if not p.is_file():
        raise HetplanError("no such file or folder", file=str(p), field=_FIELD)
    if p.suffix == ".safetensors":
        return WeightSource(p, files=dict.fromkeys(_safetensors_keys(p), p))
    if p.suffix in _TORCH_SUFFIXES:
        return _from_torch_file(p)
    raise HetplanError(
        "expected a save_pretrained folder, a .safetensors file or a torch state_dict (.pt, .pth, .bin)",
        file=str(p),
        field=_FIELD,
    )


def _resolve(source: WeightSource, key: str, *, hf: bool) -> str | None:
    """The name ``key`` has in ``source``: itself, or for a Hugging Face model saved as its base model
    (``GPT2Model``), the key without the task model's first component (``transformer.``)."""
    keys = source.keys()
    if key in keys:
        return key
    if hf:
        rest = key.partition(".")[2]
        if rest in keys:
            return rest
    return None


def _expected(zoo: Any, index: int, block: nn.Module) -> dict[str, tuple[str, torch.Tensor]]:
    """Block ``index``'s state-dict keys -> (the model's key, the block's tensor)."""
    names = zoo.state_dict_keys(index)
    return {key: (names[key], value) for key, value in block.state_dict().items()}


def _missing(source: WeightSource, full: str, zoo: Any, index: int) -> HetplanError:
    return HetplanError(
        f"no tensor {full!r} (block {index}, {zoo.block_names()[index]!r}); {_sample_keys(source)}",
        file=source.file_of(),
        field=_FIELD,
    )


def _sample_keys(source: WeightSource) -> str:
    keys = sorted(source.keys())
    shown = ", ".join(repr(k) for k in keys[:3])
    return f"it has {len(keys)} tensors ({shown}{', ...' if len(keys) > 3 else ''})"


def _shape_error(
    source: WeightSource, key: str, got: tuple[int, ...], want: tuple[int, ...], where: str
) -> HetplanError:
    return HetplanError(
        f"tensor {key!r} has shape {list(got)}; {where} needs {list(want)}", file=source.file_of(key), field=_FIELD
    )


def load_blocks(source: WeightSource, zoo: Any, blocks: Mapping[int, nn.Module], *, assign: bool = False) -> None:
    """Fill every parameter and persistent buffer of ``blocks`` (index -> module) from ``source``,
    reading only their tensors (a tied parameter is read once per block holding it).

    ``assign``: the tensors read become the block's (``load_state_dict(assign=True)``: a block built
    on meta needs no storage of its own first); the caller ties shared parameters again after."""
    hf = zoo.hf_config() is not None
    for index, block in blocks.items():
        state = {}
        for key, (full, mine) in _expected(zoo, index, block).items():
            found = _resolve(source, full, hf=hf)
            if found is None:
                raise _missing(source, full, zoo, index)
            tensor = source.read(found)
            if tuple(tensor.shape) != tuple(mine.shape):
                where = f"block {index} ({zoo.block_names()[index]}) {key}"
                raise _shape_error(source, found, tuple(tensor.shape), tuple(mine.shape), where)
            state[key] = tensor.to(mine.dtype)
        block.load_state_dict(state, strict=True, assign=assign)


def check_init_from(model: Mapping[str, Any], path: str | Path) -> str:
    """Check, before any rank starts, that ``path`` holds every block's tensors at the right shapes
    (names and shapes only: no tensor is read). Returns the path made absolute."""
    from hetplan.models import resolve_model

    zoo = resolve_model(model)
    with torch.device("meta"):
        blocks = zoo.build_blocks(0, zoo.n_blocks, 0)
    hf = zoo.hf_config() is not None
    with open_weights(path) as source:
        for index, block in enumerate(blocks):
            for key, (full, mine) in _expected(zoo, index, block).items():
                found = _resolve(source, full, hf=hf)
                if found is None:
                    raise _missing(source, full, zoo, index)
                shape = source.shape(found)
                if shape != tuple(mine.shape):
                    raise _shape_error(source, found, shape, tuple(mine.shape), f"block {index} {key}")
    return str(Path(path).resolve())
