"""Time and deadlines.

The runtime reads time from one place, :func:`now`: the running event loop's monotonic clock
(``anyio.current_time()``). That clock is the injection point. Tests replace it by running the loop
on a virtual clock — :func:`aio_runtime.testing.virtual_time` on asyncio, ``trio.testing.MockClock``
on trio — so every deadline, timer and timeout in the runtime moves together and a 30 s hardware
timeout takes milliseconds.

Deadlines are absolute (a time on that clock, not a duration), so nesting is a ``min``. A
:func:`deadline_scope` bounds every runtime wait inside it — in this task and in tasks started from
it, because the scope travels in a :mod:`contextvars` variable — and a wait's own timeout is cut
to the time the scope has left.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass

import anyio

from ._loop import loop_clock

__all__ = [
    "Deadline",
    "current_deadline",
    "deadline_scope",
    "loop_clock",
    "now",
    "validate_timeout",
]


def now() -> float:
    """Seconds on the running event loop's monotonic clock."""
    try:  # asyncio: its loop's clock, as anyio reads it, without the backend lookup
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return anyio.current_time()


def validate_timeout(timeout: float | None, *, what: str = "timeout") -> float | None:
    """Return ``timeout`` as a float, or ``None`` unchanged.

    Raises :class:`TypeError` for a non-number and :class:`ValueError` for a negative, NaN or
    infinite value: an infinite timeout is no bound at all.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {type(timeout).__name__}")
    if math.isnan(timeout) or timeout < 0 or math.isinf(timeout):
        raise ValueError(
            f"{what} must be a finite, non-negative number of seconds, got {timeout!r}"
        )
    return float(timeout)


@dataclass(frozen=True)
class Deadline:
    """An absolute deadline on the loop clock, named for error messages (``"frame 42"``)."""

    at: float
    started: float
    name: str

    @property
    def budget(self) -> float:
        """The whole budget the scope was given, in seconds."""
        return self.at - self.started

    def remaining(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.at - now())


_current: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar(
    "aio_runtime_deadline", default=None
)


def current_deadline() -> Deadline | None:
    """The innermost effective deadline of the calling context, or ``None``."""
    return _current.get()


@contextlib.contextmanager
def deadline_scope(
    timeout: float | None = None,
    *,
    at: float | None = None,
    name: str = "deadline",
    detached: bool = False,
    started: float | None = None,
) -> Iterator[Deadline]:
    """Bound every runtime wait inside the block by a deadline.

    Give exactly one of ``timeout`` (seconds from now) or ``at`` (an absolute time from
    :func:`now`). Nested scopes never extend an outer one: the effective deadline is the earliest,
    and it keeps the name of the scope that set it, so a wait cut short reports which budget ran out
    (:class:`~aio_runtime.BudgetExhausted`).

    ``detached=True`` ignores enclosing scopes. It is for cleanup that must still run, with its own
    bound, after an enclosing budget is spent (releasing what a failed frame acquired).

    ``started``: when the budget began, if before the block (a frame's budget starts at its start
    of frame): a ``timeout`` counts from it, and errors report the whole budget and the time since,
    not what was left.

    The scope bounds waits; it does not cancel plain computation. Leaving the block restores the
    enclosing deadline.
    """
    if (timeout is None) == (at is None):
        raise TypeError("deadline_scope() takes exactly one of 'timeout' or 'at'")
    start = now() if started is None else started
    if timeout is not None:
        bounded = validate_timeout(timeout)
        assert bounded is not None
        deadline_at = start + bounded
    else:
        assert at is not None
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
            raise ValueError(f"deadline 'at' must be a finite time on the loop clock, got {at!r}")
        deadline_at = float(at)
    scope = Deadline(at=deadline_at, started=start, name=name)
    outer = None if detached else _current.get()
    effective = outer if outer is not None and outer.at <= scope.at else scope
    token = _current.set(effective)
    try:
        yield effective
    finally:
        _current.reset(token)
