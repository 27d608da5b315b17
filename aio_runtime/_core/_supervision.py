"""Supervised device sessions: open → ready → fault → teardown → backoff → reopen, for as long as
the owner runs.

There is no sticky error and no silent giving up: after each failure the supervisor tears the
session down (leaving its ``async with`` block), waits an exponentially growing delay up to a cap,
and opens a fresh session; past the cap it keeps trying at the cap. Every attempt and every failure
is reported to an :class:`~aio_runtime.AvailabilityMachine` as ``UNAVAILABLE`` with a reason,
and counted in :meth:`Supervisor.statistics`. Only the owner ends supervision, by cancelling it;
a session's ``run`` returning normally means its work is finished, and :meth:`Supervisor.run`
returns too.

A supervisor may be given a *probe*: a cheap check that the device answers at all (one register
read with a short bound), much cheaper than opening a session, or that has no news of it. Probed
every ``probe_interval`` while the supervisor backs off and while a session opens, it decides
when a full reopen is worth trying — as soon as the device is back, not when a backoff delay or
an open's hardware bounds happen to run out (see :class:`Supervisor`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Generic, TypeVar

import anyio
import anyio.abc

from ._clock import now, validate_timeout
from ._errors import RuntimeFault
from ._health import AvailabilityMachine, Reason
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
    abandoned: int = 0
    """Opening attempts given up because the device answered its probe again (see ``probe``)."""
    probes: int = 0
    """Probes made (one cut short, as a backoff ends, is not counted; one with no news is)."""
    probes_failed: int = 0
    """Probes that did not answer (failed, raised or overran ``probe_timeout``)."""


class Supervisor(Generic[S]):
    """Keeps a session running.

    ``open_session()`` returns an async context manager: entering it opens and readies the session
    (raising if it cannot), leaving it tears the session down — on success, on a fault and on
    cancellation alike. Teardown runs shielded from cancellation, bounded by ``teardown_timeout``
    (an overrun is reported as the session's failure). ``run(session)`` does the session's work
    until it faults (raises) or is finished (returns).

    Every ``Exception`` is retried — the service must not silently stop — except the types in
    ``fatal``, which end supervision (reported UNAVAILABLE first, then re-raised). A failure that
    is one of the runtime's typed faults (:class:`~aio_runtime.RuntimeFault`: expected, and its
    message says what happened) is logged as one line at warning, its traceback at debug; any
    other exception is logged at warning with its traceback.

    A session that stayed up for ``healthy_after`` seconds before failing resets the backoff, so an
    occasional fault costs one short delay while a device that fails at once backs off to the cap.

    ``probe()``, when given, says whether the device answers (True) — a cheap check, such as one
    register read — or None: it has no news (it could not look; say, what it would look over is
    being opened for a session, which is then the check). A probe with no news is neither an
    answer nor a failure: it ends no backoff, abandons no attempt, and leaves what the last
    probe found as it was. It is called every ``probe_interval`` seconds (default: the backoff's
    first delay) while the supervisor backs off and while a session opens, each call bounded by
    ``probe_timeout`` (default: ``probe_interval``); a probe that raises or overruns did not
    answer. It is never called while a session runs or is torn down.

    * Backing off, the delay ends at the first probe that answers, once reopening is worth it:
      a probe has failed since the failed attempt began (the device went away and is back), or
      the session had opened before it failed (the device can be opened; what failed was its
      work). A device that answers all along yet cannot be opened waits out its backoff: its
      trouble is not one a probe sees. After an attempt that failed opening, the device is
      probed at once (one absent can fail an open before any probe sees it gone); the probes
      that may end the delay come every ``probe_interval`` from one ``probe_interval`` into it,
      so a device that answers at once is still given that pause.
    * Opening, the device is probed at once and then every ``probe_interval``. An attempt that
      began while the device did not answer, or during which a probe failed, is abandoned as
      soon as a probe answers again: it is cancelled (leaving its ``open_session()`` context
      manager releases what it took) and a new attempt starts at once, instead of waiting out
      bounds meant for a device that was not there (a transfer lost to even a brief fault
      waits out its whole bound). An abandoned attempt is not a failure: it neither counts nor
      grows the backoff.
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
        probe: Callable[[], Awaitable[bool | None]] | None = None,
        probe_interval: float | None = None,
        probe_timeout: float | None = None,
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
        self.probe = probe
        interval = self.backoff.initial if probe_interval is None else probe_interval
        self.probe_interval = _positive(interval, "probe_interval")
        self.probe_timeout = _positive(
            interval if probe_timeout is None else probe_timeout, "probe_timeout"
        )
        self._attempts = 0
        self._failures = 0
        self._consecutive = 0
        self._abandoned = 0
        self._probes = 0
        self._probes_failed = 0
        self._answering: bool | None = None
        """What the last probe found (None: no probe yet)."""
        self._missed = False
        """A probe has failed since the current attempt began, or the last one before it did."""
        self._last_error: str | None = None
        self._next_delay: float | None = None

    def statistics(self) -> SupervisorStatistics:
        return SupervisorStatistics(
            attempts=self._attempts,
            failures=self._failures,
            consecutive_failures=self._consecutive,
            last_error=self._last_error,
            next_delay=self._next_delay,
            abandoned=self._abandoned,
            probes=self._probes,
            probes_failed=self._probes_failed,
        )

    def _report(self, detail: str) -> None:
        # Each report is news of its own (an attempt, a failure), never one more of a lasting
        # cause: a machine that keeps one wording per kind keeps it for the reports of others.
        if self.availability is not None:
            self.availability.report_unavailable(Reason(self.name, detail), per_kind=False)

    async def run(self) -> None:
        """Supervise until cancelled, or until a session's ``run`` returns normally."""
        fatal: list[Exception] = []
        async with anyio.create_task_group() as watchers:  # probes while sessions open
            try:
                await self._supervise(watchers)
            except Exception as exc:  # raised here, not as an exception group of the watchers
                fatal.append(exc)
            watchers.cancel_scope.cancel()
        if fatal:
            raise fatal[0]

    async def _supervise(self, watchers: anyio.abc.TaskGroup) -> None:
        abandoned: int | None = None
        while True:
            self._attempts += 1
            self._next_delay = None
            self._missed = self._answering is False
            attempt = self._attempts
            notes = [f"attempt {attempt}"]
            if abandoned is not None:
                notes.append(f"attempt {abandoned} abandoned: the device answers again")
            if self._last_error:
                notes.append(f"last error: {self._last_error}")
            self._report(f"opening session ({'; '.join(notes)})")
            _log.info("session opening", session=self.name, attempt=attempt)
            opened_at: float | None = None
            abandoned = None
            try:
                # The attempt's scope spans the session's life (a session's context manager may
                # hold scopes of its own across its yield); only the opening watcher cancels it.
                with anyio.CancelScope() as scope:
                    watch = self._watch_opening(watchers, scope)
                    session_cm = self._open()
                    try:
                        session = await session_cm.__aenter__()
                    finally:
                        watch.cancel()
                    opened_at = now()
                    _log.info("session ready", session=self.name, attempt=attempt)
                    await self._run_and_teardown(session_cm, session)
            except Exception as exc:
                await self._failed(exc, attempt, opened_at)
                continue
            if scope.cancelled_caught:
                self._abandoned += 1
                abandoned = attempt
                _log.info(
                    "session opening abandoned: the device answers again",
                    session=self.name,
                    attempt=attempt,
                )
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
            self._report(f"{error} (attempt {attempt} failed; not retried)")
            _log.error("session failed fatally", session=self.name, attempt=attempt, exc_info=exc)
            raise exc
        delay = self.backoff.delay(self._consecutive, self._rng)
        self._next_delay = delay
        self._report(f"{error} (attempt {attempt} failed; retrying in {delay:.3g} s)")
        fields = {
            "session": self.name,
            "attempt": attempt,
            "retry_in_s": delay,
            "consecutive_failures": self._consecutive,
        }
        if isinstance(exc, RuntimeFault):  # expected: its message says what happened
            _log.warning("session failed", error=error, **fields)
            _log.debug("session failure traceback", exc_info=exc, **fields)
        else:
            _log.warning("session failed", exc_info=exc, **fields)
        await self._back_off(delay, opened=opened_at is not None)

    # -- probing -------------------------------------------------------------------------------

    async def _probe_once(self) -> bool:
        """One probe, bounded by ``probe_timeout``: True if the device answered (False if it did
        not, or the probe had no news)."""
        assert self.probe is not None
        answered: bool | None = False
        try:
            with anyio.move_on_after(self.probe_timeout):
                found = await self.probe()
                answered = None if found is None else bool(found)
        except Exception as exc:
            _log.debug("probe failed", session=self.name, error=f"{type(exc).__name__}: {exc}")
        self._probes += 1
        if answered is None:  # no news: neither the device answering nor away
            return False
        self._answering = answered  # (a probe cut short finds nothing)
        if not answered:
            self._probes_failed += 1
            self._missed = True
        return answered

    async def _probe_until(self, worth_it: Callable[[bool], bool], *, first_at: float) -> None:
        """Probe at ``first_at``, then every ``probe_interval`` (start to start), until
        ``worth_it(answered)``."""
        next_at = first_at
        while True:
            await pause(max(0.0, next_at - now()))
            next_at = now() + self.probe_interval
            if worth_it(await self._probe_once()):
                return

    async def _back_off(self, delay: float, *, opened: bool) -> None:
        """Wait ``delay`` before the next attempt; with a probe, less once reopening is worth
        it (see the class)."""
        if self.probe is None:
            await pause(delay)
            return
        with anyio.move_on_after(delay):
            if not opened:  # was the device there at all? (an absent one can fail an open fast)
                await self._probe_once()
            await self._probe_until(
                lambda answered: answered and (opened or self._missed),
                first_at=now() + self.probe_interval,
            )

    def _watch_opening(
        self, watchers: anyio.abc.TaskGroup, attempt: anyio.CancelScope
    ) -> anyio.CancelScope:
        """With a probe, probe while an attempt opens and cancel ``attempt`` once the device
        answers after not answering. The watcher's scope: cancelled once the attempt is open."""
        scope = anyio.CancelScope()
        if self.probe is None:
            return scope

        async def watch() -> None:
            # At once: an attempt that begins as the device goes away must learn of it (its
            # first transfers may be lost, and wait out their bounds, however brief the fault).
            with scope:
                await self._probe_until(lambda answered: answered and self._missed, first_at=now())
                attempt.cancel()

        watchers.start_soon(watch)
        return scope


def _positive(value: float, what: str) -> float:
    checked = validate_timeout(value, what=what)
    if not checked:
        raise ValueError(f"{what} must be > 0 seconds, got {value!r}")
    return checked
