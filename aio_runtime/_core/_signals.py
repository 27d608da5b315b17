"""Timeline signals and fences: a 64-bit value in shared memory that a device advances.

The layout follows the HCQ signal slot: 8 bytes of value (little-endian u64) at ``offset`` in a
buffer the device writes with a plain store. The host waits for ``value >= target``. GPUs write and
compare only the low 32 bits; ``compare_bits=32`` reproduces that (unsigned ``>=`` on the low dword).

Waits are absolute by default: ``timeout`` is wall-clock time from the call. ``reset_on_progress``
gives tinygrad's inactivity semantics (the timer restarts whenever the value moves), still capped by
any enclosing deadline scope.
"""

from __future__ import annotations

import numpy as np

from ._errors import HardwareTimeout, Layer, SignalTimeout
from ._waits import DEFAULT_POLICY, PollPolicy, wait_until
from ._watcher import MemoryWatcher

__all__ = ["Fence", "TimelineSignal"]

_U64 = np.dtype("<u8")
_MASK32 = 0xFFFFFFFF
_MAX64 = (1 << 64) - 1


class TimelineSignal:
    """A monotonically advancing 64-bit value in shared memory.

    ``memory`` is any writable buffer (a numpy array, ``bytearray``, ``memoryview``) that the device
    — or the simulator, or another thread — writes; by default a private 16-byte slot. The signal
    holds a view, not a copy: stores to the buffer are seen by :attr:`value` immediately.
    """

    def __init__(
        self,
        memory: object | None = None,
        *,
        offset: int = 0,
        name: str = "timeline",
        compare_bits: int = 64,
        reset_on_progress: bool = False,
        watcher: MemoryWatcher | None = None,
        policy: PollPolicy = DEFAULT_POLICY,
        layer: Layer = Layer.GPU_QUEUE,
        error: type[HardwareTimeout] = SignalTimeout,
    ) -> None:
        if compare_bits not in (32, 64):
            raise ValueError(f"compare_bits must be 32 or 64, got {compare_bits!r}")
        if offset < 0 or offset % 8:
            raise ValueError(f"offset must be a non-negative multiple of 8, got {offset!r}")
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
        self._word = word
        self.name = name
        self.compare_bits = compare_bits
        self.reset_on_progress = reset_on_progress
        self.watcher = watcher
        self.policy = policy
        self.layer = layer
        self.error = error

    @property
    def value(self) -> int:
        """The current value, as the host reads it (all 64 bits)."""
        return int(self._word[0])

    def set(self, value: int) -> None:
        """Host-side store (what a device's release/fence write does)."""
        if not 0 <= value <= _MAX64:
            raise ValueError(f"signal value must fit in 64 bits unsigned, got {value!r}")
        self._word[0] = value

    def reached(self, target: int, observed: int | None = None) -> bool:
        """Whether ``observed`` (default: the current value) satisfies ``>= target``."""
        value = self.value if observed is None else observed
        if self.compare_bits == 32:
            return (value & _MASK32) >= (target & _MASK32)
        return value >= target

    async def wait(self, target: int, *, timeout: float | None = None) -> int:
        """Wait until the signal reaches ``target``; return the value observed.

        Raises the signal's ``error`` (:class:`SignalTimeout` by default) with expected ``target``
        and the last observed value, or :class:`~aio_runtime.BudgetExhausted` when an
        enclosing deadline scope ran out first.
        """
        if not 0 <= target <= _MAX64:
            raise ValueError(f"signal target must fit in 64 bits unsigned, got {target!r}")
        compare = " (low 32 bits)" if self.compare_bits == 32 else ""
        return await wait_until(
            self._word.item,  # a plain read of the word, as a Python int
            lambda v: self.reached(target, v),
            awaited=f"timeline signal {self.name!r} >= {target}{compare}",
            error=self.error,
            timeout=timeout,
            layer=self.layer,
            expected=target,
            policy=self.policy,
            reset_on_progress=self.reset_on_progress,
            watcher=self.watcher,
        )

    def fence(self, target: int) -> Fence:
        return Fence(self, target)

    def __repr__(self) -> str:
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
        return f"Fence({self.signal.name!r} >= {self.target}, done={self.done()})"
