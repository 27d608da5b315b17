"""Model against model over a fleet: two runs of the same recordings compared frame by frame.

:func:`compare_runs` reads two fleet run directories (:mod:`.run_frames`) — the baseline, A, and
the candidate, B — and joins their rows on (``recording``, ``frameId``). A frame present in one run
only is counted for its recording, not compared; a frame is *compared* when both runs have driver
data for it. Over the compared frames:

- per driver column (:data:`~pipelines.dms.sinks.parquet.DRIVER_COLUMNS`), the differences
  d = B - A: their count, mean, mean |d|, the 50th, 90th and 99th percentiles of |d| (the smallest
  |d| that that share of the frames do not exceed), the largest |d|, and a histogram of d
  (:data:`HISTOGRAM_BINS` equal bins from -max |d| to +max |d|). A difference that is not finite
  (a NaN or an infinity on a side) counts as an infinite |d|, as in the one-segment comparison
  (:mod:`~pipelines.dms.openpilot.compare`), is left out of the histogram and leaves the mean
  undefined (NaN);
- per recording, for each of openpilot's decisions (:data:`~pipelines.dms.openpilot.policy.
  DECISIONS`: face detected, eyes closed, phone, distracted pose), the frames where the two runs
  decide differently, and their share of the recording's compared frames. Both runs' decisions
  are taken on the side openpilot monitors by the baseline's ``wheelOnRightProb`` (the right-hand
  side above :data:`~pipelines.dms.openpilot.policy.WHEEL_ON_RIGHT_THRESHOLD`), as the one-segment
  comparison takes them on openpilot's own side.

Recordings are ordered by their largest flip share (recordings with no compared frame last), then
by their mean |d| over every column and compared frame, largest first, then by name.
:func:`write_comparison` writes the tables (:data:`FIELD_COLUMNS`, :data:`RECORDING_COLUMNS`) as
``fields.parquet`` and ``recordings.parquet``, and both as ``comparison.json``.

The work is columnar (a sort-merge join of the two runs' keys and whole columns at a time, in
numpy): no Python loop runs per row. pyarrow is imported by the functions that read or write, not
by importing this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..messages import DRIVER_FIELDS
from ..openpilot.compare import SIDES
from ..openpilot.policy import DECISIONS, WHEEL_ON_RIGHT_THRESHOLD, decision_arrays
from ..sinks.parquet import DRIVER_COLUMNS
from ._compare_tables import (
    COMPARISON_FILES,
    FIELD_COLUMNS,
    HISTOGRAM_BINS,
    RECORDING_COLUMNS,
    FieldStats,
    FleetComparison,
    RecordingStats,
    read_comparison,
    write_comparison,
)
from .run_frames import frame_files, read_frames

__all__ = [
    "COMPARISON_FILES",
    "FIELD_COLUMNS",
    "HISTOGRAM_BINS",
    "RECORDING_COLUMNS",
    "FieldStats",
    "FleetComparison",
    "RecordingStats",
    "compare_runs",
    "read_comparison",
    "write_comparison",
]

_KEYS = ("recording", "frameId")
_PERCENTILES = (0.5, 0.9, 0.99)

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
Counts = npt.NDArray[np.int64]


@dataclass(frozen=True)
class _Side:
    """One run's rows: each row's recording (an index into the names of both runs) and frameId,
    whether it has driver data, and the driver columns (NaN where null)."""

    table: Any
    codes: Counts
    frame_ids: Counts
    with_data: Bools

    def values(self, column: str, rows: Counts) -> Floats:
        """``column`` at the row indexes ``rows``, as float64."""
        values = np.asarray(self.table[column].to_numpy(zero_copy_only=False))
        return values[rows].astype(np.float64)


def _read(files: list[Path]) -> tuple[Any, list[str], Counts]:
    """The rows' keys and driver columns, the recordings' names and each row's index into them."""
    import pyarrow.compute as pc

    table = read_frames(files, [*_KEYS, *DRIVER_COLUMNS])
    encoded = pc.dictionary_encode(table["recording"].combine_chunks())
    codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    return table, [str(name) for name in encoded.dictionary.to_pylist()], codes


def _side(table: Any, codes: Counts) -> _Side:
    import pyarrow.compute as pc

    with_data = np.ones(table.num_rows, dtype=bool)
    for column in DRIVER_COLUMNS:
        with_data &= np.asarray(pc.is_valid(table[column]).to_numpy(zero_copy_only=False))
    frame_ids = np.asarray(table["frameId"].to_numpy(zero_copy_only=False), dtype=np.int64)
    return _Side(table, codes, frame_ids, with_data)


def _keys(sides: tuple[_Side, _Side], runs: tuple[Path, Path]) -> list[tuple[Counts, Counts]]:
    """Each run's rows as one sortable key a row — recording, then frameId, both by rank, so
    that keys order rows by (recording, frameId) — and the row indexes in key order;
    :class:`ValueError` for a run whose rows repeat a (recording, frameId)."""
    ranks, dense = np.unique(
        np.concatenate([side.frame_ids for side in sides]), return_inverse=True
    )
    width = max(len(ranks), 1)
    found = []
    for at, (side, run) in enumerate(zip(sides, runs, strict=True)):
        start = 0 if at == 0 else len(sides[0].frame_ids)
        keys = side.codes * width + dense[start : start + len(side.frame_ids)]
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        repeated = int(np.count_nonzero(ordered[1:] == ordered[:-1]))
        if repeated:
            raise ValueError(
                f"{str(run)!r}: {repeated} rows repeat a (recording, frameId) of another row "
                "(a run has one row per frame)"
            )
        found.append((ordered, order))
    return found


def _monitored(columns: Mapping[str, Floats], right: Bools) -> dict[str, Any]:
    """Each frame's driver fields on its monitored side, as :func:`decision_arrays` takes them."""
    (left, _), (other, _) = SIDES
    data: dict[str, Any] = {}
    for name in DRIVER_FIELDS:
        if f"{left}.{name}" in columns:
            data[name] = np.where(right, columns[f"{other}.{name}"], columns[f"{left}.{name}"])
            continue
        elements = [c for c in DRIVER_COLUMNS if c.startswith(f"{left}.{name}.")]
        data[name] = [
            np.where(right, columns[c.replace(f"{left}.", f"{other}.", 1)], columns[c])
            for c in elements
        ]
    return data


def _absolute(differences: Floats) -> Floats:
    """|d|, infinite where d is not finite (a NaN or an infinity on a side)."""
    absolute: Floats = np.abs(differences)
    absolute[np.isnan(absolute)] = np.inf
    return absolute


def _field_stats(column: str, differences: Floats, absolute: Floats) -> FieldStats:
    finite = np.isfinite(differences)
    count = int(differences.size)
    if count == 0:
        nan = math.nan
        return FieldStats(column, 0, nan, nan, nan, nan, nan, nan, 0, (), ())
    shown = differences if finite.all() else differences[finite]
    largest = float(np.max(absolute[finite])) if shown.size else 0.0
    half = largest if largest > 0 else 1.0
    counts, edges = np.histogram(shown, bins=HISTOGRAM_BINS, range=(-half, half))
    quantiles = np.quantile(absolute, _PERCENTILES, method="inverted_cdf")
    return FieldStats(
        field=column,
        count=count,
        mean=float(np.mean(differences)) if shown.size == count else math.nan,
        mean_abs=float(np.mean(absolute)),
        p50_abs=float(quantiles[0]),
        p90_abs=float(quantiles[1]),
        p99_abs=float(quantiles[2]),
        max_abs=float(np.max(absolute)),
        non_finite=count - int(shown.size),
        edges=tuple(float(edge) for edge in edges),
        counts=tuple(int(n) for n in counts),
    )


def _order(recording: RecordingStats) -> tuple[float, float, str]:
    share = recording.max_flip_share
    mean_abs = recording.mean_abs if not math.isnan(recording.mean_abs) else -1.0
    return (-(share if share is not None else -1.0), -mean_abs, recording.recording)


def compare_runs(baseline: Path, candidate: Path) -> FleetComparison:
    """Compare the candidate run ``candidate`` (B) with the baseline run ``baseline`` (A), as the
    module's description says. :class:`ValueError`, one line, for a directory that is no fleet
    run (see :func:`~.run_frames.frame_files`) or that has two rows of one frame. Blocking: reads
    both runs whole (the keys and driver columns: about 160 bytes a row and side)."""
    runs = Path(baseline), Path(candidate)
    files = frame_files(runs[0]), frame_files(runs[1])  # both checked before either is read
    read = [_read(found) for found in files]
    names = sorted(set(read[0][1]) | set(read[1][1]))
    index = {name: at for at, name in enumerate(names)}
    a, b = (
        _side(table, np.array([index[n] for n in own], dtype=np.int64)[codes])
        for table, own, codes in read
    )
    (keys_a, order_a), (keys_b, order_b) = _keys((a, b), runs)
    _, at_a, at_b = np.intersect1d(keys_a, keys_b, assume_unique=True, return_indices=True)
    rows_a, rows_b = order_a[at_a], order_b[at_b]  # the frames of both runs, in key order
    compared = a.with_data[rows_a] & b.with_data[rows_b]
    rows_a, rows_b = rows_a[compared], rows_b[compared]
    count = len(names)
    codes = a.codes[rows_a]
    sums = np.zeros(count)
    fields = []
    columns: dict[str, dict[str, Floats]] = {"a": {}, "b": {}}
    for column in DRIVER_COLUMNS:
        columns["a"][column] = a.values(column, rows_a)
        columns["b"][column] = b.values(column, rows_b)
        differences = columns["b"][column] - columns["a"][column]
        absolute = _absolute(differences)
        fields.append(_field_stats(column, differences, absolute))
        sums += np.bincount(codes, weights=absolute, minlength=count)
    right = columns["a"]["wheelOnRightProb"] > WHEEL_ON_RIGHT_THRESHOLD
    decided = [
        decision_arrays(_monitored(values, right), right_hand=right) for values in columns.values()
    ]
    flips = {
        name: np.bincount(codes, weights=decided[0][name] != decided[1][name], minlength=count)
        for name in DECISIONS
    }
    both = np.bincount(a.codes[order_a[at_a]], minlength=count)
    compared_per = np.bincount(codes, minlength=count)
    only_a = np.bincount(a.codes, minlength=count) - both
    only_b = np.bincount(b.codes, minlength=count) - both
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_abs = sums / (compared_per * len(DRIVER_COLUMNS))
    recordings = [
        RecordingStats(
            recording=name,
            frames=int(both[i]),
            compared=int(compared_per[i]),
            only_baseline=int(only_a[i]),
            only_candidate=int(only_b[i]),
            mean_abs=float(mean_abs[i]),
            flips={decision: int(flips[decision][i]) for decision in DECISIONS},
        )
        for i, name in enumerate(names)
    ]
    return FleetComparison(
        baseline=runs[0],
        candidate=runs[1],
        rows_baseline=len(a.codes),
        rows_candidate=len(b.codes),
        fields=tuple(fields),
        recordings=tuple(sorted(recordings, key=_order)),
    )
