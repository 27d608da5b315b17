"""Joining the service's stages: the two kinds of slot, and the frame accounting rule.

A slot holds at most one item between two stages. Live, a :class:`LatestSlot`: a stage that
produces faster than the next consumes replaces the waiting item with the newer one; the replaced
item is *dropped* and handed to ``on_drop`` so it is counted — never lost silently (design C7).
Putting never blocks, so a slow stage never holds up the camera, and a frame never waits behind a
stale one. Replaying, a :class:`HandoffSlot`: the producer waits until the consumer has taken the
item before it hands on the next, so nothing is dropped and each stage goes at the next one's pace.
Both are :class:`Slot`: stages ``await slot.send(item)`` and ``await slot.get()``.

:class:`FrameAccounting` keeps the rule that every frame that reaches the service ends as exactly
one of: published valid, published invalid (with a reason), or dropped (counted, by stage).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import anyio

from aio_runtime import reason_kind

__all__ = ["FrameAccounting", "HandoffSlot", "LatestSlot", "Slot", "SlotClosed"]

T = TypeVar("T")


class SlotClosed(Exception):
    """The producer closed the slot and nothing is left in it."""


class Slot(Protocol[T]):
    """Between two stages: ``send`` hands an item on, ``get`` takes it; ``close`` ends it."""

    name: str

    async def send(self, item: T) -> None: ...

    async def get(self) -> T: ...

    def close(self) -> None: ...


class _OneItem(Generic[T]):
    """A slot's one waiting item, and a consumer's wait for it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._waiting: list[T] = []
        """The item waiting, if any (at most one)."""
        self._closed = False
        self._wake = anyio.Event()

    async def _next(self) -> T:
        """The waiting item, or wait for one; :class:`SlotClosed` once closed and empty."""
        while not self._waiting:
            if self._closed:
                raise SlotClosed(f"{self.name}: closed")
            self._wake = anyio.Event()
            await self._wake.wait()
        return self._waiting.pop()

    def close(self) -> None:
        """No more items; a consumer still gets the one waiting, then :class:`SlotClosed`."""
        self._closed = True
        self._wake.set()


class LatestSlot(_OneItem[T]):
    """Latest wins: :meth:`put` never waits, and an item not taken yet is dropped (``on_drop``)
    in favour of a newer one."""

    def __init__(self, name: str, on_drop: Callable[[T], object]) -> None:
        super().__init__(name)
        self._on_drop = on_drop

    def put(self, item: T) -> None:
        """Offer ``item``; one already waiting is dropped (``on_drop``) in its favour."""
        if self._closed:
            raise SlotClosed(f"{self.name}: closed")
        if self._waiting:
            self._on_drop(self._waiting.pop())
        self._waiting.append(item)
        self._wake.set()

    async def send(self, item: T) -> None:
        """:meth:`put`: never waits."""
        self.put(item)

    async def get(self) -> T:
        """The waiting item, or wait for one; :class:`SlotClosed` once closed and empty."""
        return await self._next()


class HandoffSlot(_OneItem[T]):
    """One item at a time, handed from hand to hand: :meth:`send` returns once the consumer has
    taken the item (``on_taken`` is called with it at that moment), so nothing is dropped and
    the producer goes at the consumer's pace."""

    def __init__(self, name: str, on_taken: Callable[[T], object] | None = None) -> None:
        super().__init__(name)
        self._on_taken = on_taken
        self._taken = anyio.Event()

    async def send(self, item: T) -> None:
        """Hand ``item`` on; return once it has been taken (one producer: the stage before).
        Cancelled before it is taken, the item is withdrawn."""
        if self._closed:
            raise SlotClosed(f"{self.name}: closed")
        self._waiting.append(item)
        self._taken = anyio.Event()
        self._wake.set()
        try:
            await self._taken.wait()
        except BaseException:
            if self._waiting and self._waiting[0] is item:
                self._waiting.clear()  # not taken: withdrawn
            raise

    async def get(self) -> T:
        """The item handed on, or wait for one; :class:`SlotClosed` once closed and empty."""
        item = await self._next()
        if self._on_taken is not None:
            self._on_taken(item)
        self._taken.set()
        return item


@dataclass
class FrameAccounting:
    """Counts of how frames ended. ``received == valid + invalid + dropped + in_flight``."""

    received: int = 0
    valid: int = 0
    invalid: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    late: int = 0
    """Of the valid frames, those published after their deadline."""

    def receive(self) -> None:
        self.received += 1

    def published(self, valid: bool, reason: str = "", *, late: bool = False) -> str | None:
        """Count a published frame (a valid one ``late`` or not); an invalid one under its
        reason's kind, which is returned (None for a valid frame)."""
        if valid:
            self.valid += 1
            self.late += late
            return None
        kind = reason_kind(reason) or "unspecified"
        self.invalid[kind] += 1
        return kind

    def drop(self, stage: str) -> None:
        self.dropped[stage] += 1

    @property
    def ended(self) -> int:
        return self.valid + sum(self.invalid.values()) + sum(self.dropped.values())

    @property
    def in_flight(self) -> int:
        return self.received - self.ended

    def check(self, in_flight: int = 0) -> None:
        """Raise if frames were lost or counted twice (``in_flight`` still inside the service)."""
        if self.in_flight != in_flight:
            raise AssertionError(
                f"frame accounting: {self.received} received, {self.valid} valid, "
                f"{sum(self.invalid.values())} invalid, {sum(self.dropped.values())} dropped: "
                f"{self.in_flight} unaccounted, expected {in_flight}"
            )
