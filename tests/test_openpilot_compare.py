"""Comparing driver states with openpilot's: differences per field, decisions that flip."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from aio_runtime import Availability
from pipelines.dms.messages import DRIVER_FIELDS, READINESS_LAYERS, DriverStateV2
from pipelines.dms.openpilot import events, policy
from pipelines.dms.openpilot.compare import compare, flatten


def side(**overrides: object) -> dict[str, object]:
    data: dict[str, object] = {
        "faceOrientation": [0.01, 0.02, 0.03],
        "faceOrientationStd": [0.05, 0.05, 0.05],
        "facePosition": [0.0, 0.0],
        "facePositionStd": [0.01, 0.01],
        "faceProb": 0.9,
        "leftEyeProb": 0.9,
        "rightEyeProb": 0.9,
        "leftBlinkProb": 0.1,
        "rightBlinkProb": 0.1,
        "sunglassesProb": 0.05,
        "phoneProb": 0.1,
        "sleepProb": 0.05,
    }
    data.update(overrides)
    assert set(data) == set(DRIVER_FIELDS)
    return data


def state(frame_id: int, left: dict[str, object], wheel: float = 0.1) -> DriverStateV2:
    return DriverStateV2(
        seq=frame_id,
        run_id="run",
        frame_id=frame_id,
        timestamp_sof=frame_id * 50_000_000,
        timestamp_eof=frame_id * 50_000_000 + 1,
        frame_age=0.03,
        availability=Availability.AVAILABLE,
        reason="",
        valid=True,
        readiness={name: True for name in READINESS_LAYERS},
        wheel_on_right_prob=wheel,
        left_driver_data=left,
        right_driver_data=side(),
    )


def test_the_same_states_differ_in_nothing():
    ours = {i: state(i, side()) for i in range(5)}
    result = compare(ours, dict(ours))
    assert result.compared == 5 and result.max_abs == 0.0
    assert set(result.disagreement.values()) == {0.0}
    assert result.beyond(0.0, 0.0) == []


def test_a_face_probability_across_the_threshold_flips_face_detected_on_those_frames():
    theirs = {i: state(i, side()) for i in range(10)}
    ours = {i: state(i, side(faceProb=0.6 if i < 3 else 0.9)) for i in range(10)}
    result = compare(ours, theirs)
    assert result.disagreement["faceDetected"] == pytest.approx(0.3)
    assert result.disagreement["phone"] == 0.0
    face = next(f for f in result.fields if f.column == "left.faceProb")
    assert face.max_abs == pytest.approx(0.3) and face.mean_abs == pytest.approx(0.09)
    assert result.beyond(0.2, 0.25) == [
        "max absolute difference 0.3 (left.faceProb) > 0.2",
        "faceDetected disagrees on 30.00% > 25.00%",
    ]


def test_the_monitored_side_follows_openpilot_s_wheel_position():
    """A difference on the left side flips nothing when openpilot monitors the right."""
    theirs = {0: state(0, side(), wheel=0.9)}
    ours = {0: state(0, side(phoneProb=0.9), wheel=0.9)}
    assert compare(ours, theirs).disagreement["phone"] == 0.0
    theirs = {0: state(0, side(), wheel=0.1)}
    ours = {0: state(0, side(phoneProb=0.9), wheel=0.1)}
    assert compare(ours, theirs).disagreement["phone"] == 1.0


def test_frames_without_driver_data_or_on_one_side_only_are_counted_not_compared():
    theirs = {i: state(i, side()) for i in range(4)}
    ours = {i: state(i, side()) for i in range(1, 6)}
    without = dataclasses.replace(
        state(2, side()), left_driver_data=None, right_driver_data=None, valid=False
    )
    (_, wire), _ = events.encode(without)
    (event,) = events.read_events(wire)
    theirs[2] = event.driverStateV2  # empty lists, as openpilot reads them: no driver data
    result = compare(ours, theirs)
    assert (result.compared, result.only_ours, result.only_theirs) == (2, 2, 1)


def test_a_state_read_back_from_its_event_differs_by_float32_rounding_only():
    ours = {i: state(i, side(faceProb=0.1 * i)) for i in range(6)}
    theirs = {}
    for frame_id, message in ours.items():
        (_, wire), _ = events.encode(message)
        (event,) = events.read_events(wire)
        theirs[frame_id] = event.driverStateV2
    result = compare(ours, theirs)
    assert result.compared == 6 and 0.0 < result.max_abs < 1e-6
    assert len(result.fields) == 1 + 2 * (3 + 3 + 2 + 2 + 8)  # a column per list element
    assert flatten(theirs[0]) is not None


@pytest.mark.parametrize(
    ("overrides", "closed"),
    [
        ({"leftBlinkProb": 0.9, "rightBlinkProb": 0.9}, True),
        ({"leftBlinkProb": 0.9, "rightBlinkProb": 0.8}, False),  # mean 0.85 <= 0.865
        ({"leftBlinkProb": 0.9, "rightBlinkProb": 0.9, "sunglassesProb": 0.95}, False),
        ({"leftBlinkProb": 0.9, "rightBlinkProb": 0.9, "rightEyeProb": 0.5}, False),
    ],
)
def test_the_blink_rule(overrides, closed):
    assert policy.eyes_closed(side(**overrides)) is closed


def test_a_pose_beyond_the_limits_is_distracted_looking_down_but_not_up():
    assert not policy.distracted_pose(side())
    assert policy.distracted_pose(side(faceOrientation=[-0.6, 0.0, 0.0]))  # down
    assert not policy.distracted_pose(side(faceOrientation=[0.6, 0.0, 0.0]))  # up
    assert policy.distracted_pose(side(faceOrientation=[0.0, -0.7, 0.0]))  # aside
    # the same yaw on the right-hand side is mirrored
    yaw = [0.0, 0.5, 0.0]
    assert policy.distracted_pose(side(faceOrientation=yaw)) != policy.distracted_pose(
        side(faceOrientation=yaw), right_hand=True
    )


def test_a_comparison_that_compared_no_frame_is_beyond_any_limits():
    theirs = {i: state(i, side()) for i in range(3)}
    ours = {i: state(i, side()) for i in range(10, 13)}  # no frameId in common
    result = compare(ours, theirs)
    assert result.compared == 0
    assert result.beyond(None, None) == [
        "no frame compared (no frameId with driver data on both sides)"
    ]


def test_a_value_that_is_not_finite_is_an_infinite_difference_beyond_any_tolerance():
    theirs = {0: state(0, side(faceProb=float("nan")))}
    result = compare({0: state(0, side())}, theirs)
    assert result.max_abs == float("inf")
    assert result.beyond(1e9, None) == ["max absolute difference inf (left.faceProb) > 1e+09"]
    record = result.to_record()
    assert (
        record["maxAbsDifference"] is None and record["fields"]["left.faceProb"]["maxAbs"] is None
    )
    json.dumps(record, allow_nan=False)  # the document can be written


def _random_side(rng: np.random.Generator, count: int) -> dict[str, object]:
    """Values around each rule's thresholds, so that every decision goes both ways."""
    return {
        "faceOrientation": [rng.uniform(-1, 1, count) for _ in range(3)],
        "facePosition": [rng.uniform(-0.3, 0.3, count) for _ in range(2)],
        **{
            name: rng.uniform(0, 1, count)
            for name in ("faceProb", "leftEyeProb", "rightEyeProb", "sunglassesProb", "phoneProb")
        },
        "leftBlinkProb": rng.uniform(0.7, 1, count),
        "rightBlinkProb": rng.uniform(0.7, 1, count),
    }


def test_the_decisions_over_many_frames_are_those_of_each_frame():
    rng = np.random.default_rng(7)
    count = 400
    data = _random_side(rng, count)
    right = rng.uniform(0, 1, count) > 0.5
    many = policy.decision_arrays(data, right_hand=right)
    for at in range(count):
        one = {
            name: [float(v[at]) for v in value] if isinstance(value, list) else float(value[at])
            for name, value in data.items()
        }
        expected = policy.decisions(one, right_hand=bool(right[at]))
        assert tuple(bool(many[name][at]) for name in policy.DECISIONS) == expected, at
    assert all(0 < many[name].sum() < count for name in policy.DECISIONS)  # each went both ways
