"""Memory on both sides of the bridge: VRAM buffers (:class:`Buffer`), host buffers registered
with a session (:class:`HostMapping`), and host bytes in several parts read as one run
(:class:`Gather`: a copy-in's payload)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aio_runtime import LedgerEntry, Owned

from .deps import Span

__all__ = ["Buffer", "Bytes", "Gather", "HostMapping"]


@dataclass(eq=False)
class Buffer:
    """VRAM: ``size`` bytes at bus (and GPU) address ``address``."""

    address: int
    size: int
    owner: Owned = field(repr=False)

    @property
    def span(self) -> Span:
        return (self.address, self.address + self.size)

    def check_range(self, offset: int, size: int) -> None:
        """:class:`ValueError` unless ``size`` bytes at ``offset`` lie inside the buffer."""
        if offset < 0 or size < 0 or offset + size > self.size:
            raise ValueError(
                f"{size} bytes at offset {offset} do not fit a buffer of {self.size} bytes"
            )


@dataclass(eq=False)
class HostMapping:
    """A host buffer registered with the session (its bytes stay put until :meth:`unmap`)."""

    memory: memoryview
    entry: LedgerEntry = field(repr=False)


Bytes = bytes | bytearray | memoryview


class Gather:
    """Host bytes in one or more parts, read as one run: a copy-in's payload."""

    __slots__ = ("_parts", "_size")

    def __init__(self, parts: list[memoryview]) -> None:
        self._parts = [part for part in parts if len(part)]
        self._size = sum(len(part) for part in self._parts)

    def __len__(self) -> int:
        return self._size

    def part(self, begin: int, end: int) -> Gather:
        """Bytes ``begin`` to ``end`` (as a slice takes them)."""
        parts, at = [], 0
        for view in self._parts:
            low, high = max(begin - at, 0), min(end - at, len(view))
            if low < high:
                parts.append(view[low:high])
            at += len(view)
        return Gather(parts)

    def copy_into(self, target: bytearray, at: int, begin: int, size: int) -> None:
        """Bytes ``begin`` to ``begin + size`` into ``target`` from ``at``: one copy of each
        (through a memoryview: a bytearray's own slice assignment copies the source first)."""
        into = memoryview(target)
        for view in self._parts:
            if begin < len(view):
                take = min(size, len(view) - begin)
                into[at : at + take] = view[begin : begin + take]
                at, size = at + take, size - take
                if not size:
                    return
            begin = max(0, begin - len(view))
