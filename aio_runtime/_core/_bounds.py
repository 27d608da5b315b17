"""A wait's bound: its own timeout and the enclosing deadline scope, whichever comes first, and
the typed error to raise when it is reached — one :class:`WaitBound` per wait, or one shared by the
steps of a sequence, and the keywords every wait takes to make one (:class:`BoundArgs`, in one of
two forms: :class:`OwnBound` or :class:`SharedBound`)."""

from __future__ import annotations

import math
from collections.abc import Awaitable
from typing import Required, TypedDict, TypeVar

import anyio

from ._clock import Deadline, current_deadline, now, validate_timeout
from ._errors import BudgetExhausted, HardwareTimeout, Layer, UnboundedWaitError

__all__ = ["BoundArgs", "OwnBound", "SharedBound", "WaitBound"]

T = TypeVar("T")


class WaitBound:
    """The bound of one wait, or of a sequence of steps: its own timeout and the enclosing deadline
    scope, whichever comes first, and the error to raise when it is reached.

    Created when the wait (or the sequence) starts; it is refused at once
    (:class:`~aio_runtime.UnboundedWaitError`) with neither a timeout nor a scope. Each step
    of a sequence runs under it — a wait with ``within=bound``, anything else with :meth:`run` —
    and a timeout reports the step in progress, with the sequence's timeout and elapsed time.
    """

    def __init__(
        self,
        *,
        awaited: str,
        error: type[HardwareTimeout],
        timeout: float | None,
        layer: Layer | None = None,
    ) -> None:
        own = validate_timeout(timeout)
        scope = current_deadline()
        if own is None and scope is None:
            raise UnboundedWaitError(
                f"refusing to wait for {awaited} without a bound: pass timeout=<seconds> or run "
                "inside aio_runtime.deadline_scope() (a caller's own anyio/asyncio timeout is not "
                "a bound the runtime can report as a typed hardware timeout)"
            )
        self.awaited = awaited
        self.error = error
        self.layer = layer if layer is not None else error.default_layer
        self.started = now()
        self.timeout = own
        self.scope: Deadline | None = scope
        self._own_at = math.inf if own is None else self.started + own
        self._step: tuple[str, object, object] = (awaited, None, None)

    def note(self, awaited: str, expected: object = None, observed: object = None) -> None:
        """Record the step in progress: a timeout reports what was awaited and last observed then."""
        self._step = (awaited, expected, observed)

    def step_done(self, value: T) -> T:
        """A step finished: a timeout from here on describes the bound itself again."""
        self._step = (self.awaited, None, None)
        return value

    async def run(self, step: Awaitable[T], *, awaited: str) -> T:
        """Await a step that is not itself a wait (take a lock, write a register) under the bound."""
        self.note(awaited)
        with anyio.CancelScope(deadline=self.at):
            return self.step_done(await step)
        raise self.timed_out()

    @property
    def at(self) -> float:
        """The absolute deadline on the loop clock."""
        return min(self._own_at, math.inf if self.scope is None else self.scope.at)

    def remaining(self) -> float:
        return max(0.0, self.at - now())

    def progress(self, when: float) -> None:
        """Restart the own timer from ``when`` (inactivity timeouts); the scope never moves."""
        if self.timeout is not None:
            self._own_at = when + self.timeout

    def timed_out(self) -> HardwareTimeout | BudgetExhausted:
        """The error for reaching this bound now — the scope's if it was the earlier bound —
        describing the step in progress (see :meth:`note`)."""
        t = now()
        what, expected, observed = self._step
        if self.scope is not None and self.scope.at <= self._own_at:
            return BudgetExhausted(
                budget=self.scope.name,
                awaited=what,
                timeout=self.scope.budget,
                elapsed=t - self.scope.started,
                layer=self.layer,
                expected=expected,
                observed=observed,
            )
        assert self.timeout is not None
        return self.error(
            awaited=what,
            timeout=self.timeout,
            elapsed=t - self.started,
            layer=self.layer,
            expected=expected,
            observed=observed,
        )


class OwnBound(TypedDict, total=False):
    """A wait's own bound, as a caller writes it: ``awaited``, what the wait is for; ``error``, the
    :class:`~aio_runtime.HardwareTimeout` subclass it raises; ``timeout`` in seconds (optional
    inside a :func:`~aio_runtime.deadline_scope`, which bounds it too: the earlier wins);
    ``layer``, by default the error's."""

    awaited: Required[str]
    error: Required[type[HardwareTimeout]]
    timeout: float | None
    layer: Layer | None


class SharedBound(TypedDict):
    """A bound shared with the other steps of a sequence, as a caller writes it: ``awaited``, what
    this step is for, and ``within``, the :class:`WaitBound` (its error, timeout and layer apply)."""

    awaited: str
    within: WaitBound


class BoundArgs(TypedDict, total=False):
    """The keywords that bound a wait (:func:`~aio_runtime.wait_complete`, :func:`~aio_runtime.wait_until`,
    :func:`~aio_runtime.wait_register`, :func:`~aio_runtime.run_in_thread`), as the wait receives
    them: ``awaited``, and the keywords of one of two forms — its own bound (:class:`OwnBound`:
    ``error``, ``timeout``, ``layer``) or a shared one (:class:`SharedBound`: ``within``). Each of
    those functions is typed with the two forms, so a type checker refuses a call that gives
    neither or mixes them; :func:`resolve_bound` refuses it when the call runs."""

    awaited: Required[str]
    error: type[HardwareTimeout] | None
    timeout: float | None
    layer: Layer | None
    within: WaitBound | None


_BOUND_KEYS = frozenset(BoundArgs.__annotations__)


def bound_forms(waiter: str) -> str:
    """What ``waiter`` takes to be bounded, for its errors: the two forms of :class:`BoundArgs`."""
    return (
        f"{waiter}() takes either a bound of its own, error=<a HardwareTimeout subclass> with "
        "timeout=<seconds> (or inside a deadline_scope), or one shared with other steps, "
        "within=<a WaitBound>"
    )


def resolve_bound(waiter: str, bounding: BoundArgs) -> WaitBound:
    """The bound the wait ``waiter`` (a public function's name, for errors about its keywords)
    runs under, from its :class:`BoundArgs`: the shared one it was given (``within=``), or its
    own, made now. Keywords of both forms, or of neither, are a ``TypeError``."""
    if not bounding.keys() <= _BOUND_KEYS:
        unknown = sorted(bounding.keys() - _BOUND_KEYS)
        raise TypeError(f"{waiter}() got an unexpected keyword argument {unknown[0]!r}")
    if "awaited" not in bounding:
        raise TypeError(f"{waiter}() missing 1 required keyword-only argument: 'awaited'")
    awaited, within = bounding["awaited"], bounding.get("within")
    timeout, error, layer = bounding.get("timeout"), bounding.get("error"), bounding.get("layer")
    if within is not None:
        mixed = [
            name
            for name, value in (("error", error), ("timeout", timeout), ("layer", layer))
            if value is not None
        ]
        if mixed:
            raise TypeError(f"{bound_forms(waiter)}, not both: got within= and {mixed[0]}=")
        return within
    if error is None:
        raise TypeError(f"{bound_forms(waiter)}: got neither error= nor within=")
    return WaitBound(awaited=awaited, error=error, timeout=timeout, layer=layer)
