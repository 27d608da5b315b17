"""The model's flat output -> the ``driverStateV2`` fields, exactly as openpilot decodes them.

The output is sliced by the model's metadata (head name -> ``slice``), never by fixed offsets
(spec/dms-contract.md §1.6, §1.7). Per side (``lhd`` -> ``leftDriverData``, ``rhd`` ->
``rightDriverData``):

* ``face_descs_<side>`` (width w >= 11): the first w-6 values are kept raw, the last 6 go through
  ``safe_exp``. raw[0:3] -> ``faceOrientation``, raw[3:5] -> ``facePosition``, exp[0:3] ->
  ``faceOrientationStd``, exp[3:5] -> ``facePositionStd``.
* eight probability heads, element 0 of each through ``sigmoid``.

plus the global ``wheel_on_right`` head -> ``wheelOnRightProb``.

``safe_exp(v) = exp(min(v, 11))`` and ``sigmoid(v) = 1 / (1 + safe_exp(-v))``, computed in float32
as openpilot does; so a probability is never below 1/(1+e^11) and a std never above e^11.

Decoding never raises on bad model output. :func:`decode` returns a :class:`Decoded` that says
whether the result can be trusted and, if not, why: a head missing or too narrow, a slice past the
end of the output, a value that is not finite (anywhere in the output), a probability outside
[0, 1]. openpilot publishes whatever comes out; here a NaN or an infinity makes the frame invalid.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "EXP_CLIP",
    "FACE_DESCS_MIN_WIDTH",
    "PROBABILITY_HEADS",
    "REQUIRED_HEADS",
    "SIDES",
    "WHEEL_ON_RIGHT_HEAD",
    "Decoded",
    "Decoder",
    "DriverData",
    "DriverStateFields",
    "check_fields",
    "decode",
    "face_descs_head",
    "safe_exp",
    "sigmoid",
]

EXP_CLIP = 11.0
"""``safe_exp`` clips its argument here: exp(11) ~ 59874 is the largest std that is published."""

FACE_DESCS_MIN_WIDTH = 11
"""openpilot's decoding reads raw[0:5] and exp[0:5] of the last 6: at least 5 + 6 values."""

SIDES: Mapping[str, str] = {"lhd": "leftDriverData", "rhd": "rightDriverData"}
"""Head suffix -> the ``driverStateV2`` field its decoded values are published in."""

PROBABILITY_HEADS: Mapping[str, str] = {
    "face_prob": "faceProb",
    "left_eye_prob": "leftEyeProb",
    "right_eye_prob": "rightEyeProb",
    "left_blink_prob": "leftBlinkProb",
    "right_blink_prob": "rightBlinkProb",
    "sunglasses_prob": "sunglassesProb",
    "using_phone_prob": "phoneProb",
    "sleep_prob": "sleepProb",
}
"""Per-side probability heads (without the ``_<side>`` suffix) -> ``DriverData`` field."""

WHEEL_ON_RIGHT_HEAD = "wheel_on_right"


def face_descs_head(side: str) -> str:
    return f"face_descs_{side}"


def _required_heads() -> dict[str, int]:
    heads: dict[str, int] = {}
    for side in SIDES:
        heads[face_descs_head(side)] = FACE_DESCS_MIN_WIDTH
        for head in PROBABILITY_HEADS:
            heads[f"{head}_{side}"] = 1
    heads[WHEEL_ON_RIGHT_HEAD] = 1
    return heads


REQUIRED_HEADS: Mapping[str, int] = _required_heads()
"""Every head the decoder reads -> the least width it needs. Other heads are ignored."""

FloatArray = npt.NDArray[np.float32]


def safe_exp(values: npt.ArrayLike) -> FloatArray:
    """``exp(min(v, 11))`` in float32."""
    v = np.asarray(values, dtype=np.float32)
    return np.exp(np.minimum(v, np.float32(EXP_CLIP)))


def sigmoid(values: npt.ArrayLike) -> FloatArray:
    """``1 / (1 + safe_exp(-v))`` in float32: never below 1/(1+e^11), never above 1."""
    v = np.asarray(values, dtype=np.float32)
    return np.float32(1.0) / (np.float32(1.0) + safe_exp(-v))


@dataclass(frozen=True)
class DriverData:
    """One side's decoded heads: the fields of openpilot's ``DriverData`` struct."""

    face_orientation: tuple[float, float, float]
    """[0] pitch, [1] yaw, [2] roll, radians (roll unused downstream)."""
    face_orientation_std: tuple[float, float, float]
    face_position: tuple[float, float]
    face_position_std: tuple[float, float]
    face_prob: float
    left_eye_prob: float
    right_eye_prob: float
    left_blink_prob: float
    right_blink_prob: float
    sunglasses_prob: float
    phone_prob: float
    sleep_prob: float

    def probabilities(self) -> dict[str, float]:
        """The eight probabilities by their ``DriverData`` field names."""
        return {field: getattr(self, _snake(field)) for field in PROBABILITY_HEADS.values()}

    def to_dict(self) -> dict[str, Any]:
        """The fields under their capnp names (``faceOrientation``, ``phoneProb``, ...)."""
        return {
            "faceOrientation": list(self.face_orientation),
            "faceOrientationStd": list(self.face_orientation_std),
            "facePosition": list(self.face_position),
            "facePositionStd": list(self.face_position_std),
            **self.probabilities(),
        }


@functools.cache
def _snake(camel: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)


@dataclass(frozen=True)
class DriverStateFields:
    """The decoded part of ``driverStateV2``: both sides and ``wheelOnRightProb``."""

    left_driver_data: DriverData
    right_driver_data: DriverData
    wheel_on_right_prob: float

    def side(self, suffix: str) -> DriverData:
        """The side for a head suffix: ``"lhd"`` or ``"rhd"``."""
        if suffix not in SIDES:
            raise KeyError(f"unknown side {suffix!r}; expected one of {sorted(SIDES)}")
        return self.left_driver_data if suffix == "lhd" else self.right_driver_data

    def to_dict(self) -> dict[str, Any]:
        return {
            "leftDriverData": self.left_driver_data.to_dict(),
            "rightDriverData": self.right_driver_data.to_dict(),
            "wheelOnRightProb": self.wheel_on_right_prob,
        }


@dataclass(frozen=True)
class Decoded:
    """The outcome of decoding one output: ``fields`` when ``valid``, else ``None`` and a reason."""

    fields: DriverStateFields | None
    valid: bool
    reason: str = ""

    @classmethod
    def invalid(cls, reason: str) -> Decoded:
        return cls(fields=None, valid=False, reason=reason)


def _bounds(s: slice) -> tuple[int, int] | str:
    """(start, stop) of a contiguous, non-negative slice, or why it is not one."""
    start = 0 if s.start is None else s.start
    if s.step not in (None, 1):
        return f"has step {s.step!r}; expected a contiguous slice"
    for end in (start, s.stop):
        if isinstance(end, bool) or not isinstance(end, int | np.integer) or end < 0:
            return f"has bounds {s.start!r}:{s.stop!r}; expected non-negative integers"
    return int(start), int(s.stop)


def _head_bounds(length: int, slices: Mapping[str, slice]) -> dict[str, tuple[int, int]] | str:
    """Where each required head lies in the output, or why the layout cannot be decoded."""
    found: dict[str, tuple[int, int]] = {}
    for head, least in REQUIRED_HEADS.items():
        if head not in slices:
            return f"head {head!r} is missing from the output slices"
        bounds = _bounds(slices[head])
        if isinstance(bounds, str):
            return f"head {head!r} {bounds}"
        start, stop = bounds
        if stop > length:
            return f"head {head!r} ends at {stop}, past the end of the output ({length} values)"
        if stop - start < least:
            return f"head {head!r} has {max(stop - start, 0)} value(s); expected at least {least}"
        found[head] = bounds
    return found


def _first_non_finite(flat: FloatArray, slices: Mapping[str, slice]) -> str | None:
    bad = np.flatnonzero(~np.isfinite(flat))
    if bad.size == 0:
        return None
    index = int(bad[0])
    where = "outside every head"
    for head, s in slices.items():
        bounds = _bounds(s)
        if not isinstance(bounds, str) and bounds[0] <= index < bounds[1]:
            where = f"head {head!r}[{index - bounds[0]}]"
            break
    return (
        f"output value {index} ({where}) is {flat[index]}; "
        f"{bad.size} value(s) not finite, expected only finite values"
    )


def check_fields(fields: DriverStateFields) -> str | None:
    """Why decoded fields cannot be trusted (a value not finite, a probability outside [0, 1],
    a negative std), or ``None`` when they can."""
    for side in SIDES:
        data = fields.side(side)
        name = SIDES[side]
        vectors = {
            "faceOrientation": data.face_orientation,
            "faceOrientationStd": data.face_orientation_std,
            "facePosition": data.face_position,
            "facePositionStd": data.face_position_std,
        }
        for field, values in vectors.items():
            if not all(math.isfinite(v) for v in values):
                return f"{name}.{field} = {list(values)} is not finite"
            if field.endswith("Std") and min(values) < 0.0:
                return f"{name}.{field} = {list(values)}; expected stds >= 0"
        for field, p in data.probabilities().items():
            if not 0.0 <= p <= 1.0:  # also false for NaN
                return f"{name}.{field} = {p}; expected a probability in [0, 1]"
    p = fields.wheel_on_right_prob
    if not 0.0 <= p <= 1.0:
        return f"wheelOnRightProb = {p}; expected a probability in [0, 1]"
    return None


def decode(output: npt.ArrayLike, slices: Mapping[str, slice]) -> Decoded:
    """Decode one model output (any shape; it is flattened) by the metadata's ``slices``.

    Never raises for bad output: returns ``Decoded(valid=False, reason=...)`` instead. To decode
    many outputs of one model, make a :class:`Decoder` once.
    """
    return Decoder(slices)(output)


class Decoder:
    """Decodes the outputs of one model. The slices are checked, and turned into the indices of
    the values decoding reads, once per output length: a frame then costs a few vectorised numpy
    operations (the same float32 arithmetic as :func:`safe_exp` and :func:`sigmoid`)."""

    def __init__(self, slices: Mapping[str, slice]) -> None:
        self.slices = dict(slices)
        self._layouts: dict[int, _Layout | str] = {}

    def __call__(self, output: npt.ArrayLike) -> Decoded:
        try:
            flat = np.asarray(output, dtype=np.float32).reshape(-1)
        except (TypeError, ValueError) as exc:
            return Decoded.invalid(f"output is not an array of numbers: {exc}")
        layout = self._layouts.get(flat.size)
        if layout is None:
            layout = self._layouts[flat.size] = _Layout.build(flat.size, self.slices)
        if isinstance(layout, str):
            return Decoded.invalid(layout)
        if not np.isfinite(flat).all():
            return Decoded.invalid(_first_non_finite(flat, self.slices) or "")
        fields = layout.decode(flat)
        problem = check_fields(fields)
        if problem is not None:
            return Decoded.invalid(problem)
        return Decoded(fields=fields, valid=True)


_PROBABILITY_FIELDS = [_snake(field) for field in PROBABILITY_HEADS.values()]


@dataclass(frozen=True)
class _Layout:
    """Where decoding reads, per side in ``SIDES`` order: raw[0:5] of the face descriptors, the
    first 5 of their last 6 (through ``safe_exp``), element 0 of each probability head (through
    ``sigmoid``), then ``wheel_on_right``[0]."""

    raw: npt.NDArray[np.intp]
    std: npt.NDArray[np.intp]
    probabilities: npt.NDArray[np.intp]

    @classmethod
    def build(cls, length: int, slices: Mapping[str, slice]) -> _Layout | str:
        bounds = _head_bounds(length, slices)
        if isinstance(bounds, str):
            return bounds
        raw: list[int] = []
        std: list[int] = []
        probabilities: list[int] = []
        for side in SIDES:
            start, stop = bounds[face_descs_head(side)]
            raw += range(start, start + 5)
            std += range(stop - 6, stop - 1)
            probabilities += [bounds[f"{head}_{side}"][0] for head in PROBABILITY_HEADS]
        probabilities.append(bounds[WHEEL_ON_RIGHT_HEAD][0])
        return cls(np.array(raw), np.array(std), np.array(probabilities))

    def decode(self, flat: FloatArray) -> DriverStateFields:
        raw = flat[self.raw].tolist()
        std = safe_exp(flat[self.std]).tolist()
        probabilities = sigmoid(flat[self.probabilities]).tolist()
        count = len(PROBABILITY_HEADS)
        sides = []
        for k in range(len(SIDES)):
            r, e = raw[5 * k : 5 * k + 5], std[5 * k : 5 * k + 5]
            p = probabilities[count * k : count * (k + 1)]
            sides.append(
                DriverData(
                    face_orientation=(r[0], r[1], r[2]),
                    face_orientation_std=(e[0], e[1], e[2]),
                    face_position=(r[3], r[4]),
                    face_position_std=(e[3], e[4]),
                    **dict(zip(_PROBABILITY_FIELDS, p, strict=True)),
                )
            )
        return DriverStateFields(
            left_driver_data=sides[0],
            right_driver_data=sides[1],
            wheel_on_right_prob=probabilities[-1],
        )
