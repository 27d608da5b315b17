"""The summary of ``aio-dms run`` and ``aio-dms replay``: the text they print as they end, and the
same figures as one JSON document (``--summary-json PATH``), whose schema is
:class:`RunSummaryRecord` (version :data:`SUMMARY_VERSION`).

Only the standard library at run time: the entry point imports this module before the service's
own (much longer) imports, so that a signal which interrupts those is still reported with this
summary; a module whose import a signal interrupted cannot safely be imported again.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from .files import replace_whole

__all__ = [
    "AVAILABILITY_STATES",
    "SUMMARY_VERSION",
    "FrameAgeMs",
    "FrameCounts",
    "RunFacts",
    "RunSummaryRecord",
    "SinkRecord",
    "TransitionRecord",
    "build_record",
    "format_record",
    "record_before_start",
    "utc_now",
    "write_json_document",
    "write_summary_json",
]

SUMMARY_VERSION: Literal[1] = 1
"""The version of :class:`RunSummaryRecord`; raised when a field changes meaning or goes."""
AVAILABILITY_STATES = ("available", "degraded", "unavailable")


class FrameCounts(TypedDict):
    """How the frames that reached the service ended (``published == valid + invalid``;
    ``received == published + dropped``; ``late``: of the valid frames, those published after
    their deadline)."""

    received: int
    published: int
    valid: int
    late: int
    invalid: int
    dropped: int


class FrameAgeMs(TypedDict):
    """Milliseconds from a frame's start of frame to its publication, over the frames published
    (the latest 100 000); null when none was."""

    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None


class TransitionRecord(TypedDict):
    """One change of availability: ``atS`` seconds after the first state the run had."""

    atS: float
    state: str
    """``available``, ``degraded`` or ``unavailable``."""
    reason: str | None
    """``"<kind>: <detail>"``; null for ``available``."""


class SinkRecord(TypedDict):
    """One sink's counts (``published == delivered + dropped`` once closed)."""

    name: str
    published: int
    delivered: int
    dropped: int
    failed: str | None
    closedByReader: bool


class RunSummaryRecord(TypedDict):
    """The ``--summary-json`` document, one per run or replay."""

    version: Literal[1]
    runId: str | None
    """The ``runId`` of the run's messages; null if it was stopped before its service started
    and none was given."""
    command: str
    """``run`` or ``replay``."""
    input: str | None
    """The camera: ``synthetic`` or the file's path (null: stopped before the options were
    read)."""
    device: str | None
    """``sim`` or ``cpu``."""
    model: str | None
    """The model file's path, or ``reference`` (the bundled model)."""
    startedAt: str
    endedAt: str
    """ISO 8601, UTC, to the millisecond."""
    exitCode: int
    stopped: str | None
    """What stopped the run before it ended by itself (``signal``, ``standard output closed by
    its reader``...); null when it ended by itself."""
    error: str | None
    """Why the run failed (exit code 1); null otherwise."""
    frames: FrameCounts
    invalidByKind: dict[str, int]
    """Invalid frames by their reason's kind (``gpu-queue``, ``frame budget``...)."""
    droppedByStage: dict[str, int]
    frameAgeMs: FrameAgeMs
    availabilitySeconds: dict[str, float]
    """Seconds spent in each state, every state present, from the first state to the end."""
    transitions: list[TransitionRecord]
    sinks: list[SinkRecord]


def utc_now() -> str:
    """Now, as the document's times are written: ``2025-06-12T10:15:30.123Z``."""
    now = datetime.datetime.now(datetime.UTC)
    return now.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class RunFacts:
    """What the command knows of the run beside the service's summary."""

    command: str
    run_id: str | None = None
    input: str | None = None
    device: str | None = None
    model: str | None = None
    started_at: str = field(default_factory=utc_now)
    exit_code: int = 0
    stopped: str | None = None
    error: str | None = None


def build_record(
    facts: RunFacts,
    frames: FrameCounts,
    invalid: dict[str, int],
    dropped: dict[str, int],
    ages: FrameAgeMs,
    changes: list[tuple[float, str]],
    ended: float | None,
    sinks: list[SinkRecord],
) -> RunSummaryRecord:
    """The ``--summary-json`` document of a run: its facts, frames and sinks, its transitions
    (``changes``: (time, state text) each) and the seconds in each state up to ``ended`` (None:
    up to the last change)."""
    start = changes[0][0] if changes else 0.0
    transitions: list[TransitionRecord] = []
    seconds = dict.fromkeys(AVAILABILITY_STATES, 0.0)
    for k, (when, text) in enumerate(changes):
        state, _, reason = text.partition("(")
        transitions.append(
            TransitionRecord(atS=when - start, state=state, reason=reason[:-1] or None)
        )
        until = changes[k + 1][0] if k + 1 < len(changes) else max(when, ended or when)
        seconds[state] = seconds.get(state, 0.0) + (until - when)
    return RunSummaryRecord(
        version=SUMMARY_VERSION,
        runId=facts.run_id,
        command=facts.command,
        input=facts.input,
        device=facts.device,
        model=facts.model,
        startedAt=facts.started_at,
        endedAt=utc_now(),
        exitCode=int(facts.exit_code),
        stopped=facts.stopped,
        error=facts.error,
        frames=frames,
        invalidByKind=invalid,
        droppedByStage=dropped,
        frameAgeMs=ages,
        availabilitySeconds=seconds,
        transitions=transitions,
        sinks=sinks,
    )


def record_before_start(facts: RunFacts) -> RunSummaryRecord:
    """The document of a command stopped by a signal before its service had started: nothing
    received, nothing published (``facts``: what is known of the command)."""
    counts = FrameCounts(received=0, published=0, valid=0, late=0, invalid=0, dropped=0)
    ages = FrameAgeMs(p50=None, p90=None, p99=None, max=None)
    stopped = RunFacts(**{**vars(facts), "stopped": "signal, before the service had started"})
    return build_record(stopped, counts, {}, {}, ages, [], None, [])


def write_summary_json(path: str | os.PathLike[str], record: RunSummaryRecord) -> None:
    """Write ``record`` to ``path`` as one JSON document (replacing a file there whole: a
    reader never sees half of one); :class:`OSError` if it cannot be."""
    write_json_document(path, record)


def write_json_document(path: str | os.PathLike[str], document: object) -> None:
    """Write ``document`` to ``path`` as JSON, indented, NaN-free: to a file beside it, then
    renamed over it (a reader never sees half of one); :class:`OSError` if it cannot be."""
    text = json.dumps(document, indent=2, allow_nan=False) + "\n"
    replace_whole(path, lambda target: target.write_text(text, encoding="utf-8"))


def format_record(record: RunSummaryRecord) -> str:
    """The document as the commands print it: frames received, published (the invalid ones by
    their reason's kind), dropped (by stage), frame ages, each sink's counts, the availability's
    changes and the time in each state."""
    frames, stopped = record["frames"], record["stopped"]
    lines = [
        "",
        "summary" + (f" (stopped: {stopped})" if stopped else ""),
        f"  frames received      {frames['received']}",
        f"  published valid      {frames['valid']}"
        + (f" ({frames['late']} late)" if frames["late"] else ""),
        f"  published invalid    {frames['invalid']}",
    ]
    for kind, count in record["invalidByKind"].items():
        lines.append(f"    {count:5d}  {kind[:100]}")
    lines.append(f"  dropped              {frames['dropped']}")
    for stage, count in record["droppedByStage"].items():
        lines.append(f"    {count:5d}  at {stage}")
    ages = record["frameAgeMs"]
    p50, p99, most = (math.nan if v is None else v for v in (ages["p50"], ages["p99"], ages["max"]))
    lines.append(f"  frame age ms         p50 {p50:.1f}  p99 {p99:.1f}  max {most:.1f}")
    for sink in record["sinks"]:
        lines.append(
            f"  sink {sink['name']:<14} published {sink['published']}, delivered "
            f"{sink['delivered']}, dropped {sink['dropped']}"
            + (f"; failed: {sink['failed']}" if sink["failed"] else "")
        )
    lines.append("  availability")
    for change in record["transitions"]:
        reason = change["reason"]
        state = change["state"] + (f"({reason})" if reason else "")
        lines.append(f"    {change['atS']:8.3f} s  {state[:110]}")
    lines.append(
        "  time " + ", ".join(f"{s} {t:.3f} s" for s, t in record["availabilitySeconds"].items())
    )
    return "\n".join(lines)
