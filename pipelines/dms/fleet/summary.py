"""A fleet's summaries: one per recording, made from its frames file, and the fleet's from them.

A recording's (:class:`RecordingSummary`): its frames and the valid share; the time its frames
cover, and of that the seconds UNAVAILABLE and DEGRADED by reason kind — a frame's time being the
recorded interval to the next frame's start of frame (the last frame's, the median interval), so
that a replay's figures are the drive's, however fast it was replayed —; the model's execution
time and the frame age, as percentiles in milliseconds; how the replay went (its status and,
failed, why; its attempts, the seconds and CPU seconds its worker spent, which worker).

The fleet's (:class:`FleetSummary`): the recordings by status, the failed ones with their
reasons, the frames, the valid share, the seconds by state and reason kind summed, latency
percentiles over every frame, and the run's own figures (frames a second, from the first
recording handed out to the last row written; the cluster's start-up apart).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Literal, TypedDict

import numpy as np

__all__ = [
    "FleetSummary",
    "FrameTotals",
    "Percentiles",
    "RecordingStatus",
    "RecordingSummary",
    "fleet_summary",
    "format_fleet",
    "percentiles",
    "failed_summary",
    "recording_summary",
    "summary_table",
]

RecordingStatus = Literal["complete", "failed", "interrupted"]


class Percentiles(TypedDict):
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None


class FrameTotals(TypedDict):
    """What a recording's summary and the fleet's both total over their frames."""

    frames: int
    valid: int
    validShare: float | None
    recordedSeconds: float
    unavailableSeconds: dict[str, float]
    """By reason kind (``gpu-queue``, ``camera``...)."""
    degradedSeconds: dict[str, float]
    modelExecutionMs: Percentiles
    frameAgeMs: Percentiles


class RecordingSummary(FrameTotals):
    recording: str
    path: str
    model: str
    """``model`` or ``baseline`` (the ``--baseline-model`` run's)."""
    status: RecordingStatus
    reason: str | None
    """Why it failed or was interrupted; null when complete."""
    attempts: int
    replaySeconds: float | None
    """Wall-clock seconds of the replay that completed it (null: resumed, or not complete)."""
    startSeconds: float | None
    """Of those, the seconds the service took to start (the recording opened, the model
    loaded) before its first frame."""
    cpuSeconds: float | None
    """CPU seconds its worker's process spent on that replay."""
    worker: str | None
    """``NODE_ID:PID`` of the worker that replayed it."""


class FleetSummary(FrameTotals):
    recordings: int
    complete: int
    failed: int
    interrupted: int
    resumed: int
    """Complete ones skipped because an earlier run had replayed them."""
    failures: dict[str, str]
    """Each recording not complete, and why."""
    framesPerSecond: float | None
    """Frames replayed by this run (of every model) over the seconds from its first recording
    handed out to its last row written."""
    replaySeconds: float | None
    clusterStartSeconds: float | None


def percentiles(values: Any) -> Percentiles:
    """p50, p90, p99 and the largest of ``values`` (NaN and null left out); all null when
    there is none."""
    array = np.asarray(values, dtype=np.float64)
    array = array[np.isfinite(array)]
    if array.size == 0:
        return Percentiles(p50=None, p90=None, p99=None, max=None)
    p50, p90, p99 = (float(v) for v in np.percentile(array, (50, 90, 99)))
    return Percentiles(p50=p50, p90=p90, p99=p99, max=float(array.max()))


def _ms(column: Any) -> Any:
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64) * 1000.0


def recording_summary(table: Any, **facts: Any) -> RecordingSummary:
    """The summary of one recording's frames ``table`` (a ``pyarrow.Table`` of the frames
    file's columns), with ``facts`` (recording, path, model, status, reason, attempts,
    replaySeconds, cpuSeconds, worker)."""
    table = table.sort_by("seq")
    frames = table.num_rows
    valid = int(np.count_nonzero(table.column("valid").to_numpy(zero_copy_only=False)))
    recorded = table.column("recordedTimestampSof").to_numpy(zero_copy_only=False)
    live = table.column("timestampSof").to_numpy(zero_copy_only=False)
    sof = np.where(np.isnan(recorded.astype(np.float64)), live, recorded).astype(np.float64)
    seconds = np.diff(sof) / 1e9
    last = float(np.median(seconds)) if seconds.size else 0.0
    durations = np.append(np.clip(seconds, 0.0, None), max(last, 0.0))
    availability = table.column("availability").to_pylist()
    kinds = table.column("availabilityReasonKind").to_pylist()
    by_state: dict[str, dict[str, float]] = {"unavailable": {}, "degraded": {}}
    for state, kind, duration in zip(availability, kinds, durations, strict=True):
        if state in by_state:
            seconds_of = by_state[state]
            seconds_of[kind or "unknown"] = seconds_of.get(kind or "unknown", 0.0) + float(duration)
    return RecordingSummary(
        recording=facts["recording"],
        path=facts["path"],
        model=facts.get("model", "model"),
        status=facts.get("status", "complete"),
        reason=facts.get("reason"),
        attempts=facts.get("attempts", 1),
        frames=frames,
        valid=valid,
        validShare=valid / frames if frames else None,
        recordedSeconds=float(durations.sum()) if frames else 0.0,
        unavailableSeconds=dict(sorted(by_state["unavailable"].items())),
        degradedSeconds=dict(sorted(by_state["degraded"].items())),
        modelExecutionMs=percentiles(_ms(table.column("modelExecutionTime"))),
        frameAgeMs=percentiles(_ms(table.column("frameAge"))),
        replaySeconds=facts.get("replaySeconds"),
        startSeconds=facts.get("startSeconds"),
        cpuSeconds=facts.get("cpuSeconds"),
        worker=facts.get("worker"),
    )


def failed_summary(recording: str, path: str, **facts: Any) -> RecordingSummary:
    """The summary of a recording not complete: no frames counted."""
    empty = Percentiles(p50=None, p90=None, p99=None, max=None)
    return RecordingSummary(
        recording=recording,
        path=path,
        model=facts.get("model", "model"),
        status=facts.get("status", "failed"),
        reason=facts.get("reason"),
        attempts=facts.get("attempts", 1),
        frames=0,
        valid=0,
        validShare=None,
        recordedSeconds=0.0,
        unavailableSeconds={},
        degradedSeconds={},
        modelExecutionMs=empty,
        frameAgeMs=empty,
        replaySeconds=None,
        startSeconds=None,
        cpuSeconds=None,
        worker=facts.get("worker"),
    )


def fleet_summary(
    recordings: list[RecordingSummary],
    frames_files: list[Path],
    *,
    resumed: int = 0,
    replay_seconds: float | None = None,
    replayed_frames: int = 0,
    cluster_start_seconds: float | None = None,
) -> FleetSummary:
    """The fleet's summary of ``recordings``; its latency percentiles over every row of
    ``frames_files`` (the complete recordings' frames files)."""
    import pyarrow.parquet as pq

    status = Counter(summary["status"] for summary in recordings)
    unavailable: Counter[str] = Counter()
    degraded: Counter[str] = Counter()
    for summary in recordings:
        unavailable.update(summary["unavailableSeconds"])
        degraded.update(summary["degradedSeconds"])
    frames = sum(summary["frames"] for summary in recordings)
    valid = sum(summary["valid"] for summary in recordings)
    columns = ["modelExecutionTime", "frameAge"]
    table = pq.read_table(frames_files, columns=columns) if frames_files else None
    return FleetSummary(
        recordings=len(recordings),
        complete=status["complete"],
        failed=status["failed"],
        interrupted=status["interrupted"],
        resumed=resumed,
        failures={
            summary["recording"]: summary["reason"] or summary["status"]
            for summary in recordings
            if summary["status"] != "complete"
        },
        frames=frames,
        valid=valid,
        validShare=valid / frames if frames else None,
        recordedSeconds=sum(summary["recordedSeconds"] for summary in recordings),
        unavailableSeconds=dict(sorted(unavailable.items())),
        degradedSeconds=dict(sorted(degraded.items())),
        modelExecutionMs=percentiles(_ms(table.column(columns[0])) if table else []),
        frameAgeMs=percentiles(_ms(table.column(columns[1])) if table else []),
        framesPerSecond=(
            replayed_frames / replay_seconds if replay_seconds and replayed_frames else None
        ),
        replaySeconds=replay_seconds,
        clusterStartSeconds=cluster_start_seconds,
    )


def summary_table(recordings: list[RecordingSummary]) -> Any:
    """The recordings' summaries as one ``pyarrow.Table`` (``recordings.parquet``): a column a
    figure, the percentiles as ``modelExecutionMs.p50`` ..., the seconds by kind as maps."""
    import pyarrow as pa

    rows = []
    for summary in recordings:
        row: dict[str, Any] = {}
        for name, value in summary.items():
            if name in ("modelExecutionMs", "frameAgeMs"):
                row.update({f"{name}.{q}": v for q, v in value.items()})  # type: ignore[attr-defined]
            elif name in ("unavailableSeconds", "degradedSeconds"):
                row[name] = list(value.items())  # type: ignore[attr-defined]
            else:
                row[name] = value
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=_schema(pa))


def _schema(pa: Any) -> Any:
    number, text, count = pa.float64(), pa.string(), pa.int64()
    seconds = pa.map_(pa.string(), pa.float64())
    fields = [
        ("recording", text), ("path", text), ("model", text), ("status", text),
        ("reason", text), ("attempts", count), ("frames", count), ("valid", count),
        ("validShare", number), ("recordedSeconds", number),
        ("unavailableSeconds", seconds), ("degradedSeconds", seconds),
        *((f"modelExecutionMs.{q}", number) for q in ("p50", "p90", "p99", "max")),
        *((f"frameAgeMs.{q}", number) for q in ("p50", "p90", "p99", "max")),
        ("replaySeconds", number), ("startSeconds", number), ("cpuSeconds", number),
        ("worker", text),
    ]  # fmt: skip
    return pa.schema(fields)


def _quantiles(values: Percentiles) -> str:
    shown = {"p50": values["p50"], "p90": values["p90"], "p99": values["p99"], "max": values["max"]}
    return " ".join(f"{q} {'-' if v is None else f'{v:.1f}'}" for q, v in shown.items())


def format_fleet(fleet: FleetSummary, recordings: list[RecordingSummary], shown: int = 20) -> str:
    """The fleet's summary as the command prints it: the fleet's figures, the first ``shown``
    of ``recordings`` (the ones not complete first), the ones not complete with their reasons
    (every one, of every model)."""
    share = fleet["validShare"]
    rate = fleet["framesPerSecond"]
    lines = [
        "",
        "fleet summary",
        f"  recordings            {fleet['recordings']} ({fleet['complete']} complete, "
        f"{fleet['resumed']} of them resumed; {fleet['failed']} failed, "
        f"{fleet['interrupted']} interrupted)",
        f"  frames                {fleet['frames']} ({fleet['valid']} valid"
        + (f", {share:.1%}" if share is not None else "")
        + ")",
        f"  recorded time         {fleet['recordedSeconds']:.1f} s",
        f"  unavailable           {_by_kind(fleet['unavailableSeconds'])}",
        f"  degraded              {_by_kind(fleet['degradedSeconds'])}",
        "  model execution ms    " + _quantiles(fleet["modelExecutionMs"]),
        "  frame age ms          " + _quantiles(fleet["frameAgeMs"]),
        f"  frames/s              {rate:.1f}" if rate is not None else "  frames/s              -",
    ]
    if fleet["clusterStartSeconds"] is not None:
        lines.append(f"  cluster start         {fleet['clusterStartSeconds']:.1f} s")
    ordered = sorted(recordings, key=lambda s: s["status"] == "complete")
    lines += ["", f"  {'recording':<32} {'model':<8} {'status':<11} {'frames':>7} {'valid':>7}"]
    for summary in ordered[:shown]:
        share = summary["validShare"]
        lines.append(
            f"  {summary['recording'][:32]:<32} {summary['model']:<8} {summary['status']:<11} "
            f"{summary['frames']:>7} {'-' if share is None else f'{share:.1%}':>7}"
        )
    if len(ordered) > shown:
        lines.append(f"  ... and {len(ordered) - shown} more (recordings.parquet)")
    for summary in recordings:
        if summary["status"] != "complete":
            which = "" if summary["model"] == "model" else f" ({summary['model']})"
            reason = summary["reason"] or summary["status"]
            lines.append(f"  not complete: {summary['recording']}{which}: {reason}")
    return "\n".join(lines)


def _by_kind(seconds: dict[str, float]) -> str:
    if not seconds:
        return "0 s"
    total = sum(seconds.values())
    return f"{total:.1f} s (" + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()) + ")"
