"""Reading published messages back: JSON lines as ``--jsonl PATH`` writes them.

What a report needs of a message is :class:`Message`, made from one message's record (a mapping
with the published field names), so any store of messages — JSON lines here, a table of results
elsewhere — turns into the same input of :func:`~pipelines.dms.report.analyse`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aio_runtime import Availability, reason_kind

__all__ = ["Message", "Reading", "ReportInputError", "parse_lines", "read_messages", "split_runs"]

_BAD_LINES_KEPT = 20
"""How many bad lines a reading keeps the numbers and causes of (all are counted)."""


class ReportInputError(ValueError):
    """The input cannot be reported on: missing, not a file, empty, or not one message in it.
    The text is one line saying what was expected."""


@dataclass(frozen=True)
class Message:
    """One published message, as a report reads it (times in seconds unless named ``_ns``)."""

    seq: int
    frame_id: int
    """-1 for a status message (published while no frame arrives)."""
    sof_ns: int
    """The frame's start of frame on the service's clock (0 for a status message)."""
    frame_age: float
    """Start of frame to publication; for a status message, the newest frame's age."""
    availability: Availability
    reason: str
    kind: str
    """The reason's kind (``reasonKind`` where the message carries it, else the text before
    ``": "``); ``""`` without a reason."""
    valid: bool
    model_time: float
    gpu_time: float
    run_id: str | None = None
    budget: float | None = None
    """The frame budget (seconds), where the message carries one (``budget``)."""
    late: bool | None = None
    """A valid frame published after its deadline (``late``; None where the message does not
    say: older records)."""
    availability_kind: str = ""
    """The kind of the availability's reason (``availabilityReasonKind``; ``""`` while
    AVAILABLE, and for older records, whose invalid messages carried it as their own)."""

    @property
    def is_status(self) -> bool:
        return self.frame_id < 0

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Message:
        """A message from its record; :class:`ValueError` naming the first field that is
        missing or of the wrong type."""
        reason = record.get("reason") or ""  # a valid message's may be empty or null
        if not isinstance(reason, str):
            raise ValueError(f"reason: expected a str, found a {type(reason).__name__}")
        kind = record.get("reasonKind")
        availability = _field(record, "availability", str)
        if availability not in tuple(Availability):
            raise ValueError(f"availability {availability!r} is not one of {list(Availability)}")
        run_id = record.get("runId")
        budget = record.get("budget")
        late = record.get("late")
        if late is not None and not isinstance(late, bool):
            raise ValueError(f"late: expected a bool, found a {type(late).__name__}")
        availability_kind = record.get("availabilityReasonKind")
        return cls(
            seq=_field(record, "seq", int),
            frame_id=_field(record, "frameId", int),
            sof_ns=_field(record, "timestampSof", int),
            frame_age=_seconds(record, "frameAge"),
            availability=Availability(availability),
            reason=reason,
            kind=kind if isinstance(kind, str) else (reason_kind(reason) if reason else ""),
            valid=_field(record, "valid", bool),
            model_time=_seconds(record, "modelExecutionTime", default=0.0),
            gpu_time=_seconds(record, "gpuExecutionTime", default=0.0),
            run_id=str(run_id) if run_id is not None else None,
            budget=_seconds(record, "budget") if budget is not None else None,
            late=late,
            availability_kind=availability_kind if isinstance(availability_kind, str) else "",
        )


@dataclass(frozen=True)
class Reading:
    """What a file held: its messages in order, and the lines that were not messages."""

    messages: list[Message]
    lines: int
    """Non-blank lines read."""
    bad_lines: int
    """Lines that were not a message (not JSON, or JSON that is no message)."""
    bad_examples: list[tuple[int, str]]
    """The first bad lines: (line number from 1, why)."""


def _field(record: Mapping[str, Any], name: str, kind: type) -> Any:
    value = record.get(name)
    if value is None or not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        found = "missing" if value is None else f"a {type(value).__name__}"
        raise ValueError(f"{name}: expected a {kind.__name__}, found {found}")
    return value


def _seconds(record: Mapping[str, Any], name: str, default: float | None = None) -> float:
    value = record.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number of seconds, found {value!r}")
    return float(value)


def parse_lines(lines: Iterable[str]) -> Reading:
    """The messages of JSON lines, in order; a line that is not a message is counted (with why,
    for the first few), not fatal. Blank lines are skipped."""
    messages: list[Message] = []
    read = bad = 0
    examples: list[tuple[int, str]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        read += 1
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"expected a JSON object, found a {type(record).__name__}")
            messages.append(Message.from_record(record))
        except ValueError as exc:  # json's errors are ValueErrors too
            bad += 1
            if len(examples) < _BAD_LINES_KEPT:
                why = "not JSON" if isinstance(exc, json.JSONDecodeError) else str(exc)
                examples.append((number, why))
    return Reading(messages, read, bad, examples)


def read_messages(path: Path) -> Reading:
    """The messages of the JSON lines file ``path``; :class:`ReportInputError` for a path that
    is not a readable file, a file with no lines, or one in which no line is a message."""
    if not path.is_file():
        found = "a directory" if path.is_dir() else "no such file"
        found = "not a regular file" if path.exists() and not path.is_dir() else found
        raise ReportInputError(f"{str(path)!r}: {found} (expected the JSON lines of a run)")
    try:
        with path.open(encoding="utf-8", errors="replace") as lines:
            reading = parse_lines(lines)
    except OSError as exc:
        raise ReportInputError(f"{str(path)!r}: cannot be read ({exc.strerror})") from None
    if reading.lines == 0:
        raise ReportInputError(f"{str(path)!r} is empty (expected the JSON lines of a run)")
    if not reading.messages:
        line, why = reading.bad_examples[0]
        raise ReportInputError(
            f"{str(path)!r}: not one of its {reading.lines} lines is a message "
            f"(line {line}: {why}; expected the JSON lines of a run)"
        )
    return reading


def split_runs(messages: Sequence[Message]) -> list[list[Message]]:
    """``messages`` cut into runs: a new run where the run id changes, or, for messages without
    one, where the sequence number does not go up (each run numbers its messages from 0)."""
    runs: list[list[Message]] = []
    for message in messages:
        if runs:
            last = runs[-1][-1]
            same = (
                message.run_id == last.run_id
                if message.run_id is not None or last.run_id is not None
                else message.seq > last.seq
            )
            if same:
                runs[-1].append(message)
                continue
        runs.append([message])
    return runs
