"""``aio-dms replay SEGMENT --compare PATH``: our driver states against openpilot's own.

When the segment's log holds openpilot's ``driverStateV2`` Events (it does when openpilot's model
ran in the car), the replay's messages are compared with them frame by frame (:mod:`..dms.openpilot.compare`):
a table on standard output (standard error when the messages go there), the comparison as one
JSON document at ``PATH``, and exit 3 (:attr:`~pipelines.exit_codes.ExitCode.DIFFERS`) when the
largest absolute difference is beyond ``--tolerance`` or a decision disagrees on a larger share
of the frames than ``--max-disagreement``. With openpilot's model file given by ``--model``, this
is openpilot's model replay on this runtime.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from ..dms.config.kinds import CameraFile
from ..dms.config.settings import ServiceConfig
from ..dms.config.text import number
from ..dms.config.values import writable_file
from ..dms.messages import DriverStateV2
from ..dms.openpilot.compare import Comparison, compare
from ..dms.openpilot.logs import LogError
from ..dms.openpilot.segment_log import SegmentError, segment_driver_states
from ..echo import shown

__all__ = [
    "CompareRequest",
    "add_compare_arguments",
    "collecting",
    "compare_request",
    "written_comparison",
]


@dataclass(frozen=True)
class CompareRequest:
    """A comparison asked for: the segment, where its document goes, the limits, and openpilot's
    own driver states from the segment's log (by frameId)."""

    segment: Path
    output: Path
    tolerance: float | None
    max_disagreement: float | None
    theirs: Mapping[int, Any]


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--compare",
        metavar="PATH",
        help="INPUT is an openpilot route segment whose log holds openpilot's own driverStateV2: "
        "compare ours with it frame by frame, print the table, write it to PATH as JSON "
        "(default: no comparison)",
    )
    parser.add_argument(
        "--tolerance",
        metavar="X",
        help="with --compare: exit 3 when a field's largest absolute difference is beyond X "
        "(default: none)",
    )
    parser.add_argument(
        "--max-disagreement",
        metavar="SHARE",
        help="with --compare: exit 3 when one of openpilot's decisions (face detected, eyes "
        "closed, phone, distracted pose) disagrees on more than SHARE of the frames, 0 to 1 "
        "(default: none)",
    )


def _limit(flag: str, text: str | None, *, share: bool) -> float | None:
    if text is None:
        return None
    try:
        value = number(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (share and value > 1):
        expected = "a share from 0 to 1" if share else "a number >= 0"
        raise ValueError(f"{flag} must be {expected}, got {shown(text)}")
    return value


def compare_request(
    args: argparse.Namespace, config: ServiceConfig, taken: Mapping[str, Path | None]
) -> CompareRequest | None:
    """What ``--compare`` asks (None: no comparison), with openpilot's driver states read from
    the segment's log (blocking: before the service starts); :class:`ValueError`, one line, for
    options that do not check (a limit without ``--compare``, an input that is not a segment
    directory or whose log holds no driverStateV2 of openpilot's, a path that cannot be
    written, one inside the segment, or a file the run uses already: ``taken``, by option)."""
    output = getattr(args, "compare", None)
    tolerance = _limit("--tolerance", getattr(args, "tolerance", None), share=False)
    share = _limit("--max-disagreement", getattr(args, "max_disagreement", None), share=True)
    if output is None:
        if tolerance is not None or share is not None:
            raise ValueError("--tolerance and --max-disagreement need --compare PATH")
        return None
    if not output:
        raise ValueError("--compare: expected a file path to write the comparison to, got ''")
    if not isinstance(config.camera, CameraFile) or not config.camera.path.is_dir():
        raise ValueError(
            f"--compare: INPUT must be an openpilot route segment directory, got {config.camera}"
        )
    path = Path(output)
    writable_file("--compare", path)
    segment = config.camera.path
    if path.resolve().is_relative_to(segment.resolve()):
        raise ValueError(f"--compare {output!r} is inside the segment replayed (INPUT)")
    for flag, other in taken.items():
        if other is not None and path.resolve() == other.resolve():
            raise ValueError(f"--compare {output!r} is the {flag} file")
    try:
        events = segment_driver_states(segment)
    except (SegmentError, LogError) as exc:
        raise ValueError(f"--compare: {exc}") from None
    if not events:
        raise ValueError(
            f"--compare: the log of {segment} holds no driverStateV2 of openpilot's to compare with"
        )
    theirs = {frame_id: event.driverStateV2 for frame_id, event in events.items()}
    return CompareRequest(segment, path, tolerance, share, theirs)


@contextlib.asynccontextmanager
async def collecting(
    messages: AsyncIterator[DriverStateV2], into: dict[int, DriverStateV2]
) -> AsyncIterator[None]:
    """While the block runs, and after it to the end of ``messages`` (a service's subscription
    ends as the service, inside the block, closes its sinks), the messages by frameId into
    ``into`` (status messages, which have no frame, left out). What the block raises comes out as
    it is, not in a group."""

    async def collect() -> None:
        async for message in messages:
            if message.frame_id >= 0:
                into[message.frame_id] = message

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0]  # noqa: B904 (the group is only the task group's wrapping)
        raise


def written_comparison(
    request: CompareRequest, ours: Mapping[int, DriverStateV2]
) -> tuple[Comparison, list[str]]:
    """Compare the replay's messages (by frameId) with openpilot's and write the JSON document;
    the comparison and what went beyond the limits. :class:`OSError` when the document cannot
    be written."""
    result = compare(ours, request.theirs)
    beyond = result.beyond(request.tolerance, request.max_disagreement)
    record: dict[str, Any] = {
        "segment": str(request.segment),
        **result.to_record(),
        "tolerance": request.tolerance,
        "maxDisagreement": request.max_disagreement,
        "beyond": beyond,
    }
    request.output.write_text(json.dumps(record, indent=2, allow_nan=False) + "\n")
    return result, beyond
