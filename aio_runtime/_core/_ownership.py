"""Who owns what: a ledger of live resources, and staged acquisition with complete rollback.

:class:`Stages` acquires resources one stage after another (reserve address space, allocate
memory, map it, register it…). If a later stage fails, the earlier ones are released in reverse
order — all of them, even when one release fails — and every release failure is reported
(:class:`~aio_runtime.RollbackFailed`). Releases run shielded from cancellation and under
their own deadline, so a frame whose budget ran out still cleans up, and a hung release cannot hang
the caller.

Every stage and every allocation is recorded in the current :class:`Ledger` while it is live; tests
assert the ledger empty after a fault to prove nothing leaked. A resource whose release failed stays
in the ledger, marked as such: it was not given back.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import inspect
import itertools
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import TypeVar

import anyio

from ._clock import deadline_scope, validate_timeout
from ._errors import RollbackFailed
from ._resources import ExcInfo

__all__ = [
    "Ledger",
    "LedgerEntry",
    "LedgerKind",
    "Owned",
    "Stages",
    "current_ledger",
    "use_ledger",
]

T = TypeVar("T")
Release = Callable[[], object]
"""A release function: returns None or an awaitable."""


class LedgerKind(enum.StrEnum):
    """What a ledger entry records.

    Members are strings (``LedgerKind.WORKER_THREAD == "worker thread"``), so an entry's kind
    compares equal to its member whichever of the two it was opened with. A
    :class:`~aio_runtime.RangeAllocator` records its allocations under its own name instead
    (``"vram"``, ``"signal page"``): what was allocated from where.
    """

    STAGE = "stage"
    """A stage acquired by :class:`Stages`, until it is released."""
    WORKER_THREAD = "worker thread"
    """A blocking call made with :func:`~aio_runtime.run_in_thread`, until it has returned."""
    USB_TRANSFER = "usb transfer"
    """A submitted USB transfer, until its completion has arrived."""
    HOST_MAPPING = "host mapping"
    """Host memory mapped for a device, until it is unmapped."""


@dataclass(frozen=True)
class LedgerEntry:
    id: int
    kind: str
    """A :class:`LedgerKind`, or the name of the allocator an allocation came from."""
    description: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.description}"


class Ledger:
    """A record of live resources (transfers, allocations, mappings, acquired stages)."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._live: dict[int, LedgerEntry] = {}

    def open(self, kind: LedgerKind | str, description: str) -> LedgerEntry:
        """Record a resource that is now live; :meth:`close` it once it is given back."""
        entry = LedgerEntry(next(self._ids), kind, description)
        self._live[entry.id] = entry
        return entry

    def close(self, entry: LedgerEntry) -> None:
        if self._live.pop(entry.id, None) is None:
            raise ValueError(f"ledger entry {entry} is not live (released twice?)")

    def release_failed(self, entry: LedgerEntry, reason: str) -> None:
        """Keep ``entry`` live, noting that releasing it failed: the resource has leaked."""
        if entry.id in self._live:
            self._live[entry.id] = replace(
                entry, description=f"{entry.description} (release failed: {reason})"
            )

    def live(self) -> list[LedgerEntry]:
        return list(self._live.values())

    def assert_empty(self) -> None:
        """Raise :class:`AssertionError` listing every live resource, if any."""
        if self._live:
            listing = "; ".join(str(entry) for entry in self._live.values())
            raise AssertionError(f"{len(self._live)} resource(s) still live: {listing}")


_ledger: contextvars.ContextVar[Ledger] = contextvars.ContextVar("aio_runtime_ledger")
_process_ledger = Ledger()


def current_ledger() -> Ledger:
    """The ledger new resources are recorded in (the process-wide one unless :func:`use_ledger`)."""
    return _ledger.get(_process_ledger)


def swap_process_ledger(ledger: Ledger) -> Ledger:
    """Replace the process-wide ledger (the pytest ``ledger`` fixture); returns the previous one."""
    global _process_ledger
    previous, _process_ledger = _process_ledger, ledger
    return previous


@contextlib.contextmanager
def use_ledger(ledger: Ledger) -> Iterator[Ledger]:
    """Record resources created inside the block (and tasks started from it) in ``ledger``."""
    token = _ledger.set(ledger)
    try:
        yield ledger
    finally:
        _ledger.reset(token)


@dataclass
class _Stage:
    label: str
    release: Release
    entry: LedgerEntry


async def _release_all(
    name: str, stages: list[_Stage], ledger: Ledger, cleanup_timeout: float
) -> list[Exception]:
    """Release ``stages`` last-first; attempt every one; return the failures.

    Each release runs shielded from cancellation under its own ``cleanup_timeout``. A release that
    fails or overruns stays in the ledger (marked failed): the resource was not given back.
    """
    failures: list[Exception] = []
    for stage in reversed(stages):
        failure: Exception | None = None
        try:
            with (
                anyio.CancelScope(shield=True),
                deadline_scope(
                    cleanup_timeout, name=f"release {stage.label!r} of {name!r}", detached=True
                ),
                anyio.move_on_after(cleanup_timeout) as scope,
            ):
                result = stage.release()
                if inspect.isawaitable(result):
                    await result
            if scope.cancelled_caught:
                failure = TimeoutError(
                    f"releasing {stage.label!r} of {name!r} took over {cleanup_timeout} s"
                )
        except Exception as exc:
            exc.add_note(f"while releasing {stage.label!r} of {name!r}")
            failure = exc
        if failure is None:
            ledger.close(stage.entry)
        else:
            ledger.release_failed(stage.entry, str(failure))
            failures.append(failure)
    return failures


class Owned:
    """Resources handed over by :meth:`Stages.commit`; :meth:`release` frees them in reverse order."""

    def __init__(self, name: str, stages: list[_Stage], ledger: Ledger, cleanup_timeout: float):
        self.name = name
        self._stages = stages
        self._ledger = ledger
        self._cleanup_timeout = cleanup_timeout
        self._released: anyio.Event | None = None
        self._failures: list[Exception] = []

    @property
    def released(self) -> bool:
        """True once every stage was released successfully."""
        return self._released is not None and self._released.is_set() and not self._failures

    async def release(self) -> None:
        """Release everything, once; raises :class:`RollbackFailed` listing any failures.

        A second caller waits for the first release to finish (it is bounded: each stage has
        ``cleanup_timeout``) and gets the same outcome.
        """
        if self._released is None:
            self._released = anyio.Event()
            stages, self._stages = self._stages, []
            try:
                self._failures = await _release_all(
                    self.name, stages, self._ledger, self._cleanup_timeout
                )
            finally:
                self._released.set()
        else:
            await self._released.wait()
        if self._failures:
            raise RollbackFailed(
                f"releasing {self.name!r}: {len(self._failures)} release(s) failed",
                self._failures,
            )


class Stages:
    """Staged acquisition with rollback::

        async with Stages("buffer 3") as stages:
            va = await stages.acquire(lambda: va_space.alloc(size), va_space.free, label="va")
            pa = await stages.acquire(lambda: vram.alloc(size), vram.free, label="vram")
            await stages.acquire(lambda: map_range(va, pa), lambda _: unmap_range(va), label="map")
            buffer = Buffer(va, pa, owner=stages.commit())

    If the block raises, every acquired stage is released (reverse order) and the exception
    propagates unchanged — or, if some release failed too, as :class:`RollbackFailed` holding the
    original exception first and then each release failure. A block that ends without
    :meth:`commit` releases its stages as well: uncommitted resources never outlive the block.

    Each release runs shielded from cancellation with ``cleanup_timeout`` seconds of its own (and
    its own deadline scope, so waits inside it still work after a frame's budget is spent). An
    ``acquire`` step should be atomic: if it is cancelled half-way, there is nothing to release yet.
    """

    def __init__(self, name: str, *, cleanup_timeout: float = 5.0, ledger: Ledger | None = None):
        self.name = name
        checked = validate_timeout(cleanup_timeout, what="cleanup_timeout")
        assert checked is not None
        self.cleanup_timeout = checked
        self._ledger = ledger if ledger is not None else current_ledger()
        self._stages: list[_Stage] = []
        self._committed = False

    async def acquire(
        self,
        acquire: Callable[[], T] | Callable[[], Awaitable[T]],
        release: Callable[[T], object],
        *,
        label: str,
    ) -> T:
        """Run ``acquire`` and remember ``release(result)`` for rollback."""
        self._check_open()
        result = acquire()
        if inspect.isawaitable(result):
            result = await result
        resource: T = result
        self.add(lambda: release(resource), label=label)
        return resource

    def add(self, release: Release, *, label: str) -> None:
        """Remember an already-acquired resource's ``release`` for rollback."""
        self._check_open()
        self._stages.append(
            _Stage(label, release, self._ledger.open(LedgerKind.STAGE, f"{self.name}/{label}"))
        )

    def commit(self) -> Owned:
        """Hand every acquired stage to the caller; the block will no longer release them."""
        self._check_open()
        self._committed = True
        owned = Owned(self.name, list(self._stages), self._ledger, self.cleanup_timeout)
        self._stages.clear()
        return owned

    def _check_open(self) -> None:
        if self._committed:
            raise RuntimeError(f"stages {self.name!r} already committed")

    async def __aenter__(self) -> Stages:
        return self

    async def __aexit__(self, *exc_info: *ExcInfo) -> None:
        exc = exc_info[1]
        stages, self._stages = self._stages, []
        failures = await _release_all(self.name, stages, self._ledger, self.cleanup_timeout)
        if not failures:
            return
        if exc is None:
            raise RollbackFailed(
                f"releasing {self.name!r}: {len(failures)} release(s) failed", failures
            )
        if isinstance(exc, Exception):
            raise RollbackFailed(
                f"acquiring {self.name!r} failed and {len(failures)} release(s) failed during rollback",
                [exc, *failures],
            ) from None
        # Cancellation or interpreter exit: let it propagate, but do not lose the release failures.
        for failure in failures:
            exc.add_note(f"rollback of {self.name!r} also failed: {failure!r}")
