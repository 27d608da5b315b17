"""Readiness layers and the availability state machine.

Readiness is tracked per layer, separately, because each one says something different: a USB
transfer that completed does not mean the GPU finished, and a GPU that finished does not mean its
output is valid. Layers are ordered: when a lower one goes down, every layer above it is down too.

Availability is what consumers see:

* ``AVAILABLE`` — trustworthy results are being produced;
* ``DEGRADED(reason)`` — results are produced, but something about them is not fully trustworthy;
* ``UNAVAILABLE(reason)`` — no trustworthy result can be produced.

A fault changes the state at once. Returning to ``AVAILABLE`` needs ``recover_after`` good results
in a row (hysteresis), so a flapping device does not flap the consumer. Every change — including a
change of reason — is a :class:`Transition`, delivered to every subscriber in order.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator, Mapping
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
    "Transition",
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


class Availability(enum.Enum):
    AVAILABLE = "available"
    DEGRADED = "degraded"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class AvailabilityState:
    availability: Availability
    reason: str | None
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


class AvailabilityMachine:
    """AVAILABLE / DEGRADED / UNAVAILABLE with reasons and hysteresis.

    Starts UNAVAILABLE (``initial_reason``). Report every result with :meth:`report_good`,
    :meth:`report_degraded` or :meth:`report_unavailable`. Bad news applies at once. Every
    improvement needs ``recover_after`` results in a row that are at least that good: AVAILABLE
    after that many good results, DEGRADED (from UNAVAILABLE) after that many results that were
    produced at all (good or degraded). A device that alternates between failing and producing
    therefore stays UNAVAILABLE instead of flapping.

    Each subscriber may fall ``max_backlog`` transitions behind; one that falls further is
    disconnected (its stream ends) rather than letting memory grow without bound.

    Reports are synchronous and may come from any task on the loop thread.
    """

    def __init__(
        self,
        *,
        recover_after: int = 3,
        initial_reason: str = "starting",
        max_backlog: int = 256,
    ) -> None:
        if recover_after < 1:
            raise ValueError(f"recover_after must be >= 1, got {recover_after}")
        if max_backlog < 1:
            raise ValueError(f"max_backlog must be >= 1, got {max_backlog}")
        self.recover_after = recover_after
        self.max_backlog = max_backlog
        self._state = AvailabilityState(Availability.UNAVAILABLE, initial_reason, _safe_now())
        self._good_streak = 0
        self._producing_streak = 0
        self._degraded_reason: str | None = None
        self._seq = 0
        self._subscribers: list[MemoryObjectSendStream[Transition]] = []

    @property
    def state(self) -> AvailabilityState:
        return self._state

    @property
    def good_streak(self) -> int:
        return self._good_streak

    def report_good(self) -> None:
        self._good_streak += 1
        self._producing_streak += 1
        if self._state.availability is Availability.AVAILABLE:
            return
        if self._good_streak >= self.recover_after:
            self._enter(Availability.AVAILABLE, None)
        elif self._producing_streak >= self.recover_after and self._degraded_reason is not None:
            self._enter(Availability.DEGRADED, self._degraded_reason)

    def report_degraded(self, reason: str) -> None:
        self._good_streak = 0
        self._producing_streak += 1
        self._degraded_reason = reason
        if (
            self._state.availability is not Availability.UNAVAILABLE
            or self._producing_streak >= self.recover_after
        ):
            self._enter(Availability.DEGRADED, reason)

    def report_unavailable(self, reason: str) -> None:
        self._good_streak = 0
        self._producing_streak = 0
        self._degraded_reason = None
        self._enter(Availability.UNAVAILABLE, reason)

    def _enter(self, availability: Availability, reason: str | None) -> None:
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


def _safe_now() -> float:
    """Loop time when called on a loop; 0.0 outside one (a machine built before the loop starts)."""
    try:
        return now()
    except RuntimeError:
        return 0.0
