"""The DMS warp against a slow, independent reference written straight from the spec (§1.4).

The reference computes every model pixel's source in pure Python: float64 arithmetic, Python's
``round`` (half to even), the byte at ``row * stride + column`` or 16 outside the image. It is
frame-independent, so it is computed once per (matrix, geometry) and cached.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from pipelines.dms.model.warp import (
    BORDER_VALUE,
    DM_INTRINSICS,
    MODEL_INPUT_HEIGHT,
    MODEL_INPUT_SIZE,
    MODEL_INPUT_WIDTH,
    CropPlan,
    GatherPlan,
    Warper,
    WarpInputError,
    cabin_intrinsics,
    pinhole_intrinsics,
    plan_warp,
    warp_matrix,
)

# The matrices as the spec states them (not computed by the code under test).
CROP_MATRIX = ((1.0, 0.0, 244.0), (0.0, 1.0, 248.0), (0.0, 0.0, 1.0))
SCALED_MATRIX = ((0.75, 0.0, 132.0), (0.0, 0.75, 113.0), (0.0, 0.0, 1.0))
CAMERAS = {
    "1928x1208": (1928, 1208, 2048, CROP_MATRIX),
    "1344x760": (1344, 760, 1408, SCALED_MATRIX),
}

PAD = 7  # what fills row padding, the rows past the image and chroma; never an image value
Matrix = tuple[tuple[float, float, float], ...]


def align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def nv12_size(width: int, height: int) -> int:
    """§1.5's buffer size for a frame (the frames below are whole NV12 buffers)."""
    stride, y_height, uv_height = align(width, 128), align(height, 32), align(height // 2, 16)
    size = stride * y_height + (stride * uv_height + 4096) + max(16384, 8 * stride)
    return align(align(size, 4096) + align(width, 512) * 512, 4096)


def make_frame(
    width: int, height: int, stride: int, *, seed: int = 0, pad: int = PAD, size: int | None = None
) -> np.ndarray:
    """An NV12-sized buffer: random luma in 20..255 (never 16, never ``pad``), ``pad`` elsewhere."""
    rng = np.random.default_rng(seed)
    frame = np.full(size or max(nv12_size(width, height), height * stride), pad, np.uint8)
    rows = frame[: height * stride].reshape(height, stride)
    rows[:, :width] = rng.integers(20, 256, size=(height, width), dtype=np.uint8)
    return frame


@functools.cache
def reference_sources(matrix: Matrix, width: int, height: int, stride: int) -> np.ndarray:
    """Per model pixel (row-major): the byte offset it reads, or -1 for the border."""
    (m00, m01, m02), (m10, m11, m12), (m20, m21, m22) = matrix
    sources = []
    for y in range(MODEL_INPUT_HEIGHT):
        for x in range(MODEL_INPUT_WIDTH):
            w = m20 * x + m21 * y + m22
            column = round((m00 * x + m01 * y + m02) / w)
            row = round((m10 * x + m11 * y + m12) / w)
            inside = 0 <= column <= width - 1 and 0 <= row <= height - 1
            sources.append(row * stride + column if inside else -1)
    return np.array(sources, dtype=np.int64)


def reference_warp(frame: np.ndarray, matrix: Matrix, width: int, height: int, stride: int):
    sources = reference_sources(matrix, width, height, stride)
    flat = frame.reshape(-1)
    return np.where(sources >= 0, flat[np.maximum(sources, 0)], BORDER_VALUE).reshape(1, -1)


def as_matrix(m: np.ndarray) -> Matrix:
    return tuple(tuple(float(v) for v in row) for row in m)  # type: ignore[return-value]


def intrinsics_for(matrix: Matrix):
    """Camera intrinsics that make ``warp_matrix`` produce exactly ``matrix``."""
    camera = np.array(matrix) @ DM_INTRINSICS
    return lambda width, height: camera


def garbage_out() -> np.ndarray:
    """An output buffer full of a value the warp never writes: every byte must be overwritten."""
    return np.full((1, MODEL_INPUT_SIZE), PAD, np.uint8)


def assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape == (1, MODEL_INPUT_SIZE)
    wrong = np.flatnonzero(actual.reshape(-1) != expected.reshape(-1))
    where = [divmod(int(i), MODEL_INPUT_WIDTH) for i in wrong[:5]]
    assert wrong.size == 0, f"{wrong.size} pixels differ, first (row, column): {where}"


# --- intrinsics and the matrix -----------------------------------------------------------------


def test_model_intrinsics_are_the_1928_cameras_focal_length_bottom_aligned():
    assert DM_INTRINSICS.tolist() == [[567.0, 0.0, 720.0], [0.0, 567.0, 356.0], [0.0, 0.0, 1.0]]


@pytest.mark.parametrize("camera", CAMERAS)
def test_warp_matrix_is_exactly_the_spec_matrix_in_float32(camera):
    width, height, _, expected = CAMERAS[camera]
    matrix = warp_matrix(cabin_intrinsics(width, height))
    assert matrix.dtype == np.float32
    assert matrix.tolist() == [list(row) for row in expected]


def test_cabin_intrinsics_are_centred_pinholes_with_the_spec_focal_lengths():
    assert cabin_intrinsics(1928, 1208).tolist() == [[567, 0, 964], [0, 567, 604], [0, 0, 1]]
    assert cabin_intrinsics(1344, 760).tolist() == [[425.25, 0, 672], [0, 425.25, 380], [0, 0, 1]]


def test_unknown_camera_resolution_is_refused_naming_the_known_ones():
    with pytest.raises(WarpInputError, match=r"1280x720.*1928x1208.*1344x760"):
        cabin_intrinsics(1280, 720)


def test_singular_or_malformed_intrinsics_are_refused():
    with pytest.raises(WarpInputError, match="invertible"):
        warp_matrix(np.zeros((3, 3)))
    with pytest.raises(WarpInputError, match="3x3"):
        warp_matrix(np.eye(2))
    with pytest.raises(WarpInputError, match="focal"):
        pinhole_intrinsics(float("nan"), 10, 10)


# --- the two cabin cameras ----------------------------------------------------------------------


@pytest.mark.parametrize("camera", CAMERAS)
def test_each_cabin_camera_matches_the_reference(camera):
    width, height, stride, matrix = CAMERAS[camera]
    frame = make_frame(width, height, stride)
    assert frame.size == {"1928x1208": 4_804_608, "1344x760": 2_428_928}[camera]
    out = Warper().warp(frame, width, height, stride)
    assert_same(out, reference_warp(frame, matrix, width, height, stride))
    assert PAD not in out


def test_the_1928_camera_is_a_crop_of_the_bottom_centre():
    warper = Warper()
    frame = make_frame(1928, 1208, 2048)
    out = warper.warp(frame, 1928, 1208, 2048)
    assert isinstance(warper.plan, CropPlan)
    assert (warper.plan.dx, warper.plan.dy) == (244, 248)
    image = frame[: 1208 * 2048].reshape(1208, 2048)
    assert np.array_equal(out.reshape(960, 1440), image[248:1208, 244:1684])


def test_the_1344_camera_fills_the_98_rows_below_the_sensor_with_16():
    warper = Warper()
    out = warper.warp(make_frame(1344, 760, 1408), 1344, 760, 1408).reshape(960, 1440)
    assert isinstance(warper.plan, GatherPlan)
    assert (out[862:] == BORDER_VALUE).all()
    assert (out[:862] != BORDER_VALUE).all()  # image bytes are never 16 in these frames


# --- rounding ties ------------------------------------------------------------------------------


def test_1344_camera_ties_round_half_to_even():
    # 0.75 * x + 132 ends in .5 for x = 2 (mod 4): 133.5 -> 134 (up), 136.5 -> 136 (down).
    width, height, stride = 1344, 760, 1408
    columns = np.arange(width, dtype=np.int64)
    rows = np.arange(height, dtype=np.int64)[:, None]
    frame = np.full(nv12_size(width, height), PAD, np.uint8)
    image = frame[: height * stride].reshape(height, stride)
    image[:, :width] = (columns * 7 + rows * 13) % 230 + 20  # neighbours always differ
    out = Warper().warp(frame, width, height, stride).reshape(960, 1440)
    for x, y, column, row in [
        (2, 0, 134, 113),
        (6, 0, 136, 113),
        (0, 2, 132, 114),
        (0, 6, 132, 118),
    ]:
        assert out[y, x] == image[row, column], (x, y)
    assert_same(out.reshape(1, -1), reference_warp(frame, SCALED_MATRIX, width, height, stride))


def test_ties_at_the_edges_round_half_to_even_minus_one_half_is_inside():
    # s = x - 0.5: -0.5 -> 0 (inside), 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 63.5 -> 64 (outside for W = 64)
    matrix = ((1.0, 0.0, -0.5), (0.0, 1.0, -0.5), (0.0, 0.0, 1.0))
    width, height, stride = 64, 48, 80
    frame = make_frame(width, height, stride, size=height * stride)
    warper = Warper(intrinsics=intrinsics_for(matrix))
    out = warper.warp(frame, width, height, stride, out=garbage_out())
    assert isinstance(warper.plan, GatherPlan)
    image = frame.reshape(height, stride)
    row0 = out.reshape(960, 1440)[0]
    assert row0[:5].tolist() == image[0, [0, 0, 2, 2, 4]].tolist()
    assert row0[63] == image[0, 62] and row0[64] == BORDER_VALUE
    assert_same(out, reference_warp(frame, matrix, width, height, stride))


def test_full_frame_comparisons_include_ties():
    sources = reference_sources(SCALED_MATRIX, 1344, 760, 1408)
    ties = [x for x in range(1440) if (0.75 * x + 132) % 1 == 0.5]
    assert len(ties) == 360 and sources.size == MODEL_INPUT_SIZE


# --- borders, padding, other geometries ---------------------------------------------------------


def test_a_crop_that_leaves_the_image_on_every_side_gets_16_there():
    # f = 567 on a 1400x600 camera: model (x, y) = camera (x - 20, y - 56)
    width, height, stride = 1400, 600, 1408
    warper = Warper(intrinsics=lambda w, h: pinhole_intrinsics(567.0, w, h))
    frame = make_frame(width, height, stride)
    out = warper.warp(frame, width, height, stride, out=garbage_out())
    assert isinstance(warper.plan, CropPlan)
    assert (warper.plan.dx, warper.plan.dy) == (-20, -56)
    out2d = out.reshape(960, 1440)
    for band in (out2d[:56], out2d[656:], out2d[:, :20], out2d[:, 1420:]):
        assert (band == BORDER_VALUE).all()
    assert (out2d[56:656, 20:1420] != BORDER_VALUE).all()
    matrix = as_matrix(warp_matrix(pinhole_intrinsics(567.0, width, height)))
    assert_same(out, reference_warp(frame, matrix, width, height, stride))


def test_a_scaled_warp_past_the_left_right_and_bottom_edges_matches_the_reference():
    # f = 425.25 on a 1000x700 camera: camera = 0.75 * model + (-40, 83)
    width, height, stride = 1000, 700, 1024
    intrinsics = lambda w, h: pinhole_intrinsics(425.25, w, h)  # noqa: E731
    matrix = as_matrix(warp_matrix(intrinsics(width, height)))
    assert matrix == ((0.75, 0.0, -40.0), (0.0, 0.75, 83.0), (0.0, 0.0, 1.0))
    frame = make_frame(width, height, stride)
    out = Warper(intrinsics=intrinsics).warp(frame, width, height, stride, out=garbage_out())
    assert_same(out, reference_warp(frame, matrix, width, height, stride))
    assert PAD not in out


@pytest.mark.parametrize(
    ("width", "height", "stride", "focal"),
    [
        (1928, 1208, 2048, 567.0),
        (1344, 760, 1408, 425.25),
        (1400, 600, 1408, 567.0),
        (1000, 700, 1024, 425.25),
    ],
)
def test_stride_padding_never_reaches_the_output(width, height, stride, focal):
    warper = Warper(intrinsics=lambda w, h: pinhole_intrinsics(focal, w, h))
    zeros = warper.warp(make_frame(width, height, stride, pad=0), width, height, stride).copy()
    ones = warper.warp(make_frame(width, height, stride, pad=255), width, height, stride)
    assert np.array_equal(zeros, ones)
    assert 0 not in zeros  # image bytes are 20..255: a 0 could only come from the padding


def test_a_perspective_matrix_matches_the_reference_up_to_float32_near_ties():
    # The warp computes in float32 (as openpilot does), the reference in float64: they may
    # disagree only where a coordinate is within float32 error of a .5 tie.
    matrix = ((0.8, 0.05, 100.0), (0.02, 0.8, 50.0), (1e-5, 2e-5, 1.0))
    matrix32 = as_matrix(np.array(matrix, dtype=np.float32))
    width, height, stride = 1344, 760, 1408
    frame = make_frame(width, height, stride)
    warper = Warper(intrinsics=intrinsics_for(matrix32))
    out = warper.warp(frame, width, height, stride, out=garbage_out())
    assert isinstance(warper.plan, GatherPlan)
    expected = reference_warp(frame, matrix32, width, height, stride)
    (m00, m01, m02), (m10, m11, m12), (m20, m21, m22) = matrix32
    wrong = np.flatnonzero(out.reshape(-1) != expected.reshape(-1))
    assert wrong.size < 300  # of 1,382,400
    for position in wrong.tolist():
        y, x = divmod(position, MODEL_INPUT_WIDTH)
        w = m20 * x + m21 * y + m22
        sx, sy = (m00 * x + m01 * y + m02) / w, (m10 * x + m11 * y + m12) / w
        assert min(abs(math.modf(sx)[0] % 1 - 0.5), abs(math.modf(sy)[0] % 1 - 0.5)) < 1e-3


# --- geometry changes ---------------------------------------------------------------------------


def test_a_geometry_change_mid_stream_gets_a_fresh_mapping():
    warper = Warper()
    for camera in ("1928x1208", "1344x760", "1928x1208"):
        width, height, stride, matrix = CAMERAS[camera]
        frame = make_frame(width, height, stride, seed=width)
        out = warper.warp(frame, width, height, stride)
        assert_same(out, reference_warp(frame, matrix, width, height, stride))
    assert warper.plans_built == 3


def test_the_same_geometry_keeps_its_plan():
    warper = Warper()
    for seed in range(3):
        warper.warp(make_frame(1344, 760, 1408, seed=seed), 1344, 760, 1408)
    assert warper.plans_built == 1


def test_a_stride_change_alone_rebuilds_the_mapping():
    warper = Warper()
    warper.warp(make_frame(1344, 760, 1408), 1344, 760, 1408)
    frame = make_frame(1344, 760, 1536, seed=1)
    out = warper.warp(frame, 1344, 760, 1536)
    assert warper.plans_built == 2 and warper.plan is not None and warper.plan.stride == 1536
    assert_same(out, reference_warp(frame, SCALED_MATRIX, 1344, 760, 1536))


def test_a_height_change_alone_rebuilds_the_mapping():
    intrinsics = lambda w, h: pinhole_intrinsics(567.0, w, h)  # noqa: E731
    warper = Warper(intrinsics=intrinsics)
    warper.warp(make_frame(1400, 600, 1408), 1400, 600, 1408)
    frame = make_frame(1400, 700, 1408, seed=2)
    out = warper.warp(frame, 1400, 700, 1408)
    assert warper.plans_built == 2
    matrix = as_matrix(warp_matrix(intrinsics(1400, 700)))
    assert matrix[1][2] == 350 - 356
    assert_same(out, reference_warp(frame, matrix, 1400, 700, 1408))


# --- buffers ------------------------------------------------------------------------------------


def test_output_is_one_row_of_uint8_and_the_warpers_own_buffer_is_reused():
    warper = Warper()
    first = warper.warp(make_frame(1928, 1208, 2048, seed=1), 1928, 1208, 2048)
    snapshot = first.copy()
    second = warper.warp(make_frame(1928, 1208, 2048, seed=2), 1928, 1208, 2048)
    assert first is second is warper.out
    assert second.shape == (1, MODEL_INPUT_SIZE) and second.dtype == np.uint8
    assert not np.array_equal(snapshot, second)


def test_a_given_out_buffer_is_written_and_returned_leaving_the_warpers_own_alone():
    warper = Warper()
    own = warper.out.copy()
    out = np.zeros((1, MODEL_INPUT_SIZE), np.uint8)
    frame = make_frame(1344, 760, 1408)
    result = warper.warp(frame, 1344, 760, 1408, out=out)
    assert result is out
    assert np.array_equal(warper.out, own)
    assert_same(out, reference_warp(frame, SCALED_MATRIX, 1344, 760, 1408))


def test_a_bare_y_plane_and_bytes_are_accepted():
    width, height, stride = 1344, 760, 1408
    frame = make_frame(width, height, stride)
    expected = reference_warp(frame, SCALED_MATRIX, width, height, stride)
    minimal = frame[: (height - 1) * stride + width].copy()
    assert_same(Warper().warp(minimal, width, height, stride), expected)
    assert_same(Warper().warp(bytes(frame), width, height, stride), expected)
    plane = frame[: height * stride].reshape(height, stride)[:, :width].copy()  # no padding
    assert_same(Warper().warp(plane, width, height, width), expected)


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (np.zeros(nv12_size(1344, 760), np.uint16), "expected uint8.*got dtype uint16"),
        (np.zeros(nv12_size(1344, 760), np.float32), "expected uint8.*got dtype float32"),
        (np.zeros(2 * nv12_size(1344, 760), np.uint8)[::2], "C-contiguous"),
        (list(range(10)), "got list"),
        (np.zeros(759 * 1408 + 1343, np.uint8), r"needs at least 1070016 bytes.*got 1070015"),
    ],
)
def test_bad_frames_are_refused_saying_what_was_expected(frame, match):
    warper = Warper()
    before = warper.out.copy()
    with pytest.raises(WarpInputError, match=match):
        warper.warp(frame, 1344, 760, 1408)
    assert np.array_equal(warper.out, before)


@pytest.mark.parametrize(
    ("width", "height", "stride", "match"),
    [
        (1344, 760, 1000, r"stride: expected at least the width \(1344\)"),
        (0, 760, 1408, "width: expected a positive integer, got 0"),
        (1344, 760.0, 1408, "height: expected a positive integer, got 760.0"),
        (1280, 720, 1280, "no cabin camera intrinsics for a 1280x720 frame"),
    ],
)
def test_bad_geometries_are_refused(width, height, stride, match):
    with pytest.raises(WarpInputError, match=match):
        Warper().warp(np.zeros(nv12_size(1344, 760), np.uint8), width, height, stride)


@pytest.mark.parametrize(
    ("out", "match"),
    [
        (np.zeros(MODEL_INPUT_SIZE, np.uint8), r"shape \(1, 1382400\).*got dtype uint8, shape"),
        (np.zeros((1, MODEL_INPUT_SIZE), np.float32), "got dtype float32"),
        (np.zeros((1, MODEL_INPUT_SIZE), np.uint8).copy(order="C")[:, ::-1], "C-contiguous"),
        (b"\0" * MODEL_INPUT_SIZE, "got bytes"),
    ],
)
def test_bad_output_buffers_are_refused(out, match):
    with pytest.raises(WarpInputError, match=match):
        Warper().warp(make_frame(1344, 760, 1408), 1344, 760, 1408, out=out)


def test_a_read_only_or_overlapping_output_is_refused():
    frame = make_frame(1344, 760, 1408)
    read_only = np.zeros((1, MODEL_INPUT_SIZE), np.uint8)
    read_only.flags.writeable = False
    with pytest.raises(WarpInputError, match="read-only"):
        Warper().warp(frame, 1344, 760, 1408, out=read_only)
    with pytest.raises(WarpInputError, match="overlap"):
        Warper().warp(frame, 1344, 760, 1408, out=frame[:MODEL_INPUT_SIZE].reshape(1, -1))


def test_plans_refuse_non_finite_matrices():
    with pytest.raises(WarpInputError, match="finite 3x3"):
        plan_warp(np.full((3, 3), np.nan), 1344, 760, 1408)


@pytest.mark.parametrize(
    ("matrix", "plan_type"),
    [
        (((1.0, 0.0, 5000.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)), CropPlan),
        (((0.75, 0.0, 5000.0), (0.0, 0.75, 0.0), (0.0, 0.0, 1.0)), GatherPlan),
    ],
)
def test_a_camera_that_sees_none_of_the_model_frame_gives_all_border(matrix, plan_type):
    plan = plan_warp(np.array(matrix), 1344, 760, 1408)
    assert isinstance(plan, plan_type)
    out = garbage_out()
    plan.apply(make_frame(1344, 760, 1408), out.reshape(-1))
    assert (out == BORDER_VALUE).all()


def test_a_horizon_in_the_model_frame_is_border_not_an_error():
    # w = 1 - x / 1024 is 0 at x = 1024 (division by zero) and negative beyond (behind the camera)
    matrix = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (-1 / 1024, 0.0, 1.0))
    width, height, stride = 1344, 760, 1408
    frame = make_frame(width, height, stride)
    out = Warper(intrinsics=intrinsics_for(matrix)).warp(frame, width, height, stride)
    out2d = out.reshape(960, 1440)
    assert (out2d[:, 1024:] == BORDER_VALUE).all()
    assert out2d[0, 0] == frame[0]
