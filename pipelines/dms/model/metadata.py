"""Model metadata, read safely and within limits: openpilot's ``output_slices`` (base64 of a
pickled {name: slice}) or JSON (design C8).

The pickle is never unpickled: :func:`safe_unpickle` (:mod:`pipelines.dms.model.safe_pickle`) plays
its opcodes itself and builds plain data and ``slice`` only; any other global is refused by name
before anything could be called. Every read is bounded by :class:`MetadataLimits`
(:data:`DEFAULT_LIMITS`, :mod:`pipelines.dms.model.limits`), enforced while it reads: a
200-byte pickle of a list that shares itself a few dozen times — billions of values to whoever
walks it — is refused a few dozen opcodes in. JSON is held to the same limits: its nesting is
counted in the text before it is parsed, its integers are bounded before they are converted.

Any malformed input raises :class:`MetadataError` (a :class:`ModelContractError`), or its
:class:`UnsafeMetadata` / :class:`MetadataLimitExceeded`, with one message saying what was
expected: never a bare ``ValueError``, ``RecursionError`` or ``MemoryError``.
"""

from __future__ import annotations

import base64
import binascii
import json
import pickle
import re
from collections.abc import Mapping

from .limits import (
    DEFAULT_LIMITS,
    MetadataError,
    MetadataLimitExceeded,
    MetadataLimits,
    ModelContractError,
    UnsafeMetadata,
    check_extent,
    checked_int,
    limit_exceeded,
    shown,
    shown_value,
)
from .safe_pickle import safe_unpickle

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_METADATA_BYTES",
    "MetadataError",
    "MetadataLimitExceeded",
    "MetadataLimits",
    "ModelContractError",
    "UnsafeMetadata",
    "encode_output_slices",
    "parse_output_slices",
    "safe_unpickle",
]

MAX_METADATA_BYTES = DEFAULT_LIMITS.max_bytes
"""The longest ``output_slices`` text accepted by default (a real table is a few hundred bytes)."""

_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)
"""A string (its closing quote optional, so an unclosed one is one token, not a retry from each
quote: linear time) or a bracket, left to right."""


def _read_json(raw: bytes, limits: MetadataLimits) -> object:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MetadataError(f"output_slices JSON is not UTF-8 text: {exc}") from exc
    depth = 0
    for token in _JSON_TOKEN.finditer(text):  # brackets inside strings do not count
        bracket = token.group()
        if bracket.startswith('"'):
            continue
        depth += 1 if bracket in "[{" else -1
        if depth > limits.max_depth:
            raise limit_exceeded(limits, "max_depth", where="output_slices JSON")

    def integer(digits: str) -> int:
        if len(digits) > limits.max_int_bits // 3 + 2:  # no conversion of a huge number
            raise limit_exceeded(limits, "max_int_bits", where="output_slices JSON")
        return checked_int(int(digits), limits, where="output_slices JSON", offset=None)

    try:
        value: object = json.loads(text, parse_int=integer)
    except ModelContractError:
        raise
    except (ValueError, RecursionError) as exc:
        raise MetadataError(f"output_slices is not valid JSON: {shown(str(exc))}") from exc
    check_extent(value, limits, where="output_slices JSON")
    return value


def _as_slice(head: object, value: object) -> slice:
    """A contiguous, non-empty ``slice(start, stop)`` from a slice or a [start, stop] pair."""
    if isinstance(value, slice):
        start, stop, step = value.start, value.stop, value.step
    elif isinstance(value, list | tuple) and len(value) == 2:
        (start, stop), step = value, None
    else:
        raise MetadataError(
            f"output slice {shown_value(head)} is {shown_value(value)}; expected "
            "slice(start, stop) or [start, stop]"
        )
    start = 0 if start is None else start
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop))
    if not ints or step not in (None, 1) or not 0 <= start < stop:
        raise MetadataError(
            f"output slice {shown_value(head)} is {shown_value(value)}; expected integers "
            "0 <= start < stop, no step"
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
            raise MetadataError(f"output slice name {shown_value(head)} is not a string")
        table[head] = _as_slice(head, s)
    return table


def parse_output_slices(
    text: str | bytes, limits: MetadataLimits = DEFAULT_LIMITS
) -> dict[str, slice]:
    """Read ``output_slices``: openpilot's base64 pickle of {name: slice}, or JSON
    ``{"name": [start, stop]}``, within ``limits``. Raises :class:`MetadataError` (or its
    :class:`UnsafeMetadata`, :class:`MetadataLimitExceeded`) for anything else."""
    if isinstance(text, str):
        raw = text.encode("utf-8", "surrogatepass")
    elif isinstance(text, bytes | bytearray | memoryview):
        raw = bytes(text)
    else:
        raise MetadataError(f"output_slices is a {type(text).__name__}; expected text")
    if len(raw) > limits.max_bytes:
        raise limit_exceeded(
            limits, "max_bytes", where="output_slices", found=f" (found {len(raw)})"
        )
    stripped = raw.strip()
    if stripped.startswith(b"{"):  # '{' is not in the base64 alphabet
        return _slice_table(_read_json(stripped, limits))
    try:
        data = base64.b64decode(stripped, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MetadataError(
            f"output_slices is neither JSON nor base64 (openpilot's pickled dict): {exc}"
        ) from exc
    return _slice_table(safe_unpickle(data, limits))


def encode_output_slices(slices: Mapping[str, slice], *, as_json: bool = False) -> str:
    """The ``output_slices`` metadata value: openpilot's base64 pickle, or JSON."""
    table = {head: _as_slice(head, s) for head, s in slices.items()}
    if as_json:
        return json.dumps({head: [s.start, s.stop] for head, s in table.items()})
    return base64.b64encode(pickle.dumps(table, protocol=4)).decode("ascii")
