"""Decoding the model's flat output into driverStateV2 fields (spec/dms-contract.md §1.7, §1.8)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipelines.dms.messages import DRIVER_FIELDS, READINESS_LAYERS, DriverStateV2
from pipelines.dms.model.decode import (
    EXP_CLIP,
    FACE_DESCS_MIN_WIDTH,
    PROBABILITY_HEADS,
    REQUIRED_HEADS,
    WHEEL_ON_RIGHT_HEAD,
    Decoded,
    Decoder,
    DriverData,
    DriverStateFields,
    check_fields,
    decode,
    safe_exp,
    sigmoid,
)
from pipelines.dms.model.reference import REFERENCE_SLICES


def layout(face_width: int = 12, extra: int = 0) -> dict[str, slice]:
    """A head table with ``face_width``-wide face descriptors, wheel_on_right last, then ``extra``
    values no head covers."""
    table, start = {}, 0
    for side in ("lhd", "rhd"):
        table[f"face_descs_{side}"] = slice(start, start + face_width)
        start += face_width
        for head in PROBABILITY_HEADS:
            table[f"{head}_{side}"] = slice(start, start + 1)
            start += 1
    table["wheel_on_right"] = slice(start, start + 1)
    table["features"] = slice(start + 1, start + 1 + extra)
    return table


def output_for(table: dict[str, slice], values: dict[str, list[float]]) -> np.ndarray:
    out = np.zeros(max(s.stop for s in table.values()), dtype=np.float32)
    for head, head_values in values.items():
        s = table[head]
        out[s.start : s.start + len(head_values)] = head_values
    return out


def test_safe_exp_clips_its_argument_at_11():
    clipped = pytest.approx(math.exp(EXP_CLIP), rel=1e-6)
    assert EXP_CLIP == 11.0
    assert safe_exp(11.0) == clipped
    assert safe_exp(500.0) == clipped
    assert safe_exp(np.inf) == clipped
    assert safe_exp(10.5) == pytest.approx(math.exp(10.5), rel=1e-6)
    assert safe_exp(-1.0) == pytest.approx(math.exp(-1.0), rel=1e-6)
    assert safe_exp(np.array([0.0, 12.0])).dtype == np.float32


def test_sigmoid_is_one_over_one_plus_safe_exp_of_minus_v():
    assert sigmoid(0.0) == np.float32(0.5)
    assert sigmoid(2.0) == pytest.approx(1 / (1 + math.exp(-2.0)), rel=1e-6)
    # the clip: a very negative logit gives 1/(1+e^11), never 0
    assert sigmoid(-100.0) == np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(11.0)))
    assert sigmoid(-100.0) == pytest.approx(1.67e-5, rel=1e-2)
    assert sigmoid(100.0) == np.float32(1.0)


def test_face_descriptors_split_into_raw_values_and_exponentiated_stds():
    table = layout()
    descs = [0.1, -0.2, 0.3, 0.25, -0.15, 0.99, -1.0, 0.0, 1.0, 2.0, 20.0, 5.0]
    decoded = decode(output_for(table, {"face_descs_lhd": descs}), table)
    assert decoded.valid, decoded.reason
    left = decoded.fields.left_driver_data
    assert left.face_orientation == pytest.approx((0.1, -0.2, 0.3))
    assert left.face_position == pytest.approx((0.25, -0.15))  # the third position value is dropped
    assert left.face_orientation_std == pytest.approx(
        (math.exp(-1.0), 1.0, math.exp(1.0)), rel=1e-6
    )
    # exp(20) is clipped to exp(11); the sixth std is not published
    assert left.face_position_std == pytest.approx((math.exp(2.0), math.exp(11.0)), rel=1e-6)


def test_eleven_face_descriptors_are_enough():
    table = layout(face_width=FACE_DESCS_MIN_WIDTH)
    descs = [0.1, 0.2, 0.3, 0.4, 0.5, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    decoded = decode(output_for(table, {"face_descs_rhd": descs}), table)
    assert decoded.valid, decoded.reason
    right = decoded.fields.right_driver_data
    assert right.face_position == pytest.approx((0.4, 0.5))
    assert right.face_orientation_std == (1.0, 1.0, 1.0)
    assert right.face_position_std == pytest.approx((math.e, math.e), rel=1e-6)


def test_every_probability_head_goes_through_the_sigmoid_into_its_field_on_each_side():
    table = layout()
    logits = {f"{head}_lhd": [float(i)] for i, head in enumerate(PROBABILITY_HEADS)}
    logits |= {f"{head}_rhd": [-float(i)] for i, head in enumerate(PROBABILITY_HEADS)}
    logits["wheel_on_right"] = [3.0]
    decoded = decode(output_for(table, logits), table)
    assert decoded.valid, decoded.reason
    fields = decoded.fields
    for i, field in enumerate(PROBABILITY_HEADS.values()):
        assert fields.left_driver_data.probabilities()[field] == float(sigmoid(float(i)))
        assert fields.right_driver_data.probabilities()[field] == float(sigmoid(-float(i)))
    assert fields.wheel_on_right_prob == float(sigmoid(3.0))


def test_fields_carry_the_capnp_names_and_lengths():
    table = layout()
    fields = decode(output_for(table, {}), table).fields
    data = fields.to_dict()
    assert set(data) == {"leftDriverData", "rightDriverData", "wheelOnRightProb"}
    left = data["leftDriverData"]
    assert tuple(left) == DRIVER_FIELDS  # the schema's fields, in schema order
    assert [len(left[k]) for k in ("faceOrientation", "faceOrientationStd")] == [3, 3]
    assert [len(left[k]) for k in ("facePosition", "facePositionStd")] == [2, 2]
    assert left["faceProb"] == 0.5


def test_decoded_fields_fill_the_published_message():
    table = layout()
    fields = decode(output_for(table, {"face_prob_lhd": [2.0]}), table).fields
    message = DriverStateV2(
        seq=0,
        run_id="decode-test",
        frame_id=7,
        timestamp_sof=0,
        timestamp_eof=0,
        frame_age=0.01,
        availability="available",
        reason="",
        valid=True,
        readiness=dict.fromkeys(READINESS_LAYERS, True),
        wheel_on_right_prob=fields.wheel_on_right_prob,
        left_driver_data=fields.left_driver_data.to_dict(),
        right_driver_data=fields.right_driver_data.to_dict(),
    )
    assert message.to_record()["leftDriverData"]["faceProb"] == float(sigmoid(2.0))


def test_slices_are_followed_wherever_the_heads_lie():
    table = {head: slice(s.start + 7, s.stop + 7) for head, s in layout().items()}
    out = output_for(table, {"face_prob_rhd": [4.0]})
    decoded = decode(out, table)
    assert decoded.fields.right_driver_data.face_prob == float(sigmoid(4.0))
    assert decoded.fields.left_driver_data.face_prob == 0.5


def test_only_element_zero_of_a_wider_probability_head_is_read():
    table = layout()
    table["face_prob_lhd"] = slice(600, 604)
    out = np.zeros(610, dtype=np.float32)
    out[600:604] = [2.0, 50.0, np.float32(-7), 1.0]
    decoded = decode(out, table)
    assert decoded.valid
    assert decoded.fields.left_driver_data.face_prob == float(sigmoid(2.0))


def test_the_reference_layout_decodes():
    out = np.linspace(-3, 3, 553, dtype=np.float32)
    assert decode(out.reshape(1, -1), REFERENCE_SLICES).valid


@pytest.mark.parametrize("head", sorted(REQUIRED_HEADS))
def test_a_missing_head_makes_the_output_invalid_with_its_name(head):
    table = layout()
    del table[head]
    decoded = decode(np.zeros(100, dtype=np.float32), table)
    assert decoded == Decoded(fields=None, valid=False, reason=decoded.reason)
    assert f"head {head!r} is missing" in decoded.reason


def test_face_descriptors_shorter_than_eleven_are_invalid():
    table = layout(face_width=10)
    decoded = decode(np.zeros(100, dtype=np.float32), table)
    assert not decoded.valid
    assert "'face_descs_lhd' has 10 value(s); expected at least 11" in decoded.reason


def test_an_empty_probability_head_is_invalid():
    table = layout()
    table["sleep_prob_rhd"] = slice(5, 5)
    decoded = decode(np.zeros(100, dtype=np.float32), table)
    assert "'sleep_prob_rhd' has 0 value(s); expected at least 1" in decoded.reason


def test_an_output_shorter_than_the_slices_is_invalid():
    table = layout()
    decoded = decode(np.zeros(30, dtype=np.float32), table)
    assert not decoded.valid
    assert "past the end of the output (30 values)" in decoded.reason


@pytest.mark.parametrize("bad", [slice(3, 2, 2), slice(-5, None), slice("a", 3), slice(None, None)])
def test_a_slice_that_is_not_contiguous_and_non_negative_is_invalid(bad):
    table = layout()
    table["wheel_on_right"] = bad
    decoded = decode(np.zeros(100, dtype=np.float32), table)
    assert not decoded.valid
    assert "'wheel_on_right'" in decoded.reason


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("head", ["face_descs_lhd", "face_prob_rhd", "wheel_on_right"])
def test_a_value_that_is_not_finite_makes_the_output_invalid(head, value):
    table = layout()
    out = output_for(table, {})
    out[table[head].start] = value
    decoded = decode(out, table)
    assert not decoded.valid
    assert decoded.fields is None
    assert f"head {head!r}[0]" in decoded.reason
    assert "not finite" in decoded.reason


def test_a_value_that_is_not_finite_outside_every_decoded_head_still_counts():
    table = layout(extra=512)
    out = output_for(table, {})
    out[-1] = np.nan  # in the feature tail: openpilot would publish; here the output is suspect
    decoded = decode(out, table)
    assert not decoded.valid
    assert "'features'" in decoded.reason


def test_inputs_that_are_not_numbers_are_invalid_not_an_exception():
    decoded = decode(["a", "b"], layout())
    assert not decoded.valid
    assert "not an array of numbers" in decoded.reason


def fields_with(**changes: float) -> DriverStateFields:
    side = DriverData(
        face_orientation=(0.0, 0.0, 0.0),
        face_orientation_std=(1.0, 1.0, 1.0),
        face_position=(0.0, 0.0),
        face_position_std=(1.0, 1.0),
        face_prob=0.5,
        left_eye_prob=0.5,
        right_eye_prob=0.5,
        left_blink_prob=0.5,
        right_blink_prob=0.5,
        sunglasses_prob=0.5,
        phone_prob=0.5,
        sleep_prob=0.5,
    )
    wheel = changes.pop("wheel_on_right_prob", 0.5)
    return DriverStateFields(
        left_driver_data=side,
        right_driver_data=DriverData(**{**side.__dict__, **changes}),
        wheel_on_right_prob=wheel,
    )


def test_in_range_fields_pass_the_check():
    assert check_fields(fields_with()) is None
    assert check_fields(fields_with(phone_prob=0.0, sleep_prob=1.0)) is None


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"phone_prob": 1.5}, "rightDriverData.phoneProb = 1.5; expected a probability in [0, 1]"),
        ({"face_prob": -0.1}, "rightDriverData.faceProb = -0.1"),
        ({"sleep_prob": float("nan")}, "rightDriverData.sleepProb = nan"),
        ({"wheel_on_right_prob": 2.0}, "wheelOnRightProb = 2.0"),
        ({"face_position": (0.0, float("inf"))}, "rightDriverData.facePosition"),
        ({"face_orientation_std": (1.0, -1.0, 1.0)}, "expected stds >= 0"),
    ],
)
def test_probabilities_out_of_range_and_values_not_finite_fail_the_check(changes, reason):
    assert reason in check_fields(fields_with(**changes))


def test_the_decoder_reads_the_same_values_as_decoding_each_head_on_its_own():
    """The vectorised decoder against openpilot's per-head decoding, element by element in
    float32, on outputs spread wide enough to hit both clips."""
    decoder = Decoder(REFERENCE_SLICES)
    rng = np.random.default_rng(7)
    length = max(s.stop for s in REFERENCE_SLICES.values())
    for _ in range(200):
        out = (rng.standard_normal(length) * 8).astype(np.float32)
        fields = decoder(out).fields
        assert fields is not None
        for side in ("lhd", "rhd"):
            descs = out[REFERENCE_SLICES[f"face_descs_{side}"]]
            data = fields.side(side)
            assert data.face_orientation == tuple(float(v) for v in descs[:3])
            assert data.face_position == tuple(float(v) for v in descs[3:5])
            stds = [float(safe_exp(v)) for v in descs[-6:-1]]
            assert data.face_orientation_std + data.face_position_std == tuple(stds)
            for head, name in PROBABILITY_HEADS.items():
                value = out[REFERENCE_SLICES[f"{head}_{side}"]][0]
                assert data.probabilities()[name] == float(sigmoid(value))
        wheel = out[REFERENCE_SLICES[WHEEL_ON_RIGHT_HEAD]][0]
        assert fields.wheel_on_right_prob == float(sigmoid(wheel))
