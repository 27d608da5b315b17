"""Supervised device sessions: open → ready → fault → teardown → backoff → reopen, for as long as
the owner runs.

There is no sticky error and no silent giving up: after each failure the supervisor tears the
session down (leaving its ``async with`` block), waits an exponentially growing delay up to a cap,
and opens a fresh session; past the cap it keeps trying at the cap. Every attempt and every failure
is reported to an :class:`~aio_runtime.health.AvailabilityMachine` as ``UNAVAILABLE`` with a reason,
and counted in :meth:`Supervisor.statistics`. Only the owner ends supervision, by cancelling it;
a session's ``run`` returning normally means its work is finished, and :meth:`Supervisor.run`
returns too.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Generic, TypeVar

import anyio

from ._clock import now, validate_timeout
from ._health import AvailabilityMachine
from ._log import get_logger
from ._waits import pause

__all__ = ["Backoff", "Supervisor", "SupervisorStatistics"]

S = TypeVar("S")

_log = get_logger("aio_runtime.supervision")


@dataclass(frozen=True)
class Backoff:
    """Delay before attempt ``n + 1`` after ``n`` consecutive failures: ``initial · factorⁿ⁻¹``,
    capped at ``cap``, spread by ± ``jitter`` (a fraction) so a fleet does not retry in lockstep."""

    initial: float = 0.1
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.initial) and self.initial > 0):
            raise ValueError(
                f"initial must be a finite number of seconds > 0, got {self.initial!r}"
            )
        if not (math.isfinite(self.cap) and self.cap >= self.initial):
            raise ValueError(f"cap must be finite and >= initial, got {self.cap!r}")
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ValueError(f"factor must be >= 1, got {self.factor!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter!r}")

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        if failures < 1:
            raise ValueError(f"failures must be >= 1, got {failures}")
        exponent = failures - 1
        reaches_cap = self.factor > 1 and exponent >= math.log(self.cap / self.initial, self.factor)
        base = self.cap if reaches_cap else min(self.cap, self.initial * self.factor**exponent)
        if self.jitter:
            base *= 1 + self.jitter * (2 * (rng or random).random() - 1)
        return min(self.cap, base)


@dataclass(frozen=True)
class SupervisorStatistics:
    attempts: int
    failures: int
    consecutive_failures: int
    last_error: str | None
    next_delay: float | None
    """Delay before the next attempt while backing off, else None."""


class Supervisor(Generic[S]):
    """Keeps a session running.

    ``open_session()`` returns an async context manager: entering it opens and readies the session
    (raising if it cannot), leaving it tears the session down — on success, on a fault and on
    cancellation alike. Teardown runs shielded from cancellation, bounded by ``teardown_timeout``
    (an overrun is reported as the session's failure). ``run(session)`` does the session's work
    until it faults (raises) or is finished (returns).

    Every ``Exception`` is retried — the service must not silently stop — except the types in
    ``fatal``, which end supervision (reported UNAVAILABLE first, then re-raised). Each failure is
    logged with its traceback.

    A session that stayed up for ``healthy_after`` seconds before failing resets the backoff, so an
    occasional fault costs one short delay while a device that fails at once backs off to the cap.
    """

    def __init__(
        self,
        name: str,
        open_session: Callable[[], AbstractAsyncContextManager[S]],
        run: Callable[[S], Awaitable[None]],
        *,
        availability: AvailabilityMachine | None = None,
        backoff: Backoff | None = None,
        healthy_after: float | None = None,
        teardown_timeout: float = 5.0,
        fatal: tuple[type[Exception], ...] = (),
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self._open = open_session
        self._run = run
        self.availability = availability
        self.backoff = backoff or Backoff()
        self.healthy_after = self.backoff.cap if healthy_after is None else healthy_after
        teardown = validate_timeout(teardown_timeout, what="teardown_timeout")
        assert teardown is not None
        self.teardown_timeout = teardown
        self.fatal = fatal
        self._rng = rng or random.Random()
        self._attempts = 0
        self._failures = 0
        self._consecutive = 0
        self._last_error: str | None = None
        self._next_delay: float | None = None

    def statistics(self) -> SupervisorStatistics:
        return SupervisorStatistics(
            attempts=self._attempts,
            failures=self._failures,
            consecutive_failures=self._consecutive,
            last_error=self._last_error,
            next_delay=self._next_delay,
        )

    def _report(self, reason: str) -> None:
        if self.availability is not None:
            self.availability.report_unavailable(reason)

    async def run(self) -> None:
        """Supervise until cancelled, or until a session's ``run`` returns normally."""
        while True:
            self._attempts += 1
            self._next_delay = None
            attempt = self._attempts
            last = f"; last error: {self._last_error}" if self._last_error else ""
            self._report(f"{self.name}: opening session (attempt {attempt}{last})")
            _log.info("session opening", session=self.name, attempt=attempt)
            opened_at: float | None = None
            try:
                session_cm = self._open()
                session = await session_cm.__aenter__()
                opened_at = now()
                _log.info("session ready", session=self.name, attempt=attempt)
                await self._run_and_teardown(session_cm, session)
            except Exception as exc:
                await self._failed(exc, attempt, opened_at)
                continue
            _log.info("session finished", session=self.name, attempt=attempt)
            return

    async def _run_and_teardown(
        self, session_cm: AbstractAsyncContextManager[S], session: S
    ) -> None:
        try:
            await self._run(session)
        except BaseException as exc:
            try:
                if await self._teardown(session_cm, exc):
                    return
            except Exception as teardown_error:
                # The session's own fault (or the owner's cancellation) stays what is raised.
                exc.add_note(f"session teardown failed too: {teardown_error!r}")
            raise
        await self._teardown(session_cm, None)

    async def _teardown(
        self, session_cm: AbstractAsyncContextManager[S], exc: BaseException | None
    ) -> bool:
        """Leave the session, shielded and bounded; True if it suppressed ``exc``."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.teardown_timeout) as scope:
            exc_type = None if exc is None else type(exc)
            traceback = None if exc is None else exc.__traceback__
            suppressed = bool(await session_cm.__aexit__(exc_type, exc, traceback))
        if scope.cancelled_caught:
            raise TimeoutError(
                f"{self.name}: session teardown did not finish within {self.teardown_timeout} s"
            ) from exc
        return suppressed

    async def _failed(self, exc: Exception, attempt: int, opened_at: float | None) -> None:
        notes = "".join(f" ({note})" for note in getattr(exc, "__notes__", ()))
        error = f"{type(exc).__name__}: {exc}{notes}"
        if opened_at is not None and now() - opened_at >= self.healthy_after:
            self._consecutive = 0
        self._failures += 1
        self._consecutive += 1
        self._last_error = error
        if isinstance(exc, self.fatal):
            self._report(f"{self.name}: {error} (attempt {attempt} failed; not retried)")
            _log.error("session failed fatally", session=self.name, attempt=attempt, exc_info=exc)
            raise exc
        delay = self.backoff.delay(self._consecutive, self._rng)
        self._next_delay = delay
        self._report(f"{self.name}: {error} (attempt {attempt} failed; retrying in {delay:.3g} s)")
        _log.warning(
            "session failed",
            session=self.name,
            attempt=attempt,
            retry_in_s=delay,
            consecutive_failures=self._consecutive,
            exc_info=exc,
        )
        await pause(delay)
