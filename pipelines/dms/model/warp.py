"""The DMS model's input image: openpilot's warp of the cabin camera's luma plane to 1440x960.

What openpilot's ``dmonitoringmodeld`` does (spec/dms-contract.md §1.3-1.5), reproduced bit for bit:

* the matrix ``M = (K_dm · K_cam⁻¹)⁻¹`` (float64, then float32) maps a *model* pixel (x, y) to a
  *camera* pixel, from the camera's pinhole intrinsics and the model frame's
  (:data:`DM_INTRINSICS`);
* every model pixel takes the camera luma byte nearest to ``M · (x, y, 1)`` (float32 arithmetic,
  rounded half to even), read at ``row · stride + column`` of the NV12 buffer, so only the Y plane
  is ever read and row padding never is;
* a model pixel whose rounded source lies outside the camera image gets :data:`BORDER_VALUE` (16,
  luma black);
* the result is one row of 960·1440 bytes: shape ``(1, 1382400)``, uint8.

For the 1928x1208 camera the matrix is a pure integer translation and the warp is a slice copy; any
other matrix is served by source indices computed once per frame geometry and a gather per frame.
openpilot computes its matrix on the first frame and only checks the width afterwards; a
:class:`Warper` rebuilds its plan whenever the width, height or stride changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "BORDER_VALUE",
    "CABIN_FOCAL_LENGTHS",
    "DM_INTRINSICS",
    "MODEL_INPUT_HEIGHT",
    "MODEL_INPUT_SIZE",
    "MODEL_INPUT_WIDTH",
    "CropPlan",
    "GatherPlan",
    "WarpInputError",
    "WarpPlan",
    "Warper",
    "cabin_intrinsics",
    "pinhole_intrinsics",
    "plan_warp",
    "warp_matrix",
]

MODEL_INPUT_WIDTH: Final = 1440
MODEL_INPUT_HEIGHT: Final = 960
MODEL_INPUT_SIZE: Final = MODEL_INPUT_WIDTH * MODEL_INPUT_HEIGHT
"""Bytes of the model's ``input_img``: 1,382,400."""
BORDER_VALUE: Final = 16
"""What a model pixel gets when its source lies outside the camera image (luma black level)."""

CABIN_FOCAL_LENGTHS: Final[Mapping[tuple[int, int], float]] = MappingProxyType(
    {
        (1928, 1208): 567.0,  # AR0231 / OX03C10 cabin camera (tici, tizi)
        (1344, 760): 567.0 * 3 / 4,  # OS04C10, 2688x1520 binned by 2 (mici)
    }
)
"""Focal length in pixels of each cabin camera, by (width, height); cx = W/2, cy = H/2."""

DM_INTRINSICS: Final[NDArray[np.float64]] = np.array(
    [[567.0, 0.0, 720.0], [0.0, 567.0, 480.0 - (1208 - 960) / 2], [0.0, 0.0, 1.0]]
)
"""The model frame's intrinsics: the 1928x1208 camera's focal length, centred horizontally, its
principal point 356 px from the top (the model sees the bottom 960 rows of that camera)."""
DM_INTRINSICS.flags.writeable = False

IntrinsicsFor = Callable[[int, int], ArrayLike]
"""Given a frame's (width, height), the camera's 3x3 intrinsic matrix."""
FrameBuffer = NDArray[np.uint8] | bytes | bytearray | memoryview


class WarpInputError(ValueError):
    """A frame, a geometry, intrinsics or an output buffer that the warp cannot use; the message
    says what was expected and what was given."""


def pinhole_intrinsics(focal: float, width: int, height: int) -> NDArray[np.float64]:
    """``[[f, 0, W/2], [0, f, H/2], [0, 0, 1]]``: a camera whose principal point is the centre."""
    if not np.isfinite(focal) or focal <= 0:
        raise WarpInputError(f"focal length: expected a finite positive number, got {focal!r}")
    return np.array([[focal, 0.0, width / 2], [0.0, focal, height / 2], [0.0, 0.0, 1.0]])


def cabin_intrinsics(width: int, height: int) -> NDArray[np.float64]:
    """The intrinsics of the cabin camera with this resolution (:data:`CABIN_FOCAL_LENGTHS`).

    Raises :class:`WarpInputError` for any other resolution: openpilot has no warp for it, and
    guessing a focal length would feed the model a wrongly scaled face.
    """
    focal = CABIN_FOCAL_LENGTHS.get((width, height))
    if focal is None:
        known = ", ".join(f"{w}x{h} (f={f:g})" for (w, h), f in CABIN_FOCAL_LENGTHS.items())
        raise WarpInputError(
            f"no cabin camera intrinsics for a {width}x{height} frame; known: {known}. "
            "Give the Warper an intrinsics function for another camera."
        )
    return pinhole_intrinsics(focal, width, height)


def warp_matrix(
    camera_intrinsics: ArrayLike, model_intrinsics: ArrayLike = DM_INTRINSICS
) -> NDArray[np.float32]:
    """``(K_model · K_camera⁻¹)⁻¹`` computed in float64 and returned as float32, as openpilot does.

    The matrix maps a model pixel (x, y, 1) to a camera pixel (homogeneous). Exact values:
    ``[[1, 0, 244], [0, 1, 248], [0, 0, 1]]`` for the 1928x1208 camera and
    ``[[0.75, 0, 132], [0, 0.75, 113], [0, 0, 1]]`` for the 1344x760 one.
    """
    cam = _matrix3("camera intrinsics", camera_intrinsics)
    model = _matrix3("model intrinsics", model_intrinsics)
    try:
        matrix = np.linalg.inv(model @ np.linalg.inv(cam))
    except np.linalg.LinAlgError:
        raise WarpInputError(
            "intrinsics: expected invertible 3x3 matrices, got a singular one"
        ) from None
    return matrix.astype(np.float32)


def _matrix3(what: str, value: ArrayLike) -> NDArray[np.float64]:
    matrix = np.asarray(value, dtype=np.float64)
    if matrix.shape != (3, 3) or not np.isfinite(matrix).all():
        raise WarpInputError(f"{what}: expected a finite 3x3 matrix, got {matrix!r}")
    return matrix


class WarpPlan(ABC):
    """What one frame geometry needs, computed once: apply it to every frame of that geometry.

    ``apply`` takes the frame as a flat uint8 array (already checked to hold at least
    :attr:`min_bytes` bytes) and writes all :data:`MODEL_INPUT_SIZE` bytes of ``out``.
    """

    def __init__(self, matrix: NDArray[np.float32], width: int, height: int, stride: int) -> None:
        _check_geometry(width, height, stride)
        self.matrix = matrix
        self.width = width
        self.height = height
        self.stride = stride

    @property
    def geometry(self) -> tuple[int, int, int]:
        """(width, height, stride) of the frames this plan is for."""
        return (self.width, self.height, self.stride)

    @property
    def min_bytes(self) -> int:
        """The smallest buffer holding every luma byte: ``(height - 1) · stride + width``."""
        return (self.height - 1) * self.stride + self.width

    @abstractmethod
    def apply(self, flat: NDArray[np.uint8], out: NDArray[np.uint8]) -> None:
        """Warp the frame ``flat`` (1-D) into ``out`` (1-D, :data:`MODEL_INPUT_SIZE` bytes)."""


class CropPlan(WarpPlan):
    """A pure integer translation: model pixel (x, y) = camera pixel (x + dx, y + dy).

    Rounding is the identity here, so the warp is a rectangle copy plus border bands.
    """

    def __init__(
        self, matrix: NDArray[np.float32], width: int, height: int, stride: int, dx: int, dy: int
    ) -> None:
        super().__init__(matrix, width, height, stride)
        self.dx = dx
        self.dy = dy
        # the model rows and columns whose source lies inside the camera image
        self._rows = (max(0, -dy), max(0, min(MODEL_INPUT_HEIGHT, height - dy)))
        self._cols = (max(0, -dx), max(0, min(MODEL_INPUT_WIDTH, width - dx)))

    def apply(self, flat: NDArray[np.uint8], out: NDArray[np.uint8]) -> None:
        out2d = out.reshape(MODEL_INPUT_HEIGHT, MODEL_INPUT_WIDTH)
        (y0, y1), (x0, x1) = self._rows, self._cols
        if y0 >= y1 or x0 >= x1:
            out2d.fill(BORDER_VALUE)
            return
        out2d[:y0] = BORDER_VALUE
        out2d[y1:] = BORDER_VALUE
        out2d[y0:y1, :x0] = BORDER_VALUE
        out2d[y0:y1, x1:] = BORDER_VALUE
        image = _luma_rows(flat, self.width, self.height, self.stride)
        out2d[y0:y1, x0:x1] = image[y0 + self.dy : y1 + self.dy, x0 + self.dx : x1 + self.dx]


class GatherPlan(WarpPlan):
    """Any other matrix: the flat source index of every model pixel, computed once.

    Only the span of output positions from the first to the last in-image pixel is gathered; the
    border before and after it is a fill, and border pixels inside it are overwritten after the
    gather (none for the 1344x760 camera, whose border is the bottom 98 rows).
    """

    def __init__(self, matrix: NDArray[np.float32], width: int, height: int, stride: int) -> None:
        super().__init__(matrix, width, height, stride)
        columns, rows, inside = _nearest_sources(matrix, width, height)
        flat_inside = inside.reshape(-1)
        positions = np.flatnonzero(flat_inside)
        if positions.size == 0:
            self._span = (0, 0)
            self._indices: NDArray[np.intp] = np.empty(0, dtype=np.intp)
            self._inner_border: NDArray[np.intp] = np.empty(0, dtype=np.intp)
            return
        start, stop = int(positions[0]), int(positions[-1]) + 1
        indices = rows.astype(np.intp) * stride + columns.astype(np.intp)
        self._span = (start, stop)
        self._indices = np.ascontiguousarray(indices.reshape(-1)[start:stop])
        self._inner_border = np.flatnonzero(~flat_inside[start:stop]) + start

    def apply(self, flat: NDArray[np.uint8], out: NDArray[np.uint8]) -> None:
        start, stop = self._span
        out[:start] = BORDER_VALUE
        out[stop:] = BORDER_VALUE
        if start < stop:
            np.take(flat, self._indices, out=out[start:stop])
            if self._inner_border.size:
                out[self._inner_border] = BORDER_VALUE


def plan_warp(matrix: ArrayLike, width: int, height: int, stride: int) -> WarpPlan:
    """The plan for warping frames of this geometry with ``matrix`` (model → camera pixel).

    A :class:`CropPlan` when the float32 matrix is exactly an integer translation, otherwise a
    :class:`GatherPlan`.
    """
    m = np.asarray(matrix, dtype=np.float32)
    if m.shape != (3, 3) or not np.isfinite(m).all():
        raise WarpInputError(f"warp matrix: expected a finite 3x3 matrix, got {m!r}")
    m = m.copy()
    m.flags.writeable = False
    linear_identity = m[0, 0] == 1 and m[1, 1] == 1 and m[0, 1] == 0 and m[1, 0] == 0
    affine = m[2, 0] == 0 and m[2, 1] == 0 and m[2, 2] == 1
    dx, dy = float(m[0, 2]), float(m[1, 2])
    if linear_identity and affine and dx.is_integer() and dy.is_integer():
        return CropPlan(m, width, height, stride, int(dx), int(dy))
    return GatherPlan(m, width, height, stride)


def _nearest_sources(
    m: NDArray[np.float32], width: int, height: int
) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.bool_]]:
    """Rounded source column and row of every model pixel, and whether it lies in the image.

    float32 arithmetic, as openpilot's compiled warp does it; ``np.rint`` rounds half to even.
    Columns and rows of pixels outside the image are 0 (any in-image value would do).
    """
    xs = np.arange(MODEL_INPUT_WIDTH, dtype=np.float32)[np.newaxis, :]
    ys = np.arange(MODEL_INPUT_HEIGHT, dtype=np.float32)[:, np.newaxis]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        w = m[2, 0] * xs + m[2, 1] * ys + m[2, 2]
        columns = np.rint((m[0, 0] * xs + m[0, 1] * ys + m[0, 2]) / w)
        rows = np.rint((m[1, 0] * xs + m[1, 1] * ys + m[1, 2]) / w)
    # NaN (w == 0) compares false: outside, like any coordinate past the edge
    inside = (columns >= 0) & (columns <= width - 1) & (rows >= 0) & (rows <= height - 1)
    return np.where(inside, columns, 0), np.where(inside, rows, 0), inside


def _luma_rows(flat: NDArray[np.uint8], width: int, height: int, stride: int) -> NDArray[np.uint8]:
    """The Y plane as a read-only (height, width) view: row r starts at byte r · stride."""
    view: NDArray[np.uint8] = np.lib.stride_tricks.as_strided(
        flat, shape=(height, width), strides=(stride, 1), writeable=False
    )
    return view


def _check_geometry(width: int, height: int, stride: int) -> None:
    for name, value in (("width", width), ("height", height), ("stride", stride)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise WarpInputError(f"{name}: expected a positive integer, got {value!r}")
    if stride < width:
        raise WarpInputError(
            f"stride: expected at least the width ({width}) bytes per row, got {stride}"
        )


def _flat_frame(frame: object) -> NDArray[np.uint8]:
    if isinstance(frame, np.ndarray):
        if frame.dtype != np.uint8:
            raise WarpInputError(
                f"frame: expected uint8 bytes (the NV12 buffer or its Y plane), got dtype {frame.dtype}"
            )
        if not frame.flags.c_contiguous:
            raise WarpInputError(
                "frame: expected a C-contiguous buffer (rows at multiples of the stride), "
                f"got a non-contiguous array of shape {frame.shape}"
            )
        flat: NDArray[np.uint8] = frame.reshape(-1)
        return flat
    if isinstance(frame, bytes | bytearray | memoryview):
        view = memoryview(frame)
        if view.itemsize != 1 or not view.c_contiguous:
            raise WarpInputError(
                f"frame: expected contiguous bytes, got a memoryview of format {view.format!r}"
            )
        return np.frombuffer(view, dtype=np.uint8)
    raise WarpInputError(
        f"frame: expected a uint8 numpy array or a bytes-like buffer, got {type(frame).__name__}"
    )


def _check_out(out: object) -> NDArray[np.uint8]:
    expected = f"a writeable C-contiguous uint8 array of shape (1, {MODEL_INPUT_SIZE})"
    if not isinstance(out, np.ndarray):
        raise WarpInputError(f"out: expected {expected}, got {type(out).__name__}")
    if (
        out.dtype != np.uint8
        or out.shape != (1, MODEL_INPUT_SIZE)
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        state = "" if out.flags.writeable else ", read-only"
        raise WarpInputError(
            f"out: expected {expected}, got dtype {out.dtype}, shape {out.shape}{state}"
        )
    return out


class Warper:
    """Warps each frame's luma plane to the model input, planning once per frame geometry.

    ``intrinsics`` gives the camera's 3x3 intrinsic matrix for a (width, height); the default knows
    the two cabin cameras. The plan (and with it the matrix) is rebuilt whenever a frame's width,
    height or stride differs from the previous frame's, so a geometry change mid-stream is warped
    with its own mapping.

    Without ``out=``, :meth:`warp` writes into and returns one buffer owned by the warper, the same
    array every call: copy it (or hand it on) before warping the next frame. Not thread-safe: use
    one warper per thread.
    """

    def __init__(self, intrinsics: IntrinsicsFor = cabin_intrinsics) -> None:
        self._intrinsics = intrinsics
        self._plan: WarpPlan | None = None
        self._out: NDArray[np.uint8] = np.full((1, MODEL_INPUT_SIZE), BORDER_VALUE, np.uint8)
        self.plans_built = 0
        """How many plans this warper has computed (one per geometry change)."""

    @property
    def plan(self) -> WarpPlan | None:
        """The plan for the current geometry; None before the first frame."""
        return self._plan

    @property
    def out(self) -> NDArray[np.uint8]:
        """The warper's own output buffer, shape ``(1, 1382400)``, uint8."""
        return self._out

    def plan_for(self, width: int, height: int, stride: int) -> WarpPlan:
        """The plan for this geometry: the current one if it matches, else a new one."""
        plan = self._plan
        if plan is not None and plan.geometry == (width, height, stride):
            return plan
        _check_geometry(width, height, stride)
        matrix = warp_matrix(self._intrinsics(width, height))
        self._plan = plan_warp(matrix, width, height, stride)
        self.plans_built += 1
        return self._plan

    def warp(
        self,
        frame: FrameBuffer,
        width: int,
        height: int,
        stride: int,
        *,
        out: NDArray[np.uint8] | None = None,
    ) -> NDArray[np.uint8]:
        """Warp one frame; return the model input (``out`` if given), shape ``(1, 1382400)``.

        ``frame`` is the NV12 buffer (or just its Y plane) as C-contiguous uint8 bytes: luma row r
        starts at byte r · stride and its first ``width`` bytes are the image. It must hold at least
        ``(height - 1) · stride + width`` bytes. Raises :class:`WarpInputError` on a wrong dtype,
        a short buffer, a bad geometry or output buffer; nothing is written then.
        """
        flat = _flat_frame(frame)
        target = self._out if out is None else _check_out(out)
        plan = self.plan_for(width, height, stride)
        if flat.size < plan.min_bytes:
            raise WarpInputError(
                f"frame: a {width}x{height} luma plane with stride {stride} needs at least "
                f"{plan.min_bytes} bytes ((height - 1) * stride + width), got {flat.size}"
            )
        if np.may_share_memory(target, flat):
            raise WarpInputError("out: expected a buffer separate from the frame, got an overlap")
        plan.apply(flat, target.reshape(-1))
        return target

    __call__ = warp
