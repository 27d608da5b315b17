"""openpilot's wire format: a published message as cereal ``Event`` bytes, and Events read back.

The schema (``events.capnp``, beside this module) is wire-compatible with cereal's ``Event``,
``DriverStateV2``, ``DriverData``, ``FrameData`` and ``EncodeIndex``; see its header for why every
member up to the highest used is declared. Each published :class:`~pipelines.dms.messages.
DriverStateV2` becomes (:func:`encode`):

- a ``driverStateV2`` Event, for a frame (``frameId`` >= 0), with openpilot's fields only;
- a ``dmsStatus`` Event (ours, in cereal's ``customReserved0``), always: what the JSON message
  adds — availability, reason and its kind, readiness, sequence, run id, the frame's timestamps
  (as replayed and as recorded), frame age, our stricter ``valid``, ``late``
  and the availability's reason. A stalled camera's status
  message (JSON ``frameId`` -1, which cereal's UInt32 cannot carry) is this Event alone.

Both Events carry ``logMonoTime`` = the message's publish time (ns, the service's monotonic
clock) and ``valid`` = false exactly when the service is unavailable or the message carries no
driver data (:func:`event_valid`). A degraded frame with driver data goes out valid: openpilot's
consumers treat an invalid driverStateV2 as a communication issue, and a late frame is not one.

Reading (:func:`read_events`) yields the Events of a log's bytes whose member this schema
declares, and skips the rest (members beyond it: pycapnp cannot name them).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from aio_runtime import Availability

from ..messages import DRIVER_FIELDS, READINESS_LAYERS, DriverStateV2

__all__ = [
    "DRIVER_STATE",
    "SCHEMA_PATH",
    "STATUS",
    "EventError",
    "encode",
    "event_valid",
    "events_of",
    "read_events",
    "schema",
]

SCHEMA_PATH = Path(__file__).with_name("events.capnp")
DRIVER_STATE = "driverStateV2"
"""The Event member (and openpilot service) of the model's outputs."""
STATUS = "dmsStatus"
"""The Event member (and service) of our status: cereal's ``customReserved0`` (@107)."""

_TRAVERSAL_WORDS = 1 << 26
"""How much one Event may make a reader traverse (512 MiB): real Events are far smaller."""


class EventError(ValueError):
    """Bytes that are not a sequence of capnp Events (a corrupt or truncated log)."""


@functools.cache
def schema() -> Any:
    """The loaded schema module (pycapnp, loaded once)."""
    import capnp

    return capnp.load(str(SCHEMA_PATH))


def event_valid(message: DriverStateV2) -> bool:
    """``Event.valid``: false exactly when the service is unavailable or the message carries no
    driver data."""
    return (
        message.availability is not Availability.UNAVAILABLE
        and message.left_driver_data is not None
        and message.right_driver_data is not None
    )


def encode(message: DriverStateV2) -> list[tuple[str, bytes]]:
    """The Events of one published message, as (member, bytes): ``driverStateV2`` first (for a
    frame only), then ``dmsStatus``. Each is a standard (unpacked) capnp message with its segment
    table, as openpilot's logs and sockets carry them."""
    events = []
    if message.frame_id >= 0:
        events.append((DRIVER_STATE, _driver_state(message).to_bytes()))
    events.append((STATUS, _status(message).to_bytes()))
    return events


def events_of(message: DriverStateV2) -> tuple[tuple[str, bytes], ...]:
    """:func:`encode`'s Events of ``message``, encoded once however many sinks ask for them."""
    return message.encoded(_encoded)


def _encoded(message: DriverStateV2) -> tuple[tuple[str, bytes], ...]:
    return tuple(encode(message))


def _event(message: DriverStateV2) -> Any:
    event = schema().Event.new_message()
    event.logMonoTime = message.log_mono_time
    event.valid = event_valid(message)
    return event


def _driver_state(message: DriverStateV2) -> Any:
    event = _event(message)
    state = event.init(DRIVER_STATE)
    state.frameId = message.frame_id
    state.modelExecutionTime = message.model_execution_time
    state.gpuExecutionTime = message.gpu_execution_time
    if message.raw_predictions is not None:
        state.rawPredictions = message.raw_predictions
    if message.wheel_on_right_prob is not None:
        state.wheelOnRightProb = message.wheel_on_right_prob
    for side, data in (
        ("leftDriverData", message.left_driver_data),
        ("rightDriverData", message.right_driver_data),
    ):
        if data is not None:
            _driver_data(state.init(side), data)
    return event


def _driver_data(builder: Any, data: Mapping[str, Any]) -> None:
    for name in DRIVER_FIELDS:
        value = data[name]
        if isinstance(value, int | float) or getattr(value, "ndim", 1) == 0:
            setattr(builder, name, float(value))
        else:
            values = [float(v) for v in value]
            target = builder.init(name, len(values))
            for i, v in enumerate(values):
                target[i] = v


def _status(message: DriverStateV2) -> Any:
    event = _event(message)
    status = event.init(STATUS)
    status.frameId = message.frame_id
    status.seq = message.seq
    status.runId = message.run_id
    status.timestampSof = max(0, message.timestamp_sof)
    status.timestampEof = max(0, message.timestamp_eof)
    if message.recorded_sof is not None:
        status.replayed = True
        status.recordedTimestampSof = message.recorded_sof
        status.recordedTimestampEof = message.recorded_eof or 0
    status.frameAge = message.frame_age if math.isfinite(message.frame_age) else 0.0
    status.availability = message.availability.value
    status.reason = message.reason
    status.reasonKind = message.reason_kind or ""
    readiness = status.init("readiness")
    for name in READINESS_LAYERS:
        setattr(readiness, name, bool(message.readiness[name]))
    status.valid = message.valid
    status.late = message.late
    status.availabilityReason = message.availability_reason
    status.availabilityReasonKind = message.availability_reason_kind or ""
    return event


def read_events(data: bytes | bytearray | memoryview) -> Iterator[Any]:
    """The Events in ``data`` (standard capnp messages concatenated, as in an rlog) whose member
    this schema declares, as readers (``event.which()``, ``event.driverStateV2`` ...); Events of
    other members are skipped. Bytes that do not parse: :class:`EventError`, after the Events
    before them."""
    import capnp

    events = schema().Event.read_multiple_bytes(
        bytes(data), traversal_limit_in_words=_TRAVERSAL_WORDS
    )
    count = 0
    while True:
        try:
            event = next(events)
        except StopIteration:
            return
        except capnp.KjException as exc:
            raise EventError(
                f"not a capnp Event after {count} Events: {_first_line(exc)}"
            ) from None
        count += 1
        try:
            event.which()
        except capnp.KjException:
            continue  # a member beyond this schema
        yield event


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
