"""Model metadata, read safely: openpilot's ``output_slices`` (base64 of a pickled {name: slice})
or JSON, through an unpickler that admits plain data and ``slice`` only (design C8).

:func:`safe_unpickle` resolves no global but ``builtins.slice``: GLOBAL, STACK_GLOBAL, INST, OBJ and
the EXT opcodes all go through ``find_class``, which refuses everything else before it could be
called, and persistent ids are refused too. What the pickle builds without a global is checked
afterwards: only dict, list, tuple, str, int, float, bool, None and slice pass (no set, bytes, ...).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_METADATA_BYTES",
    "MetadataError",
    "ModelContractError",
    "UnsafeMetadata",
    "encode_output_slices",
    "parse_output_slices",
    "safe_unpickle",
]

MAX_METADATA_BYTES = 1 << 20
"""The longest ``output_slices`` text accepted (a real table is a few hundred bytes)."""


class ModelContractError(ValueError):
    """A model does not fit the contract, or its metadata cannot be read."""


class MetadataError(ModelContractError):
    """The model's metadata is missing or malformed."""


class UnsafeMetadata(MetadataError):
    """A metadata pickle asks for something other than plain data and ``slice`` (a global such as
    ``os.system``, a persistent id): refused before anything ran."""


# -- the restricted unpickler -------------------------------------------------------------------

_ALLOWED_GLOBALS = {("builtins", "slice"), ("__builtin__", "slice")}
_PLAIN_TYPES = (dict, list, tuple, str, int, float, bool, type(None), slice)


def _shown(text: str) -> str:
    """A name from the pickle as it may appear in a message: short and printable."""
    shown = text if text.isprintable() else ascii(text)
    return shown if len(shown) <= 60 else f"{shown[:60]}..."


class _PlainDataUnpickler(pickle.Unpickler):
    """Resolves no global but ``slice``: GLOBAL, STACK_GLOBAL, INST and EXT* all go through
    ``find_class``, so a callable other than ``slice`` never reaches REDUCE/NEWOBJ/BUILD."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return slice
        raise UnsafeMetadata(
            f"metadata pickle refers to {_shown(module)}.{_shown(name)}; only plain data (dict, "
            "list, tuple, str, int, float, bool, None) and builtins.slice are allowed"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeMetadata(
            "metadata pickle uses a persistent id; only plain data and builtins.slice are allowed"
        )


def _check_plain(value: object) -> None:
    """Refuse anything but the plain types (sets, bytes, ... can be built without a global)."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if type(item) not in _PLAIN_TYPES:
            raise UnsafeMetadata(
                f"metadata pickle contains a {type(item).__name__}; only plain data (dict, list, "
                "tuple, str, int, float, bool, None) and slice are allowed"
            )
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, slice):
            stack.extend((item.start, item.stop, item.step))


def safe_unpickle(data: bytes) -> object:
    """Unpickle plain data and ``slice`` only; raise :class:`UnsafeMetadata` for anything else
    (before it is called) and :class:`MetadataError` for a malformed pickle."""
    if len(data) > MAX_METADATA_BYTES:
        raise MetadataError(f"metadata pickle is {len(data)} bytes; at most {MAX_METADATA_BYTES}")
    try:
        value = _PlainDataUnpickler(io.BytesIO(data)).load()
    except UnsafeMetadata:
        raise
    except Exception as exc:  # truncated, bad opcodes, wrong arguments to slice, ...
        raise MetadataError(f"metadata is not a readable pickle: {exc!r}") from exc
    _check_plain(value)
    return value


# -- output_slices ------------------------------------------------------------------------------


def _as_slice(head: object, value: object) -> slice:
    """A contiguous, non-empty ``slice(start, stop)`` from a slice or a [start, stop] pair."""
    if isinstance(value, slice):
        start, stop, step = value.start, value.stop, value.step
    elif isinstance(value, list | tuple) and len(value) == 2:
        (start, stop), step = value, None
    else:
        raise MetadataError(
            f"output slice {head!r} is {value!r}; expected slice(start, stop) or [start, stop]"
        )
    start = 0 if start is None else start
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop))
    if not ints or step not in (None, 1) or not 0 <= start < stop:
        raise MetadataError(
            f"output slice {head!r} is {value!r}; expected integers 0 <= start < stop, no step"
        )
    return slice(start, stop)


def _slice_table(value: object) -> dict[str, slice]:
    if not isinstance(value, dict) or not value:
        raise MetadataError(
            f"output_slices is a {type(value).__name__}; expected a non-empty dict of head name "
            "-> slice"
        )
    table: dict[str, slice] = {}
    for head, s in value.items():
        if not isinstance(head, str):
            raise MetadataError(f"output slice name {head!r} is not a string")
        table[head] = _as_slice(head, s)
    return table


def parse_output_slices(text: str | bytes) -> dict[str, slice]:
    """Read ``output_slices``: openpilot's base64 pickle of {name: slice}, or JSON
    ``{"name": [start, stop]}``. Raises :class:`MetadataError` / :class:`UnsafeMetadata`."""
    raw = text.encode() if isinstance(text, str) else bytes(text)
    if len(raw) > MAX_METADATA_BYTES:
        raise MetadataError(f"output_slices is {len(raw)} bytes; at most {MAX_METADATA_BYTES}")
    stripped = raw.strip()
    if stripped.startswith(b"{"):  # '{' is not in the base64 alphabet
        try:
            value: object = json.loads(stripped)
        except ValueError as exc:
            raise MetadataError(f"output_slices is not valid JSON: {exc}") from exc
        return _slice_table(value)
    try:
        data = base64.b64decode(stripped, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MetadataError(
            f"output_slices is neither JSON nor base64 (openpilot's pickled dict): {exc}"
        ) from exc
    return _slice_table(safe_unpickle(data))


def encode_output_slices(slices: Mapping[str, slice], *, as_json: bool = False) -> str:
    """The ``output_slices`` metadata value: openpilot's base64 pickle, or JSON."""
    table = {head: _as_slice(head, s) for head, s in slices.items()}
    if as_json:
        return json.dumps({head: [s.start, s.stop] for head, s in table.items()})
    return base64.b64encode(pickle.dumps(table, protocol=4)).decode("ascii")
