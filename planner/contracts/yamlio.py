"""Read and write contract files: YAML in, typed objects out; deterministic bytes back.

Loading never raises anything but :class:`~hetplan.errors.HetplanError`: a missing file, a YAML
syntax error, binary garbage, an empty file, or a top level that is not a mapping all become one
line naming the file. Dumping is deterministic: keys keep the order the caller built, floats are
written with ``repr`` (shortest round-trip form), so the same object gives the same bytes.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import yaml

from hetplan.errors import HetplanError

__all__ = ["dump_yaml", "read_mapping", "read_text", "schema_of", "sha256_of", "write_yaml"]


# libyaml's parser where PyYAML was built with it (five times faster on a 7B model's profile);
# the constructor and resolver are the same Python classes either way
_SafeBase = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_SafeBase):
    """SafeLoader that refuses duplicate keys (a silent overwrite hides a typo).

    It also gives a place to values PyYAML recognises but cannot build: the date ``2023-13-45``
    or ``!!float abc`` make SafeLoader raise a bare ``ValueError`` (or worse) with no line.
    """

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, AttributeError, OverflowError) as exc:
            kind = str(node.tag).rsplit(":", 1)[-1]
            value = f" {node.value!r}" if isinstance(node, yaml.ScalarNode) else ""
            reason = f" ({exc})" if isinstance(exc, ValueError) else ""
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {kind} value{value}{reason}", node.start_mark
            ) from None


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            first = seen.get(key)
        except TypeError:  # a list or mapping as a key: SafeLoader's own check reports it
            continue
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {first.line + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

# YAML 1.1 (PyYAML) reads 8.6e9, 1e-5 and 12.5e9 as *strings*: its floats need a dot and a signed
# exponent. People write them as numbers (DESIGN.md's profile example has `flops_fwd: 8.6e9`), so
# the loader reads them as floats, as YAML 1.2 does; the dumper quotes a string of that form so it
# comes back a string.
_SCIENTIFIC = re.compile(r"^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+|[-+]?\.[0-9_]+[eE][-+]?[0-9]+)$")
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _SCIENTIFIC, list("-+0123456789."))


def read_text(path: str | Path, *, kind: str, what: str) -> str:
    """A file's UTF-8 text; a missing file, a folder, unreadable or non-UTF-8 bytes become one located
    error (``kind``: what the file should be, e.g. "a YAML file"; ``what``: its format, e.g. "YAML")."""
    name = str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise HetplanError("file not found", file=name) from None
    except IsADirectoryError:
        raise HetplanError(f"is a directory, expected {kind}", file=name) from None
    except OSError as exc:
        raise HetplanError(f"cannot read: {exc.strerror}", file=name) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HetplanError(f"not a text file (invalid UTF-8); expected {what}", file=name) from None


def read_mapping(path: str | Path) -> dict[str, Any]:
    """Parse a YAML (or JSON) file whose top level must be a mapping."""
    name = str(path)
    text = read_text(path, kind="a YAML file", what="YAML")
    if "\x00" in text:
        raise HetplanError("not a text file (NUL bytes); expected YAML", file=name)
    if not text.strip():
        raise HetplanError("empty file; expected a YAML mapping with a 'schema:' line", file=name)
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown place"
        problem = " ".join(str(exc.problem or exc.context or "not valid YAML").split())
        what = "YAML error" if isinstance(exc, yaml.constructor.ConstructorError) else "YAML syntax error"
        raise HetplanError(f"{what} at {where}: {problem}", file=name) from None
    except yaml.reader.ReaderError as exc:  # a control character: say where, as a line
        line = text.count("\n", 0, exc.position) + 1
        char = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        raise HetplanError(f"YAML error at line {line}: {exc.reason} (character {char})", file=name) from None
    except yaml.YAMLError as exc:
        raise HetplanError(f"YAML error: {' '.join(str(exc).split())}", file=name) from None
    except RecursionError:
        raise HetplanError("YAML nested too deeply to read", file=name) from None
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        # The last guard: _Loader.construct_object already turns these into located errors.
        raise HetplanError(f"YAML value cannot be read: {exc}", file=name) from None
    if not isinstance(data, dict):
        got = "nothing" if data is None else type(data).__name__
        raise HetplanError(f"expected a YAML mapping at the top level, got {got}", file=name)
    return data


def schema_of(data: dict[str, Any], path: str | Path) -> str:
    """The ``schema:`` line of a parsed file, which says which contract it is."""
    schema = data.get("schema")
    if not isinstance(schema, str):
        raise HetplanError("missing 'schema:' line (for example 'hetplan/cluster/v1')", file=str(path), field="schema")
    return schema


class _Dumper(yaml.SafeDumper):
    """SafeDumper that never emits anchors (plans must read the same to people and diff tools)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_tuple(dumper: yaml.SafeDumper, data: tuple) -> yaml.Node:
    return dumper.represent_list(list(data))


def _represent_float(dumper: yaml.SafeDumper, data: float) -> yaml.Node:
    if data != data or data in (float("inf"), float("-inf")):
        return yaml.SafeDumper.represent_float(dumper, data)
    text = repr(float(data))
    mantissa, e, exponent = text.partition("e")
    if e and "." not in mantissa:
        # YAML 1.1 reads '5e-06' as a string; '5.0e-06' is a float, so no '!!float' tag is needed
        text = f"{mantissa}.0e{exponent}"
    return dumper.represent_scalar("tag:yaml.org,2002:float", text)


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", _SCIENTIFIC, list("-+0123456789."))
_Dumper.add_representer(tuple, _represent_tuple)
_Dumper.add_representer(float, _represent_float)


# libyaml's emitter where PyYAML was built with it (four times faster on a 512-device plan; the
# representers are the same Python functions). It writes the same bytes as the Python emitter except
# where a string needs double quotes (a tab, a control character): the two fold such strings at the
# line width differently, so data holding one goes to the Python emitter (:func:`_libyaml_safe`).
_CBase = getattr(yaml, "CSafeDumper", None)
if _CBase is not None:

    class _CDumper(_CBase):  # type: ignore[misc, valid-type]
        """:class:`_Dumper` on libyaml's emitter."""

        def ignore_aliases(self, data: Any) -> bool:
            return True

    _CDumper.add_implicit_resolver("tag:yaml.org,2002:float", _SCIENTIFIC, list("-+0123456789."))
    _CDumper.add_representer(tuple, _represent_tuple)
    _CDumper.add_representer(float, _represent_float)

# characters that PyYAML's emitter writes unescaped (its printable set, less the line separators)
_ESCAPED = re.compile("[^\n\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]")


def _libyaml_safe(data: Any) -> bool:
    """No string in ``data`` (keys included) has a character that would be written escaped."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _ESCAPED.search(item):
                return False
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return True


def dump_yaml(data: dict[str, Any]) -> str:
    """Deterministic YAML text: insertion order kept, short flow style for lists of scalars."""
    dumper = _CDumper if _CBase is not None and _libyaml_safe(data) else _Dumper
    return yaml.dump(data, Dumper=dumper, sort_keys=False, default_flow_style=None, width=100, allow_unicode=True)


def write_yaml(data: dict[str, Any], path: str | Path) -> None:
    """Write ``dump_yaml(data)`` to ``path``, creating its folder."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        target.write_text(dump_yaml(data), encoding="utf-8")
    except OSError as exc:
        raise HetplanError(f"cannot write: {exc.strerror}", file=str(path)) from None


def sha256_of(path: str | Path) -> str:
    """Hex digest of a file's bytes, recorded in a plan so a stale input is noticed."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise HetplanError(f"cannot read: {exc.strerror}", file=str(path)) from None
