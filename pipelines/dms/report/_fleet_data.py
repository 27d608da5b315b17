"""What a fleet run's frames say, as the data of each picture: the valid share per recording,
the time away from AVAILABLE by state and reason kind, the model's execution times. Pure: no
drawing (the reading is :func:`read_fleet`'s).

A frame's **time** is the interval from its recorded start of frame (``recordedTimestampSof``,
the service's ``timestampSof`` for a frame that has none) to the next frame's of the same
recording, by frameId; the last frame of a recording counts the interval before it (0 for a
recording of one frame). The time away from AVAILABLE adds up the times of the frames
published DEGRADED or UNAVAILABLE, by their reason's kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from aio_runtime import Availability

__all__ = ["FleetData", "RecordingShare", "fleet_data", "read_fleet"]

_COLUMNS = (
    "recording",
    "frameId",
    "valid",
    "availability",
    "availabilityReasonKind",
    "recordedTimestampSof",
    "timestampSof",
    "modelExecutionTime",
)
"""The columns a fleet report reads."""
NO_KIND = "(no reason)"
"""The kind a frame away from AVAILABLE without a reason's kind is counted under."""
_AWAY = (Availability.DEGRADED, Availability.UNAVAILABLE)


@dataclass(frozen=True)
class RecordingShare:
    """A recording's frames as the fleet report draws them: how many, how many valid, and the
    time they cover."""

    recording: str
    frames: int
    valid: int
    seconds: float
    """The recording's frames' times added up."""

    @property
    def valid_share(self) -> float:
        return self.valid / self.frames if self.frames else 0.0


@dataclass(frozen=True)
class FleetData:
    """Everything a fleet report draws of a run's frames."""

    recordings: tuple[RecordingShare, ...]
    """The lowest valid share first (then by name)."""
    away: Mapping[Availability, Mapping[str, float]]
    """Seconds DEGRADED and UNAVAILABLE, by the reason's kind (most first)."""
    model_ms: npt.NDArray[np.float64]
    """The model's execution time of each frame it ran for, in milliseconds."""

    @property
    def frames(self) -> int:
        return sum(r.frames for r in self.recordings)

    @property
    def valid(self) -> int:
        return sum(r.valid for r in self.recordings)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.recordings)

    def model_percentiles(self) -> dict[str, float]:
        """``p50``, ``p90``, ``p99`` and ``max`` of :attr:`model_ms` (NaN with no model run)."""
        if not self.model_ms.size:
            return dict.fromkeys(("p50", "p90", "p99", "max"), float("nan"))
        found = np.percentile(self.model_ms, [50, 90, 99, 100])
        return dict(zip(("p50", "p90", "p99", "max"), (float(v) for v in found), strict=True))


def _codes(column: Any) -> tuple[list[str], npt.NDArray[np.int64]]:
    """A string column's distinct values and each row's index into them."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(column.combine_chunks())
    codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    return [str(v) for v in encoded.dictionary.to_pylist()], codes


def _frame_times(codes: npt.NDArray[np.int64], sof_ns: npt.NDArray[np.int64]) -> Any:
    """Each frame's time (seconds), rows in (recording, frameId) order, ``codes`` the
    recording of each row: to the next frame's start; a recording's last frame, the interval
    before it (0 for a recording of one frame)."""
    seconds = np.zeros(len(codes))
    if len(codes) < 2:
        return seconds
    same = codes[1:] == codes[:-1]
    step = np.maximum(np.diff(sof_ns).astype(np.float64) / 1e9, 0.0)
    seconds[:-1] = np.where(same, step, 0.0)
    last = np.append(~same, True)  # each recording's last row
    before = np.append(False, same)  # a row with one of its recording before it
    at = np.flatnonzero(last & before)
    seconds[at] = seconds[at - 1]
    return seconds


def fleet_data(table: Any) -> FleetData:
    """The data of a fleet report from a ``pyarrow.Table`` of frames (rows in any order) with the
    columns ``recording``, ``frameId``, ``valid``, ``availability``, ``availabilityReasonKind``,
    ``recordedTimestampSof``, ``timestampSof`` and ``modelExecutionTime`` (as the frames'
    schema types them)."""
    import pyarrow.compute as pc

    table = table.sort_by([("recording", "ascending"), ("frameId", "ascending")])
    names, codes = _codes(table["recording"])
    sof = pc.coalesce(table["recordedTimestampSof"], table["timestampSof"])
    seconds = _frame_times(codes, np.asarray(sof.to_numpy(zero_copy_only=False), np.int64))
    valid = np.asarray(table["valid"].to_numpy(zero_copy_only=False), dtype=bool)
    count = len(names)
    frames = np.bincount(codes, minlength=count)
    valid_per = np.bincount(codes, weights=valid, minlength=count)
    seconds_per = np.bincount(codes, weights=seconds, minlength=count)
    recordings = sorted(
        (
            RecordingShare(name, int(frames[i]), int(valid_per[i]), float(seconds_per[i]))
            for i, name in enumerate(names)
        ),
        key=lambda r: (r.valid_share, r.recording),
    )
    states, state_codes = _codes(table["availability"])
    kinds, kind_codes = _codes(pc.fill_null(table["availabilityReasonKind"], NO_KIND))
    away: dict[Availability, dict[str, float]] = {}
    for state in _AWAY:
        rows = state_codes == (states.index(state.value) if state.value in states else -1)
        found = np.bincount(kind_codes[rows], weights=seconds[rows], minlength=len(kinds))
        counted = np.bincount(kind_codes[rows], minlength=len(kinds))
        named = {kinds[k]: float(found[k]) for k in np.flatnonzero(counted)}
        away[state] = dict(sorted(named.items(), key=lambda item: (-item[1], item[0])))
    model = np.asarray(table["modelExecutionTime"].to_numpy(zero_copy_only=False), np.float64)
    return FleetData(tuple(recordings), away, model[model > 0] * 1e3)


def read_fleet(run: Path) -> FleetData:
    """The data of a fleet report of the run directory ``run``: :class:`ValueError`, one line,
    for one that is not (see :func:`~pipelines.dms.fleet.run_frames.frame_files`)."""
    from ..fleet.run_frames import frame_files, read_frames

    return fleet_data(read_frames(frame_files(run), _COLUMNS))
