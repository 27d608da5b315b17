"""openpilot's wire format: Events compared with bytes assembled by hand from cereal's layout.

A round trip through our own schema cannot find a wrong layout (a schema that misplaces a field
reads back what it wrote), so these tests build the bytes themselves, word by word, as Cap'n Proto
lays out cereal's structs (fields allocated in ordinal order, each in the first free slot of its
width), and compare.
"""

from __future__ import annotations

import struct
import warnings

import pytest

from aio_runtime import Availability
from pipelines.dms.messages import DRIVER_FIELDS, READINESS_LAYERS, DriverStateV2
from pipelines.dms.openpilot import events

UP = {name: True for name in READINESS_LAYERS}


def message(**overrides: object) -> DriverStateV2:
    fields: dict[str, object] = {
        "seq": 3,
        "run_id": "20260101T000000.000Z-00000000",
        "frame_id": 1234,
        "timestamp_sof": 5_000_000_000,
        "timestamp_eof": 5_020_000_000,
        "frame_age": 0.04,
        "availability": Availability.UNAVAILABLE,
        "reason": "gpu-queue: compute timeline >= 7",
        "valid": False,
        "readiness": UP,
        "model_execution_time": 0.0125,
        "gpu_execution_time": 0.0100,
        "log_mono_time": 0x0102030405060708,
    }
    fields.update(overrides)
    return DriverStateV2(**fields)  # type: ignore[arg-type]


def driver_data(offset: float) -> dict[str, object]:
    data: dict[str, object] = {}
    for i, name in enumerate(DRIVER_FIELDS):
        if name in ("faceOrientation", "faceOrientationStd"):
            data[name] = [offset + i, offset + i + 0.25, offset + i + 0.5]
        elif name in ("facePosition", "facePositionStd"):
            data[name] = [offset + i, offset + i + 0.25]
        else:
            data[name] = offset + i / 100
    return data


def struct_pointer(offset: int, data_words: int, pointers: int) -> bytes:
    return struct.pack("<iHH", offset << 2, data_words, pointers)


def f32(value: float) -> bytes:
    return struct.pack("<f", value)


def follow(words: bytes, at: int) -> tuple[int, int, int]:
    """The struct a pointer at word ``at`` points to: (its first word, data words, pointers)."""
    raw, data_words, pointers = struct.unpack_from("<iHH", words, at * 8)
    assert raw & 3 == 0, "a struct pointer"
    return at + 1 + (raw >> 2), data_words, pointers


def segment(event: bytes) -> bytes:
    """The one segment of a standard single-segment message, after its 8-byte table."""
    count, size = struct.unpack_from("<II", event, 0)
    assert count == 0, "one segment"
    assert len(event) == 8 + 8 * size
    return event[8:]


def test_a_driver_state_event_is_the_bytes_cereal_lays_out():
    """Every byte of a driverStateV2 Event without driver data, assembled by hand."""
    (name, wire), _ = events.encode(message())
    assert name == "driverStateV2"
    root = struct_pointer(0, 2, 1)  # the Event: 2 data words, 1 pointer
    event_data = struct.pack("<Q", 0x0102030405060708)  # logMonoTime: data bytes 0-7
    event_data += struct.pack("<HBx4x", 90, 1)  # discriminant 90; valid (false) XOR true = 1
    event_pointer = struct_pointer(0, 3, 3)  # DriverStateV2: 3 data words, 3 pointers
    state = struct.pack("<I", 1234) + f32(0.0125)  # frameId @0, modelExecutionTime @1
    state += f32(0.0) + f32(0.0)  # dspExecutionTime @2, poorVisionProb @4 (deprecated)
    state += f32(0.0) + f32(0.0100)  # wheelOnRightProb @5, gpuExecutionTime @8
    state += bytes(8 * 3)  # rawPredictions @3, left @6, right @7: null (no driver data)
    words = root + event_data + event_pointer + state
    assert wire == struct.pack("<II", 0, len(words) // 8) + words


@pytest.mark.parametrize(
    ("availability", "valid_bit"),
    [(Availability.AVAILABLE, 0), (Availability.DEGRADED, 0), (Availability.UNAVAILABLE, 1)],
)
def test_valid_is_bit_0_of_data_byte_10_stored_xor_true(availability, valid_bit):
    """Valid exactly when available or degraded with driver data: a late frame is no
    communication issue for openpilot."""
    with_data = message(
        availability=availability,
        left_driver_data=driver_data(1.0),
        right_driver_data=driver_data(2.0),
        wheel_on_right_prob=0.25,
    )
    for _, wire in events.encode(with_data):
        assert segment(wire)[8 + 10] & 1 == valid_bit
    for _, wire in events.encode(message(availability=availability)):  # no driver data
        assert segment(wire)[8 + 10] & 1 == 1


def test_driver_data_sits_where_cereal_puts_it_deprecated_fields_included():
    """DriverData: 9 Float32 in ordinal order (occludedProb @10, deprecated, before phoneProb
    @13), lists in pointers 0-3 (readyProb @11, notReadyProb @12 after them)."""
    left, right = driver_data(1.0), driver_data(20.0)
    (_, wire), _ = events.encode(
        message(
            availability=Availability.AVAILABLE,
            left_driver_data=left,
            right_driver_data=right,
            wheel_on_right_prob=0.25,
        )
    )
    words = segment(wire)
    state, data_words, pointers = follow(words, 3)
    assert (data_words, pointers) == (3, 3)
    assert struct.unpack_from("<f", words, state * 8 + 16)[0] == 0.25  # wheelOnRightProb @5
    for pointer, expected in ((state + 3 + 1, left), (state + 3 + 2, right)):
        data, data_words, pointers = follow(words, pointer)
        assert (data_words, pointers) == (5, 6)
        floats = struct.unpack_from("<9f", words, data * 8)
        scalars = [n for n in DRIVER_FIELDS if not n.startswith("face") or n == "faceProb"]
        slots = dict(zip([*scalars[:6], "occludedProb", *scalars[6:]], floats, strict=True))
        assert slots["occludedProb"] == 0.0
        for name in scalars:
            assert slots[name] == pytest.approx(expected[name], abs=1e-6)
        # faceOrientation @0: pointer 0 of DriverData, a list of 3 Float32 (element size 4)
        raw, count_and_size = struct.unpack_from("<iI", words, (data + 5) * 8)
        assert raw & 3 == 1 and count_and_size & 7 == 4 and count_and_size >> 3 == 3
        first = data + 5 + 1 + (raw >> 2)
        assert list(struct.unpack_from("<3f", words, first * 8)) == expected["faceOrientation"]


def test_the_status_event_is_customreserved0_and_carries_what_json_adds():
    stall = message(frame_id=-1, timestamp_sof=0, timestamp_eof=0, reason="camera: no frame")
    ((name, wire),) = events.encode(stall)  # no driverStateV2 for a status without a frame
    assert name == "dmsStatus"
    words = segment(wire)
    assert struct.unpack_from("<H", words, 8 + 8)[0] == 105  # @107: after @0 and @67
    (event,) = events.read_events(wire)
    status = event.dmsStatus
    assert status.frameId == -1 and status.seq == 3 and status.reasonKind == "camera"
    assert str(status.availability) == "unavailable" and not status.valid
    assert status.readiness.outputValid and not status.replayed


def test_the_status_event_says_a_valid_frame_was_late_and_why_the_service_is_degraded():
    late = message(
        availability=Availability.DEGRADED,
        availability_reason="overloaded: 12.5 of 20 Hz valid; throttled by its CPU quota",
        left_driver_data=driver_data(1.0),
        right_driver_data=driver_data(2.0),
        wheel_on_right_prob=0.25,
        valid=True,
        late=True,
        reason="",
    )
    _, (_, wire) = events.encode(late)
    (event,) = events.read_events(wire)
    status = event.dmsStatus
    assert status.valid and status.late and status.reason == ""
    assert status.availabilityReasonKind == "overloaded"
    assert status.availabilityReason.startswith("overloaded: 12.5 of 20 Hz valid; ")
    record = late.to_record()
    assert record["late"] is True and record["availabilityReasonKind"] == "overloaded"


def test_a_replayed_frame_carries_its_recorded_timestamps_in_the_status():
    replayed = message(recorded_sof=111, recorded_eof=222)
    _, (_, wire) = events.encode(replayed)
    (event,) = events.read_events(wire)
    assert event.dmsStatus.replayed
    assert (event.dmsStatus.recordedTimestampSof, event.dmsStatus.recordedTimestampEof) == (
        111,
        222,
    )


def hand_event(discriminant: int, data_words: int, pointers: int, body: bytes) -> bytes:
    """A single-segment Event whose union member is a struct with ``body`` as its data."""
    assert len(body) == 8 * data_words
    words = struct_pointer(0, 2, 1)
    words += struct.pack("<Q", 42) + struct.pack("<H6x", discriminant)
    words += struct_pointer(0, data_words, pointers) + body + bytes(8 * pointers)
    return struct.pack("<II", 0, len(words) // 8) + words


def test_frame_data_timestamp_sof_is_read_from_word_4():
    """cereal's FrameData: frameId, encodeId (word 0), timestampEof (word 1), frameLength and
    integLines (word 2), globalGain and the frame type (word 3), then timestampSof (word 4)."""
    body = bytearray(8 * 12)
    struct.pack_into("<II", body, 0, 77, 5)
    struct.pack_into("<Q", body, 8, 2_000_020_000)
    struct.pack_into("<Q", body, 32, 2_000_000_000)
    (event,) = events.read_events(hand_event(68, 12, 7, bytes(body)))  # cabinCameraState @70
    assert event.which() == "cabinCameraState"
    state = event.cabinCameraState
    assert (state.frameId, state.encodeId) == (77, 5)
    assert (state.timestampSof, state.timestampEof) == (2_000_000_000, 2_000_020_000)


def test_encode_index_segment_id_is_read_from_data_byte_16():
    """cereal's EncodeIndex: frameId and type (word 0), encodeId and segmentNum (word 1),
    segmentId and segmentIdEncode (word 2), timestamps (words 3, 4), flags and len (word 5)."""
    body = bytearray(8 * 6)
    struct.pack_into("<IH", body, 0, 77, 5)  # type 5: an older schema's "front"
    struct.pack_into("<Ii", body, 8, 900, 3)
    struct.pack_into("<II", body, 16, 12, 13)
    struct.pack_into("<QQ", body, 24, 2_000_000_000, 2_000_020_000)
    (event,) = events.read_events(hand_event(74, 6, 0, bytes(body)))  # cabinEncodeIdx @76
    index = event.cabinEncodeIdx
    assert (index.frameId, index.type, index.encodeId, index.segmentNum) == (77, 5, 900, 3)
    assert (index.segmentId, index.segmentIdEncode) == (12, 13)
    assert index.timestampSof == 2_000_000_000


def test_events_beyond_the_schema_are_skipped_and_garbage_is_an_error():
    (_, first), (_, second) = events.encode(message(availability=Availability.AVAILABLE))
    beyond = hand_event(149, 1, 0, bytes(8))  # cereal's driverMonitoringState @151
    read = list(events.read_events(first + beyond + second))
    assert [e.which() for e in read] == ["driverStateV2", "dmsStatus"]
    with pytest.raises(events.EventError, match="after 2 Events"):
        list(events.read_events(first + second + b"\x07garbage"))


def test_serialising_one_builder_twice_is_an_error_under_the_test_settings():
    """pycapnp warns when a builder is written twice (its text and lists would be duplicated);
    the test settings make every warning an error, so an encoder that did it would fail here."""
    builder = events.schema().Event.new_message()
    builder.to_bytes()
    with pytest.raises(UserWarning, match="already been written"):
        builder.to_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            events.encode(message())  # a fresh builder for every Event
