"""Fleet run directories built by hand for the comparison's and the report's tests: one Parquet
file of frames per recording, in the frames' schema, every value chosen by the test."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.dms.frames.frame import Frame
from pipelines.dms.frames.recording import FrameRecorder
from pipelines.dms.messages import DRIVER_FIELDS, READINESS_LAYERS
from pipelines.dms.sinks.parquet import DRIVER_COLUMNS, PARQUET_COLUMNS, parquet_schema

PERIOD_NS = 50_000_000
"""Frames 50 ms apart, as recorded."""

SIDE = {
    "faceOrientation": [0.0, 0.0, 0.0],
    "faceOrientationStd": [0.05, 0.05, 0.05],
    "facePosition": [0.0, 0.0],
    "facePositionStd": [0.01, 0.01],
    "faceProb": 0.5,
    "leftEyeProb": 0.9,
    "rightEyeProb": 0.9,
    "leftBlinkProb": 0.125,
    "rightBlinkProb": 0.125,
    "sunglassesProb": 0.0625,
    "phoneProb": 0.25,
    "sleepProb": 0.0625,
}
"""One side's driver data: no face detected, eyes open, no phone, looking ahead (values exact
in float32, so that differences of them are exact too)."""


def driver_values() -> dict[str, float]:
    """Every driver column's value for a frame of :data:`SIDE` on both sides, wheel on the left."""
    values = {"wheelOnRightProb": 0.125}
    for short in ("left", "right"):
        for name in DRIVER_FIELDS:
            value = SIDE[name]
            if isinstance(value, list):
                values.update({f"{short}.{name}.{i}": v for i, v in enumerate(value)})
            else:
                values[f"{short}.{name}"] = value
    assert list(values) == list(DRIVER_COLUMNS)
    return values


def frames(
    recording: str,
    ids: Sequence[int],
    changes: Mapping[str, Sequence[float | None]] | None = None,
    *,
    no_driver: Sequence[int] = (),
    availability: Sequence[str] | None = None,
    reason_kinds: Sequence[str | None] | None = None,
    model_s: Sequence[float] | None = None,
) -> pa.Table:
    """The rows of ``recording``'s frames ``ids``: driver columns as :func:`driver_values` but
    for ``changes`` (column -> a value per frame), none at the frames ``no_driver`` (indexes);
    ``availability`` and ``reason_kinds`` per frame (default available, no reason; a frame is
    valid when available); the model's time per frame (default 10 ms)."""
    count = len(ids)
    states = list(availability or ["available"] * count)
    kinds = list(reason_kinds or [None] * count)
    columns: dict[str, list[object]] = {
        "recording": [recording] * count,
        "runId": ["run"] * count,
        "seq": list(range(count)),
        "frameId": list(ids),
        "valid": [state == "available" for state in states],
        "late": [False] * count,
        "eventValid": [state != "unavailable" for state in states],
        "availability": states,
        "reason": [f"{kind}: detail" if kind else "" for kind in kinds],
        "reasonKind": kinds,
        "availabilityReason": [f"{kind}: detail" if kind else "" for kind in kinds],
        "availabilityReasonKind": kinds,
        **{f"readiness.{layer}": [True] * count for layer in READINESS_LAYERS},
        "timestampSof": [10**12 + i * PERIOD_NS for i in ids],
        "timestampEof": [10**12 + i * PERIOD_NS + 1 for i in ids],
        "recordedTimestampSof": [i * PERIOD_NS for i in ids],
        "recordedTimestampEof": [i * PERIOD_NS + 1 for i in ids],
        "frameAge": [0.03] * count,
        "modelExecutionTime": list(model_s or [0.01] * count),
        "gpuExecutionTime": [0.0] * count,
    }
    for column, value in driver_values().items():
        values = list((changes or {}).get(column, [value] * count))
        columns[column] = [None if at in no_driver else v for at, v in enumerate(values)]
    assert list(columns) == list(PARQUET_COLUMNS)
    return pa.Table.from_pydict(columns, schema=parquet_schema())


def write_run(run: Path, tables: Sequence[pa.Table]) -> Path:
    """A fleet run directory ``run`` of ``tables``, each a recording's file, as a fleet run
    writes them (``frames/<quoted name>/part-0.parquet``)."""
    for table in tables:
        name = table["recording"][0].as_py()
        folder = run / "frames" / quote(name, safe="")
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, folder / "part-0.parquet")
    return run


def varied_recording(path: Path, count: int, seed: int) -> Path:
    """A recording of ``count`` 1344x760 frames, each a different smooth pattern (a gradient and
    a wave, drawn from ``seed``), so that a model's outputs differ from frame to frame; small,
    as the recorder compresses it."""
    rng = np.random.default_rng(seed)
    uv = np.full((380, 1344), 128, np.uint8)
    cols, rows = np.arange(1344), np.arange(760)[:, None]
    with FrameRecorder(path) as recorder:
        for i in range(count):
            low, high = rng.uniform(0, 120), rng.uniform(120, 255)
            f, g = rng.uniform(0.002, 0.05, 2)
            wave = rng.uniform(0, 60) * np.sin(rows * f + cols * g)
            y = np.clip(low + (high - low) * cols / 1343 + wave, 0, 255).astype(np.uint8)
            sof = 1_700_000_000 * 10**9 + i * PERIOD_NS
            recorder.write(
                Frame.from_planes(y, uv, frame_id=i, timestamp_sof=sof, timestamp_eof=sof + 10**7)
            )
    return path
