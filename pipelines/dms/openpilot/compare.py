"""Our driver states against openpilot's, frame by frame: field differences and flipped decisions.

Both sides are flattened the same way (:func:`flatten`): one value a column, ``wheelOnRightProb``
and each side's fields by capnp name, a list one column per element (``left.faceOrientation.0``
...). Frames are matched by frameId; a frame is compared when both sides carry driver data.
Per column: the largest and the mean absolute difference. Per decision of openpilot's policy
(:mod:`.policy`: face detected, eyes closed, phone, distracted pose), the share of compared frames
where the two disagree, on the side openpilot would monitor (the right-hand side when its own
``wheelOnRightProb`` > 0.5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..messages import DRIVER_FIELDS, DriverStateV2
from .policy import DECISIONS, WHEEL_ON_RIGHT_THRESHOLD, decisions

__all__ = ["Comparison", "FieldDifference", "compare", "flatten"]

SIDES = (("left", "leftDriverData"), ("right", "rightDriverData"))


def flatten(state: DriverStateV2 | Any) -> dict[str, float] | None:
    """The driver state's values by column, or None when it carries no driver data: a published
    message (:class:`~pipelines.dms.messages.DriverStateV2`) or a capnp ``DriverStateV2`` reader
    (whose empty lists mean no driver data, as openpilot's policy reads them)."""
    if isinstance(state, DriverStateV2):
        if state.left_driver_data is None or state.right_driver_data is None:
            return None
        wheel = state.wheel_on_right_prob
        sides: list[tuple[str, Any]] = [
            ("left", state.left_driver_data),
            ("right", state.right_driver_data),
        ]
    else:
        wheel = state.wheelOnRightProb
        sides = [(short, getattr(state, name)) for short, name in SIDES]
    columns: dict[str, float] = {"wheelOnRightProb": float(wheel or 0.0)}
    for short, data in sides:
        for name in DRIVER_FIELDS:
            value = data[name] if isinstance(data, Mapping) else getattr(data, name)
            if isinstance(value, int | float) or getattr(value, "ndim", 1) == 0:
                columns[f"{short}.{name}"] = float(value)
                continue
            values = [float(v) for v in value]
            if not values:
                return None
            for i, v in enumerate(values):
                columns[f"{short}.{name}.{i}"] = v
    return columns


def _side(columns: Mapping[str, float], short: str) -> dict[str, Any]:
    """One side's fields back from its columns (lists rebuilt), for the policy's rules."""
    data: dict[str, Any] = {}
    prefix = f"{short}."
    for column, value in columns.items():
        if not column.startswith(prefix):
            continue
        name, _, index = column[len(prefix) :].partition(".")
        if index:
            data.setdefault(name, []).append(value)
        else:
            data[name] = value
    return data


@dataclass(frozen=True)
class FieldDifference:
    """One column's largest and mean absolute difference (infinite where a side was not
    finite)."""

    column: str
    max_abs: float
    mean_abs: float


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` found. ``disagreement``: per decision, the share of compared frames
    where the two sides' decisions differ."""

    ours: int
    theirs: int
    compared: int
    only_ours: int
    only_theirs: int
    fields: tuple[FieldDifference, ...]
    disagreement: Mapping[str, float]

    @property
    def max_abs(self) -> float:
        return max((f.max_abs for f in self.fields), default=0.0)

    def beyond(self, tolerance: float | None, max_disagreement: float | None) -> list[str]:
        """What goes beyond the given limits, one line each (empty: within them)."""
        if not self.compared:
            return ["no frame compared (no frameId with driver data on both sides)"]
        found = []
        if tolerance is not None and self.max_abs > tolerance:
            worst = max(self.fields, key=lambda f: f.max_abs)
            found.append(
                f"max absolute difference {self.max_abs:.6g} ({worst.column}) > {tolerance:g}"
            )
        if max_disagreement is not None:
            for decision, share in self.disagreement.items():
                if share > max_disagreement:
                    found.append(f"{decision} disagrees on {share:.2%} > {max_disagreement:.2%}")
        return found

    def to_record(self) -> dict[str, Any]:
        return {
            "frames": {
                "ours": self.ours,
                "theirs": self.theirs,
                "compared": self.compared,
                "onlyOurs": self.only_ours,
                "onlyTheirs": self.only_theirs,
            },
            "maxAbsDifference": _finite(self.max_abs),
            "fields": {
                f.column: {"maxAbs": _finite(f.max_abs), "meanAbs": _finite(f.mean_abs)}
                for f in self.fields
            },
            "disagreement": dict(self.disagreement),
        }

    def table(self) -> str:
        """The comparison as text: frames, each column's differences, each decision's share."""
        lines = [
            f"frames: ours {self.ours}, openpilot's {self.theirs}, compared {self.compared} "
            f"(only ours {self.only_ours}, only openpilot's {self.only_theirs})",
            f"{'field':<28} {'max |diff|':>12} {'mean |diff|':>12}",
        ]
        lines += [f"{f.column:<28} {f.max_abs:>12.6g} {f.mean_abs:>12.6g}" for f in self.fields]
        lines.append(f"{'decision':<28} {'disagree':>12}")
        lines += [f"{name:<28} {share:>12.2%}" for name, share in self.disagreement.items()]
        return "\n".join(lines)


def _finite(value: float) -> float | None:
    """A difference for JSON: None for an infinite one (a value that was not finite)."""
    return value if math.isfinite(value) else None


def compare(
    ours: Mapping[int, DriverStateV2 | Any], theirs: Mapping[int, DriverStateV2 | Any]
) -> Comparison:
    """Compare driver states by frameId (each side: frameId -> a message or a capnp reader)."""
    pairs = []
    for frame_id in sorted(ours.keys() & theirs.keys()):
        a, b = flatten(ours[frame_id]), flatten(theirs[frame_id])
        if a is not None and b is not None:
            pairs.append((a, b))
    columns = list(pairs[0][1]) if pairs else []
    sums = dict.fromkeys(columns, 0.0)
    maxima = dict.fromkeys(columns, 0.0)
    flips = dict.fromkeys(DECISIONS, 0)
    for a, b in pairs:
        for column in columns:
            difference = abs(a[column] - b[column])
            if not math.isfinite(difference):  # a NaN or an infinity on one side
                difference = math.inf
            sums[column] += difference
            maxima[column] = max(maxima[column], difference)
        side = "right" if b["wheelOnRightProb"] > WHEEL_ON_RIGHT_THRESHOLD else "left"
        right_hand = side == "right"
        mine = decisions(_side(a, side), right_hand=right_hand)
        reference = decisions(_side(b, side), right_hand=right_hand)
        for name, x, y in zip(DECISIONS, mine, reference, strict=True):
            flips[name] += x != y
    count = len(pairs)
    return Comparison(
        ours=len(ours),
        theirs=len(theirs),
        compared=count,
        only_ours=len(ours.keys() - theirs.keys()),
        only_theirs=len(theirs.keys() - ours.keys()),
        fields=tuple(
            FieldDifference(c, maxima[c], sums[c] / count if count else 0.0) for c in columns
        ),
        disagreement={name: (n / count if count else 0.0) for name, n in flips.items()},
    )
