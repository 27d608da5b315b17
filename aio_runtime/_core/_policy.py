"""How a probe is repeated on the event loop: a short spin, then exponential backoff."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = ["DEFAULT_POLICY", "PollPolicy"]


@dataclass(frozen=True)
class PollPolicy:
    """How a probe is repeated on the event loop.

    First ``spin`` immediate re-reads (each yields to the loop once, so other tasks still run), then
    sleeps starting at ``first_interval`` and growing by ``factor`` up to ``max_interval``.
    ``yield_first``: yield to the loop once before the first read too — for a read that costs a
    transfer, whose condition is usually met by work another task does next. Spins
    are counted, not timed, so a spin cannot run forever under a virtual clock. asyncio's selector
    rounds sleeps up to whole milliseconds; for sub-millisecond detection of a memory word use a
    :class:`~aio_runtime.MemoryWatcher` instead.
    """

    spin: int = 4
    first_interval: float = 0.0002
    max_interval: float = 0.005
    factor: float = 2.0
    yield_first: bool = False

    def __post_init__(self) -> None:
        if self.spin < 0:
            raise ValueError(f"spin must be >= 0, got {self.spin}")
        for name in ("first_interval", "max_interval"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if self.max_interval < self.first_interval:
            raise ValueError("max_interval must be >= first_interval")
        if not (math.isfinite(self.factor) and self.factor >= 1.0):
            raise ValueError(f"factor must be >= 1, got {self.factor!r}")

    def intervals(self) -> Iterator[float]:
        """Delays between successive reads: ``spin`` zeros, then the backoff sequence."""
        for _ in range(self.spin):
            yield 0.0
        interval = self.first_interval
        while True:
            yield interval
            interval = min(self.max_interval, interval * self.factor)


DEFAULT_POLICY = PollPolicy()


def differs(a: object, b: object) -> bool:
    """Whether two probe values differ; numpy arrays compare element-wise."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return not np.array_equal(np.asarray(a), np.asarray(b))
    try:
        return bool(a != b)
    except Exception:
        return True
