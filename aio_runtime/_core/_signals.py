"""Timeline signals and fences: a 64-bit value in shared memory that a device advances.

The layout follows the HCQ signal slot: 8 bytes of value (little-endian u64) at ``offset`` in a
buffer the device writes with a plain store. The host waits for ``value >= target``. GPUs write and
compare only the low 32 bits; ``compare_bits=32`` reproduces that (unsigned ``>=`` on the low dword).
``modular=True`` compares as serial numbers instead (:func:`serial_reached`, RFC 1982): a counter
that wrapped past its target has reached it. A signal whose value the host cannot map — a register
or a word of device memory reached over a bus — is read with an async probe instead (``read=``).

A signal on its own slot (no ``memory`` given) is written by the host's :meth:`TimelineSignal.set`
only, which wakes its waits: they read the value when they start, on each ``set`` and at their bound,
so a long wait costs nothing while it sleeps (a 3000 s timeout under virtual time passes in
microseconds). A signal on memory a device writes is probed (its ``policy``, or its ``watcher``):
a plain store announces nothing.

Waits are absolute by default: ``timeout`` is wall-clock time from the call. ``reset_on_progress``
gives tinygrad's inactivity semantics (the timer restarts whenever the value moves), still capped by
any enclosing deadline scope.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import numpy as np

from ._bounds import BoundArgs, WaitBound
from ._errors import HardwareTimeout, Layer, SignalTimeout
from ._notifier import Notifier
from ._policy import DEFAULT_POLICY, PollPolicy
from ._waits import probe_until
from ._watcher import MemoryWatcher

__all__ = ["Fence", "TimelineSignal", "serial_reached"]

_U64 = np.dtype("<u8")
_Word = np.ndarray[tuple[int], np.dtype[np.uint64]]
_MASK32 = 0xFFFFFFFF
_MAX64 = (1 << 64) - 1


def serial_reached(value: int, target: int, *, bits: int) -> bool:
    """Whether a ``bits``-bit counter that reads ``value`` has reached ``target``, in serial-number
    arithmetic (RFC 1982): both are taken modulo ``2**bits``, and ``value`` has reached ``target``
    when it is equal or less than half the counter's range ahead of it. So a counter that wrapped
    past its target has reached it; the answer is right as long as counter and target are never
    half the range or more apart."""
    half = 1 << (bits - 1)
    return (value - target) & ((half << 1) - 1) < half


class TimelineSignal:
    """A monotonically advancing 64-bit value in shared memory, or behind an async read.

    ``memory`` is any writable buffer (a numpy array, ``bytearray``, ``memoryview``) that the device
    — or the simulator, or another thread — writes; waits probe it. The signal holds a view, not a
    copy: stores to the buffer are seen by :attr:`value` immediately. By default the signal has a
    private 16-byte slot instead, which only :meth:`set` writes: its waits are woken by ``set``
    (from any thread) and never poll, so it takes no ``watcher``.

    ``read`` instead: an async read of the value (a register or a word of device memory over a
    bus), which every probe of a wait awaits; :meth:`read` reads it once. Such a signal has no
    :attr:`value` to look at and cannot be :meth:`set` by the host (both raise ``TypeError``); a
    read that raises ends the wait with that error (how a device reports a fault mid-wait).
    ``read`` excludes ``memory``, ``offset`` and ``watcher`` (a watcher thread probes plain reads).
    """

    def __init__(
        self,
        memory: object | None = None,
        *,
        offset: int = 0,
        name: str = "timeline",
        compare_bits: int = 64,
        modular: bool = False,
        reset_on_progress: bool = False,
        watcher: MemoryWatcher | None = None,
        policy: PollPolicy = DEFAULT_POLICY,
        layer: Layer = Layer.GPU_QUEUE,
        error: type[HardwareTimeout] = SignalTimeout,
        read: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        if compare_bits not in (32, 64):
            raise ValueError(f"compare_bits must be 32 or 64, got {compare_bits!r}")
        self.name = name
        self.compare_bits = compare_bits
        self.modular = modular
        self.reset_on_progress = reset_on_progress
        self.watcher = watcher
        self.policy = policy
        self.layer = layer
        self.error = error
        self._remote = read
        self._notifier: Notifier | None = None
        if read is not None:
            if memory is not None or offset or watcher is not None:
                raise ValueError(
                    f"signal {name!r}: read= is the signal's value; it takes no memory, offset "
                    "or watcher"
                )
            return
        if offset < 0 or offset % 8:
            raise ValueError(f"offset must be a non-negative multiple of 8, got {offset!r}")
        if memory is None:
            if watcher is not None:
                raise ValueError(
                    f"signal {name!r}: a watcher probes memory a device writes; the signal's own "
                    "slot is written only by set(), which wakes its waits (give the device's "
                    "memory, or no watcher)"
                )
            self._notifier = Notifier()
        buffer = np.zeros(2, dtype=_U64) if memory is None else memory
        try:
            word = np.frombuffer(buffer, dtype=_U64, count=1, offset=offset)  # type: ignore[call-overload]
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"signal {name!r}: expected a writable buffer with 8 bytes at offset {offset}: {exc}"
            ) from exc
        if not word.flags.writeable:
            raise ValueError(
                f"signal {name!r}: the buffer is read-only; the host must be able to set it"
            )
        self._word: _Word = word

    def _memory(self) -> _Word:
        if self._remote is not None:
            raise TypeError(f"signal {self.name!r} is behind an async read: await signal.read()")
        return self._word

    @property
    def value(self) -> int:
        """The current value, as the host reads it (all 64 bits)."""
        return int(self._memory()[0])

    async def read(self) -> int:
        """The current value, read once (through the async read, if the signal has one)."""
        return int(self._memory()[0]) if self._remote is None else await self._remote()

    def set(self, value: int) -> None:
        """Host-side store (what a device's release/fence write does). On the signal's own slot it
        wakes the waits, from any thread; a wait on a device's memory sees it at its next probe."""
        if not 0 <= value <= _MAX64:
            raise ValueError(f"signal value must fit in 64 bits unsigned, got {value!r}")
        self._memory()[0] = value
        if self._notifier is not None:
            self._notifier.notify()

    def reached(self, target: int, observed: int | None = None) -> bool:
        """Whether ``observed`` (default: the current value) satisfies ``>= target``: on the low
        32 bits with ``compare_bits=32``, as serial numbers with ``modular``."""
        value = self.value if observed is None else observed
        if self.modular:
            return serial_reached(value, target, bits=self.compare_bits)
        if self.compare_bits == 32:
            return (value & _MASK32) >= (target & _MASK32)
        return value >= target

    async def wait(
        self,
        target: int,
        *,
        timeout: float | None = None,
        within: WaitBound | None = None,
        awaited: str | None = None,
    ) -> int:
        """Wait until the signal reaches ``target``; return the value observed.

        Raises the signal's ``error`` (:class:`SignalTimeout` by default) with expected ``target``
        and the last observed value, or :class:`~aio_runtime.BudgetExhausted` when an
        enclosing deadline scope ran out first. ``within``: a bound shared with other waits
        instead of ``timeout`` (its error then applies). ``awaited`` names the wait in errors
        (default: the signal and the target).
        """
        if not 0 <= target <= _MAX64:
            raise ValueError(f"signal target must fit in 64 bits unsigned, got {target!r}")
        if awaited is None:
            compare = " (low 32 bits)" if self.compare_bits == 32 else ""
            awaited = f"timeline signal {self.name!r} >= {target}{compare}"
        bounding: BoundArgs
        if within is None:
            bounding = {
                "awaited": awaited,
                "error": self.error,
                "timeout": timeout,
                "layer": self.layer,
            }
        elif timeout is not None:
            raise TypeError("pass either timeout= or within=, not both")
        else:
            bounding = {"awaited": awaited, "within": within}
        probe = self._remote if self._remote is not None else self._word.item
        observed: int = await probe_until(
            "TimelineSignal.wait",
            probe,  # a plain read of the word as a Python int, or the async read
            lambda v: self.reached(target, v),
            bounding,
            expected=target,
            policy=self.policy,
            reset_on_progress=self.reset_on_progress,
            watcher=self.watcher,
            notifier=self._notifier,
        )
        return observed

    def fence(self, target: int) -> Fence:
        return Fence(self, target)

    def __repr__(self) -> str:
        if self._remote is not None:
            return f"TimelineSignal({self.name!r}, read={self._remote!r})"
        return f"TimelineSignal({self.name!r}, value={self.value})"


class Fence:
    """One point on a timeline: "the work that signals ``target`` on ``signal`` is done"."""

    __slots__ = ("signal", "target")

    def __init__(self, signal: TimelineSignal, target: int) -> None:
        self.signal = signal
        self.target = target

    def done(self) -> bool:
        return self.signal.reached(self.target)

    async def wait(self, *, timeout: float | None = None) -> int:
        return await self.signal.wait(self.target, timeout=timeout)

    def __repr__(self) -> str:
        try:
            done = f"done={self.done()}"
        except TypeError:  # the signal is behind an async read: nothing to look at here
            done = "behind an async read"
        return f"Fence({self.signal.name!r} >= {self.target}, {done})"
