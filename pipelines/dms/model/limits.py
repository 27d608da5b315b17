"""What reading model metadata may cost, and the errors a read raises (design C8).

:class:`MetadataLimits` bounds a read of ``output_slices`` — its length, its nesting, how many
values a walk of it would meet, how many references it shares, how large its integers are — and
:class:`MetadataLimitExceeded` says which bound was crossed and where. The readers
(:mod:`pipelines.dms.model.safe_pickle`, :mod:`pipelines.dms.model.metadata`) enforce them while they
read; :func:`check_extent` measures a finished value once more, in time proportional to its real
size however much it shares.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass

__all__ = [
    "DEFAULT_LIMITS",
    "MetadataError",
    "MetadataLimitExceeded",
    "MetadataLimits",
    "ModelContractError",
    "UnsafeMetadata",
    "check_extent",
    "checked_int",
    "grow_extent",
    "limit_exceeded",
    "shown",
    "shown_value",
]


class ModelContractError(ValueError):
    """A model does not fit the contract, or its metadata cannot be read."""


class MetadataError(ModelContractError):
    """The model's metadata is missing or malformed."""


class UnsafeMetadata(MetadataError):
    """A metadata pickle asks for something other than plain data and ``slice`` (a global such as
    ``os.system``, a persistent id, a set, bytes): refused before anything ran."""


class MetadataLimitExceeded(MetadataError):
    """Metadata goes past one of its :class:`MetadataLimits`, refused where the limit was crossed.

    ``limit``: the field of :class:`MetadataLimits`; ``allowed``: its value; ``offset``: the byte
    of the pickle whose opcode crossed it (``None`` for JSON, or for a check of the whole value)."""

    def __init__(self, message: str, *, limit: str, allowed: int, offset: int | None) -> None:
        super().__init__(message)
        self.limit = limit
        self.allowed = allowed
        self.offset = offset


@dataclass(frozen=True)
class MetadataLimits:
    """What reading metadata may cost. A real ``output_slices`` table — some twenty heads — is a
    few hundred bytes, three levels deep, about a hundred values, no shared reference and no
    integer past the output's length: each default leaves a wide margin and keeps the worst
    metadata within a few milliseconds of work."""

    max_bytes: int = 64 * 1024
    """Length of the ``output_slices`` text (base64 or JSON); for :func:`safe_unpickle`, of the
    pickle."""
    max_depth: int = 32
    """Containers (dict, list, tuple, slice) nested in one another."""
    max_objects: int = 10_000
    """Values read. In a pickle, every value made counts one (slice's argument tuple included) and
    every shared reference counts as many as the value it refers to holds; and the result may
    hold no more than this as a walk that follows every reference meets them (a value reached
    through n references counting n times, a reference back to an enclosing container once, as
    ``repr``'s ``[...]``). This is what bounds a structure that shares itself, whose walk grows
    exponentially with its length in bytes."""
    max_shared_references: int = 64
    """Second and later references to a value: the pickle's memo reads (GET, BINGET,
    LONG_BINGET) and DUP. JSON has none."""
    max_int_bits: int = 31
    """Integers must have ``abs(n) < 2 ** max_int_bits``; a bigger one is refused where it is
    read, before it could be printed or compared."""

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_depth", "max_objects", "max_shared_references"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if not isinstance(self.max_int_bits, int) or not 1 <= self.max_int_bits <= 64:
            raise ValueError(f"max_int_bits must be an int in [1, 64], got {self.max_int_bits!r}")


DEFAULT_LIMITS = MetadataLimits()

_LIMIT_WHAT = {
    "max_bytes": "bytes",
    "max_depth": "levels of nesting",
    "max_objects": "values (a shared value counted once per reference)",
    "max_shared_references": "shared references (memo reads and DUPs)",
    "max_int_bits": "bits in an integer",
}


def limit_exceeded(
    limits: MetadataLimits, limit: str, *, where: str, offset: int | None = None, found: str = ""
) -> MetadataLimitExceeded:
    """The error for ``where`` (``"metadata pickle"``, ...) going past ``limits.<limit>``; ``found``
    (optional, with a leading space) says by how much."""
    allowed = int(getattr(limits, limit))
    at = f" at byte {offset}" if offset is not None else ""
    return MetadataLimitExceeded(
        f"{where} exceeds a limit{at}: at most {allowed} {_LIMIT_WHAT[limit]}{found}; expected "
        "a table of head name -> slice within the metadata limits",
        limit=limit,
        allowed=allowed,
        offset=offset,
    )


def checked_int(value: int, limits: MetadataLimits, *, where: str, offset: int | None) -> int:
    """``value``, if it is within ``limits.max_int_bits``; :class:`MetadataLimitExceeded` if not."""
    if abs(value) >> limits.max_int_bits:
        raise limit_exceeded(
            limits,
            "max_int_bits",
            where=where,
            offset=offset,
            found=f" (found a {value.bit_length()}-bit integer)",
        )
    return value


def grow_extent(
    extent: list[int],
    size: int,
    depth: int,
    limits: MetadataLimits,
    *,
    where: str,
    offset: int | None = None,
) -> None:
    """A child of ``size`` values ``depth`` levels deep joined the container whose extent is
    ``extent`` (values, levels): grow it, refusing it past ``max_objects`` or ``max_depth``."""
    extent[0] += size
    extent[1] = max(extent[1], depth + 1)
    if extent[0] > limits.max_objects:
        raise limit_exceeded(limits, "max_objects", where=where, offset=offset)
    if extent[1] > limits.max_depth:
        raise limit_exceeded(limits, "max_depth", where=where, offset=offset)


_CONTAINERS = (dict, list, tuple, slice)


def _children(value: object) -> tuple[object, ...]:
    if isinstance(value, dict):
        return (*value.keys(), *value.values())
    if isinstance(value, slice):
        return (value.start, value.stop, value.step)
    return tuple(value) if isinstance(value, list | tuple) else ()


def check_extent(value: object, limits: MetadataLimits, *, where: str) -> None:
    """Refuse ``value`` if a walk following every reference would meet more than
    ``max_objects`` values or more than ``max_depth`` levels. Each container is visited once (its
    extent is remembered), so the check costs the value's real size, however much it shares."""
    done: dict[int, tuple[int, int]] = {}
    on_path: set[int] = set()
    frames: list[tuple[object, list[object], list[int]]] = []

    def add(acc: list[int], size: int, depth: int) -> None:
        grow_extent(acc, size, depth, limits, where=where)

    if not isinstance(value, _CONTAINERS):
        return
    on_path.add(id(value))
    frames.append((value, list(reversed(_children(value))), [1, 1]))
    while frames:
        node, pending, acc = frames[-1]
        if pending:
            child = pending.pop()
            if not isinstance(child, _CONTAINERS):
                add(acc, 1, 0)
            elif id(child) in done:
                add(acc, *done[id(child)])
            elif id(child) in on_path:  # a reference back to an enclosing container
                add(acc, 1, 0)
            else:
                on_path.add(id(child))
                frames.append((child, list(reversed(_children(child))), [1, 1]))
            continue
        frames.pop()
        on_path.discard(id(node))
        done[id(node)] = (acc[0], acc[1])
        if frames:
            add(frames[-1][2], acc[0], acc[1])


# -- messages ----------------------------------------------------------------------------------

_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxdict = _REPR.maxlist = _REPR.maxtuple = 4
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 40


def shown_value(value: object) -> str:
    """``value`` as it may appear in a message: at most a line, however large or self-sharing."""
    return _REPR.repr(value)


def shown(text: str, *, width: int = 60) -> str:
    """Text from the metadata (a name, a parser's complaint) as it may appear in a message:
    printable, at most ``width`` characters and an ellipsis."""
    text = text if text.isprintable() else ascii(text)
    return text if len(text) <= width else f"{text[:width]}..."
