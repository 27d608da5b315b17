"""Readiness layers and the availability state machine.

Readiness is tracked per layer, separately, because each one says something different: a USB
transfer that completed does not mean the GPU finished, and a GPU that finished does not mean its
output is valid. Layers are ordered: when a lower one goes down, every layer above it is down too.

Availability is what consumers see:

* ``AVAILABLE`` — trustworthy results are being produced;
* ``DEGRADED(reason)`` — results are produced, but something about them is not fully trustworthy;
* ``UNAVAILABLE(reason)`` — no trustworthy result can be produced.

A fault changes the state at once. Returning to ``AVAILABLE`` needs ``recover_after`` good results
in a row (hysteresis), so a flapping device does not flap the consumer. Two more options belong to
the same family: ``escalate_after`` failures in a row without a result make isolated failures
(DEGRADED) an outage (UNAVAILABLE), and ``per_kind`` keeps one wording per kind of reason while a
state lasts, so a cause that lasts is one transition, not one per result. Every change — including
a change of reason — is a :class:`Transition`, delivered to every subscriber in order.

A :class:`Reason` says why: a kind (what it is about, such as a layer: ``gpu-queue``, ``camera``)
and a detail. It is a string too (``"<kind>: <detail>"``), so it reads, logs and serialises as
text.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._clock import now
from ._log import get_logger

_log = get_logger("aio_runtime.health")

__all__ = [
    "Availability",
    "AvailabilityMachine",
    "AvailabilityState",
    "Readiness",
    "ReadinessLayer",
    "Reason",
    "Transition",
    "reason_kind",
]


class ReadinessLayer(enum.IntEnum):
    """The five layers, lowest first."""

    DEVICE_ONLINE = 1
    FIRMWARE_READY = 2
    QUEUE_SUBMITTABLE = 3
    TASK_COMPLETE = 4
    OUTPUT_VALID = 5

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class _LayerState:
    up: bool
    reason: str | None


class Readiness:
    """Which readiness layers hold right now, each with the reason it is down."""

    def __init__(self) -> None:
        self._layers: dict[ReadinessLayer, _LayerState] = {
            layer: _LayerState(False, "not started") for layer in ReadinessLayer
        }

    def mark_up(self, layer: ReadinessLayer) -> None:
        """Layer ``layer`` holds. Lower layers must already hold."""
        for below in ReadinessLayer:
            if below >= layer:
                break
            if not self._layers[below].up:
                raise ValueError(
                    f"cannot mark {layer.label} up while {below.label} is down "
                    f"({self._layers[below].reason})"
                )
        self._layers[layer] = _LayerState(True, None)

    def mark_down(self, layer: ReadinessLayer, reason: str) -> None:
        """Layer ``layer`` no longer holds; neither does any layer above it."""
        for above in ReadinessLayer:
            if above >= layer:
                state = self._layers[above]
                cause = reason if above == layer else f"{layer.label} down: {reason}"
                if state.up or above == layer:
                    self._layers[above] = _LayerState(False, cause)

    def is_up(self, layer: ReadinessLayer) -> bool:
        return self._layers[layer].up

    def reason(self, layer: ReadinessLayer) -> str | None:
        return self._layers[layer].reason

    def snapshot(self) -> Mapping[str, bool]:
        """``{"device_online": True, ...}`` — what a published result carries."""
        return MappingProxyType({layer.label: s.up for layer, s in self._layers.items()})


class Availability(enum.StrEnum):
    """What consumers see; each member is also its text (``Availability.DEGRADED == "degraded"``)."""

    AVAILABLE = "available"
    DEGRADED = "degraded"
    UNAVAILABLE = "unavailable"


class Reason(str):
    """Why a state holds: its ``kind`` (what it is about: a layer such as ``gpu-queue``, or
    ``camera``, ``frame budget``...) and a ``detail``.

    A reason is a string as well: ``"<kind>: <detail>"``, or the kind alone when there is no
    detail. Code that makes a reason gives both parts; nothing needs to split text to learn a
    reason's kind.
    """

    kind: str
    detail: str

    def __new__(cls, kind: str, detail: str = "") -> Reason:
        self = super().__new__(cls, f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail
        return self

    @classmethod
    def of(cls, reason: str) -> Reason:
        """``reason`` as a :class:`Reason`: a reason as it is; text, as a reason writes itself
        (``"<kind>: <detail>"``; text without ``": "`` is a kind alone) — for reasons that arrive
        as text, from a message or from a caller."""
        if isinstance(reason, Reason):
            return reason
        kind, _, detail = reason.partition(": ")
        return cls(kind, detail)

    def __getnewargs__(self) -> tuple[str, str]:  # type: ignore[override]
        return self.kind, self.detail


def reason_kind(reason: str) -> str:
    """What a reason is about: its kind (for a reason read as text, from its ``"<kind>: "``)."""
    return Reason.of(reason).kind


@dataclass(frozen=True)
class AvailabilityState:
    availability: Availability
    reason: Reason | None
    since: float
    """Loop time at which this state was entered."""

    def __str__(self) -> str:
        if self.reason is None:
            return self.availability.value
        return f"{self.availability.value}({self.reason})"


@dataclass(frozen=True)
class Transition:
    """One change of availability or of its reason. ``previous`` is None for a subscriber's first item."""

    previous: AvailabilityState | None
    current: AvailabilityState
    seq: int


Escalate = Callable[[int, Reason], Reason]
"""``escalated(failures, reason)``: the reason for the ``failures``-th failure in a row."""


def _escalated(failures: int, reason: Reason) -> Reason:
    return Reason("no result", f"{failures} in a row; {reason}")


class AvailabilityMachine:
    """AVAILABLE / DEGRADED / UNAVAILABLE with reasons and hysteresis.

    Starts UNAVAILABLE (``initial_reason``). Report every result with :meth:`report_good`,
    :meth:`report_degraded` (produced, not fully trustworthy), :meth:`report_failed` (an isolated
    failure: nothing produced this time) or :meth:`report_unavailable`. Bad news applies at once.
    Every improvement needs ``recover_after`` results in a row that are at least that good:
    AVAILABLE after that many good results, DEGRADED (from UNAVAILABLE) after that many results
    that were produced at all (good, degraded or an isolated failure). A device that alternates
    between failing and producing therefore stays UNAVAILABLE instead of flapping.

    ``escalate_after``: that many isolated failures in a row (:meth:`report_failed`, with no
    result produced in between) and they are an outage: UNAVAILABLE, for the reason
    ``escalated(failures, reason)`` makes. None: failures stay isolated (DEGRADED) however many
    come. :meth:`report_unavailable` is news of the state, not a result: it neither counts nor
    breaks the run.

    ``per_kind``: while the state holds for a reason of some kind, a report of the same state
    for a reason of the same kind keeps the first wording: a cause that lasts is one transition,
    not one per result (a report may ask otherwise: ``per_kind=False``).

    Each subscriber may fall ``max_backlog`` transitions behind; one that falls further is
    disconnected (its stream ends) rather than letting memory grow without bound.

    Reports are synchronous and may come from any task on the loop thread. Reasons may be given
    as :class:`Reason` or as text (read as :meth:`Reason.of` reads it).
    """

    def __init__(
        self,
        *,
        recover_after: int = 3,
        escalate_after: int | None = None,
        escalated: Escalate = _escalated,
        per_kind: bool = False,
        initial_reason: str = "starting",
        max_backlog: int = 256,
    ) -> None:
        self.recover_after = _at_least_one("recover_after", recover_after)
        self.escalate_after = escalate_after
        if escalate_after is not None:
            _at_least_one("escalate_after", escalate_after, " or None")
        self.max_backlog = _at_least_one("max_backlog", max_backlog)
        self.per_kind = per_kind
        self._escalated = escalated
        self._state = AvailabilityState(
            Availability.UNAVAILABLE, Reason.of(initial_reason), _safe_now()
        )
        self._good_streak = 0
        self._producing_streak = 0
        self._failed_streak = 0
        self._degraded_reason: Reason | None = None
        self._seq = 0
        self._subscribers: list[MemoryObjectSendStream[Transition]] = []

    @property
    def state(self) -> AvailabilityState:
        return self._state

    @property
    def good_streak(self) -> int:
        return self._good_streak

    @property
    def failed_streak(self) -> int:
        """Isolated failures in a row, with no result produced in between."""
        return self._failed_streak

    def report_good(self) -> None:
        self._good_streak += 1
        self._producing_streak += 1
        self._failed_streak = 0
        if self._state.availability is Availability.AVAILABLE:
            return
        if self._good_streak >= self.recover_after:
            self._enter(Availability.AVAILABLE, None)
        elif self._producing_streak >= self.recover_after and self._degraded_reason is not None:
            self._enter(Availability.DEGRADED, self._degraded_reason)

    def report_degraded(self, reason: str, *, per_kind: bool | None = None) -> None:
        """A result was produced, but it is not fully trustworthy."""
        self._failed_streak = 0
        self._degrade(Reason.of(reason), per_kind)

    def report_failed(self, reason: str, *, per_kind: bool | None = None) -> Reason:
        """Nothing was produced this time: an isolated failure (DEGRADED), unless it is the
        ``escalate_after``-th report in a row without a result (then UNAVAILABLE). Returns the
        reason this failure was reported for (the escalated one, when it escalated)."""
        self._failed_streak += 1
        failed = Reason.of(reason)
        if self.escalate_after is not None and self._failed_streak >= self.escalate_after:
            failed = self._escalated(self._failed_streak, failed)
            self._unavailable(failed, per_kind)
        else:
            self._degrade(failed, per_kind)
        return failed

    def report_unavailable(self, reason: str, *, per_kind: bool | None = None) -> None:
        """Nothing trustworthy can be produced."""
        self._unavailable(Reason.of(reason), per_kind)

    def _degrade(self, reason: Reason, per_kind: bool | None) -> None:
        self._good_streak = 0
        self._producing_streak += 1
        reason = self._wording(Availability.DEGRADED, reason, per_kind)
        self._degraded_reason = reason
        if (
            self._state.availability is not Availability.UNAVAILABLE
            or self._producing_streak >= self.recover_after
        ):
            self._enter(Availability.DEGRADED, reason)

    def _unavailable(self, reason: Reason, per_kind: bool | None) -> None:
        self._good_streak = 0
        self._producing_streak = 0
        self._degraded_reason = None
        reason = self._wording(Availability.UNAVAILABLE, reason, per_kind)
        self._enter(Availability.UNAVAILABLE, reason)

    def _wording(self, availability: Availability, reason: Reason, per_kind: bool | None) -> Reason:
        """The current wording, for a reason of the current kind while the state holds (when
        reasons are kept per kind), else ``reason``."""
        current = self._state
        if (
            (self.per_kind if per_kind is None else per_kind)
            and current.availability is availability
            and current.reason is not None
            and current.reason.kind == reason.kind
        ):
            return current.reason
        return reason

    def _enter(self, availability: Availability, reason: Reason | None) -> None:
        previous = self._state
        if previous.availability is availability and previous.reason == reason:
            return
        self._state = AvailabilityState(availability, reason, _safe_now())
        self._seq += 1
        transition = Transition(previous, self._state, self._seq)
        for send in list(self._subscribers):
            try:
                send.send_nowait(transition)
            except anyio.WouldBlock:
                self._subscribers.remove(send)
                send.close()  # too far behind: its stream ends after what it has buffered
                _log.warning(
                    "availability subscriber disconnected: it fell too far behind",
                    max_backlog=self.max_backlog,
                    transition_seq=transition.seq,
                )
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._subscribers.remove(send)

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[MemoryObjectReceiveStream[Transition]]:
        """A stream of transitions, starting with the current state (``previous=None``).

        Transitions arrive in order and none is skipped; a subscriber more than ``max_backlog``
        behind is disconnected instead (its iteration ends).
        """
        # one slot more for the current state it starts with
        send, receive = anyio.create_memory_object_stream[Transition](self.max_backlog + 1)
        send.send_nowait(Transition(None, self._state, self._seq))
        self._subscribers.append(send)
        try:
            yield receive
        finally:
            if send in self._subscribers:
                self._subscribers.remove(send)
            send.close()
            receive.close()


def _at_least_one(name: str, value: int, alternative: str = "") -> int:
    if value < 1:
        raise ValueError(f"{name} must be >= 1{alternative}, got {value}")
    return value


def _safe_now() -> float:
    """Loop time when called on a loop; 0.0 outside one (a machine built before the loop starts)."""
    try:
        return now()
    except RuntimeError:
        return 0.0
