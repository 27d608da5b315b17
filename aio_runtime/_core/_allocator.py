"""A range allocator that frees and coalesces (for device address space, VRAM, SRAM windows).

First fit over a sorted free list; every free merges with its neighbours, so freeing everything
returns the allocator to a single free range. Exhaustion raises
:class:`~aio_runtime.OutOfMemory` with the request and the largest free range. Every live
allocation is recorded in the current :class:`~aio_runtime.Ledger`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ._errors import Layer, OutOfMemory
from ._ownership import Ledger, LedgerEntry, current_ledger

__all__ = ["AllocatorStatistics", "Range", "RangeAllocator"]


@dataclass(frozen=True, order=True)
class Range:
    """``[offset, offset + size)`` in the allocator's address space."""

    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size

    def __repr__(self) -> str:
        return f"Range(0x{self.offset:x}, size=0x{self.size:x})"


@dataclass(frozen=True)
class AllocatorStatistics:
    capacity: int
    used: int
    free: int
    largest_free: int
    live_allocations: int
    free_ranges: int
    peak_used: int
    allocations: int
    frees: int
    failures: int


def _check_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")


class RangeAllocator:
    """Allocates aligned ranges of ``[base, base + size)``."""

    def __init__(
        self,
        size: int,
        *,
        base: int = 0,
        name: str = "range allocator",
        layer: Layer = Layer.HOST,
        ledger: Ledger | None = None,
    ) -> None:
        _check_int("size", size)
        _check_int("base", base)
        if size <= 0:
            raise ValueError(f"size must be > 0, got {size}")
        if base < 0:
            raise ValueError(f"base must be >= 0, got {base}")
        self.name = name
        self.base = base
        self.capacity = size
        self.layer = layer
        self._ledger = ledger if ledger is not None else current_ledger()
        self._free_starts: list[int] = [base]
        self._free_ends: dict[int, int] = {base: base + size}
        self._live: dict[int, tuple[int, LedgerEntry]] = {}
        self._used = 0
        self._peak = 0
        self._allocations = 0
        self._frees = 0
        self._failures = 0

    def alloc(self, size: int, *, align: int = 1) -> Range:
        """The first free range of ``size`` bytes whose offset is a multiple of ``align``."""
        _check_int("size", size)
        _check_int("align", align)
        if size <= 0:
            raise ValueError(f"{self.name}: size must be > 0, got {size}")
        if align <= 0 or align & (align - 1):
            raise ValueError(f"{self.name}: align must be a power of two, got {align}")
        for start in self._free_starts:
            end = self._free_ends[start]
            offset = (start + align - 1) & ~(align - 1)
            if offset + size <= end:
                self._carve(start, end, offset, size)
                self._used += size
                self._peak = max(self._peak, self._used)
                self._allocations += 1
                entry = self._ledger.open(self.name, f"0x{offset:x}+0x{size:x}")
                self._live[offset] = (size, entry)
                return Range(offset, size)
        self._failures += 1
        largest = self.largest_free()
        raise OutOfMemory(
            f"{self.name}: no free range of 0x{size:x} bytes aligned to 0x{align:x} "
            f"(free 0x{self.capacity - self._used:x} of 0x{self.capacity:x}, "
            f"largest free range 0x{largest:x})",
            requested=size,
            alignment=align,
            largest_free=largest,
            layer=self.layer,
        )

    def _carve(self, start: int, end: int, offset: int, size: int) -> None:
        index = bisect.bisect_left(self._free_starts, start)
        del self._free_starts[index]
        del self._free_ends[start]
        pieces = [(start, offset), (offset + size, end)]
        for piece_start, piece_end in pieces:
            if piece_end > piece_start:
                bisect.insort(self._free_starts, piece_start)
                self._free_ends[piece_start] = piece_end

    def free(self, allocation: Range) -> None:
        """Return ``allocation``; it merges with free neighbours. Freeing twice is an error."""
        live = self._live.get(allocation.offset)
        if live is None or live[0] != allocation.size:
            raise ValueError(f"{self.name}: {allocation!r} is not a live allocation")
        del self._live[allocation.offset]
        self._ledger.close(live[1])
        self._used -= allocation.size
        self._frees += 1
        start, end = allocation.offset, allocation.end
        index = bisect.bisect_left(self._free_starts, start)
        if index > 0:
            before = self._free_starts[index - 1]
            if self._free_ends[before] == start:
                start = before
                del self._free_starts[index - 1]
                del self._free_ends[before]
                index -= 1
        if index < len(self._free_starts) and self._free_starts[index] == end:
            end = self._free_ends.pop(end)
            del self._free_starts[index]
        self._free_starts.insert(index, start)
        self._free_ends[start] = end

    def largest_free(self) -> int:
        return max((e - s for s, e in self._free_ends.items()), default=0)

    def free_ranges(self) -> list[Range]:
        return [Range(s, self._free_ends[s] - s) for s in self._free_starts]

    def live(self) -> list[Range]:
        return sorted(Range(offset, size) for offset, (size, _) in self._live.items())

    def statistics(self) -> AllocatorStatistics:
        return AllocatorStatistics(
            capacity=self.capacity,
            used=self._used,
            free=self.capacity - self._used,
            largest_free=self.largest_free(),
            live_allocations=len(self._live),
            free_ranges=len(self._free_starts),
            peak_used=self._peak,
            allocations=self._allocations,
            frees=self._frees,
            failures=self._failures,
        )
