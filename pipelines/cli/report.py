"""``aio-dms report INPUT -o DIR``: a run's pictures, or a fleet's, and a page that shows them.

``INPUT`` is the JSON lines of a run or replay, or a directory of a fleet
(:mod:`pipelines.dms.report.fleet`): a fleet run directory (its ``frames/``; with its
``comparison/`` where there is one) or a comparison directory (its ``comparison.json``).

Everything is checked before anything is written: the input is a readable file of JSON lines
with at least one message, or a fleet directory whose files can be read; ``DIR`` is a directory
or can be made one; ``--budget`` is a budget the service would take, ``--run`` a run the file
holds (both for JSON lines only). A refusal is one line and
:attr:`~pipelines.exit_codes.ExitCode.REFUSED`. matplotlib is imported only once the input has
been read.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..dms.report._analysis import RunData, analyse
from ..dms.report._page import page, write_pictures
from ..dms.report._reading import Reading, ReportInputError, read_messages, split_runs
from ..exit_codes import ExitCode

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..stopping import Stopping

__all__ = [
    "CAPTIONS",
    "add_arguments",
    "check_output",
    "draw",
    "main",
    "single_value_flags",
    "write_report",
]

CAPTIONS = {
    "timeline": "Availability over time",
    "latency": "Frame age and latency over time",
    "invalid": "Invalid messages by kind",
    "episodes": "Detection and recovery per fault episode",
}
"""Each picture's caption on the page, by name (``NAME.png``)."""


def add_arguments(parser: argparse.ArgumentParser, command: str = "report") -> None:
    """``aio-dms report``'s arguments."""
    from ..dms.config.settings import ServiceConfig

    parser.add_argument(
        "input", metavar="INPUT",
        help="the JSON lines of a run or replay; or a fleet run directory (its frames/, and its "
        "comparison/ where there is one); or a fleet comparison directory (its comparison.json)",
    )  # fmt: skip
    parser.add_argument(
        "-o", "--output", metavar="DIR", required=True,
        help="the directory to write index.html and the pictures to (made if missing; files "
        "of the same names are replaced)",
    )  # fmt: skip
    parser.add_argument(
        "--budget", metavar="SECONDS",
        help="JSON lines: the frame budget drawn on the latency picture, where the messages do "
        f"not carry theirs (default: the service's, {ServiceConfig().budget:g})",
    )  # fmt: skip
    parser.add_argument(
        "--run", metavar="N", help="JSON lines: which run of a file holding several (one per "
        "run id, or per restart of the sequence numbers), from 1 (default: the last)",
    )  # fmt: skip


def check_output(directory: Path) -> None:
    """``directory`` is one, or can be made: :class:`ValueError` saying what is wrong."""
    from ..echo import shown_path

    said = f"output {shown_path(directory)}"
    if directory.exists():
        if not directory.is_dir():
            raise ValueError(f"{said} exists and is not a directory")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise ValueError(f"{said}: cannot be written (permission denied)")
        return
    parent = next(above for above in directory.absolute().parents if above.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{said}: cannot be made in {shown_path(parent)}")


def _budget(text: str | None) -> float:
    from ..dms.config.settings import ServiceConfig, settings

    if text is None:
        return ServiceConfig().budget
    declared = next(found for item, found in settings() if item.name == "budget")
    value: float = declared.accept("budget", text)
    return value


def _run_number(text: str | None, runs: int) -> int:
    """The chosen run's index (from 0)."""
    from ..dms.config.text import integer
    from ..echo import shown

    if text is None:
        return runs - 1
    try:
        number = integer(text)
    except ValueError:
        raise ValueError(f"run: expected a run number from 1, got {shown(text)}") from None
    if not 1 <= number <= runs:
        held = "one run" if runs == 1 else f"{runs} runs"
        raise ValueError(f"run {number}: the input holds {held} (expected 1 to {runs})")
    return number - 1


def draw(data: RunData) -> dict[str, Figure]:
    """Every picture of the report, by name."""
    from ..dms.report.figures import (
        episodes_figure,
        invalid_figure,
        latency_figure,
        timeline_figure,
    )

    return {
        "timeline": timeline_figure(data),
        "latency": latency_figure(data),
        "invalid": invalid_figure(data),
        "episodes": episodes_figure(data),
    }


def write_report(
    data: RunData, directory: Path, *, source: str, notes: list[str] | None = None
) -> list[Path]:
    """Draw ``data``'s pictures and write them (``NAME.png``) and ``index.html`` into
    ``directory`` (made if missing); the files written, the page last. :class:`OSError` if a
    file cannot be written."""
    return write_pictures(
        directory,
        draw(data),
        CAPTIONS,
        lambda images: page(data, images, source=source, notes=notes or ()),
    )


def _notes(reading: Reading, runs: int, chosen: int) -> list[str]:
    notes = []
    if reading.bad_lines:
        shown = ", ".join(f"line {line}: {why}" for line, why in reading.bad_examples[:3])
        more = "…" if reading.bad_lines > 3 else ""
        notes.append(
            f"{reading.bad_lines} of {reading.lines} lines were not messages and were left out "
            f"({shown}{more})"
        )
    if runs > 1:
        notes.append(f"the input holds {runs} runs; this is run {chosen + 1}")
    return notes


def _fleet_report(args: argparse.Namespace, command: str) -> int:
    """``aio-dms report`` of a fleet directory: the exit code."""
    from ..dms.report.fleet import read_fleet_inputs, write_fleet_report

    try:
        for flag, given in (("--budget", args.budget), ("--run", args.run)):
            if given is not None:
                raise ValueError(f"{flag} is for JSON lines, not a fleet directory")
        output = Path(args.output)
        check_output(output)
        inputs = read_fleet_inputs(Path(args.input))
    except ValueError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return ExitCode.REFUSED
    try:
        written = write_fleet_report(inputs, output, source=Path(args.input).resolve().name)
    except OSError as exc:
        print(f"{command}: cannot write the report: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    print(written[-1])
    return ExitCode.OK


def single_value_flags() -> set[str]:
    """The options that take one value (which may begin with ``-``)."""
    return {"--output", "--budget", "--run"}


def main(args: argparse.Namespace, stopping: Stopping | None = None) -> int:
    """``aio-dms report``: the exit code; the page's path on standard output, what was left out
    of the input on standard error."""
    command = "aio-dms report"
    from ..dms.report.fleet import is_fleet_input

    if Path(args.input).is_dir() and is_fleet_input(Path(args.input)):
        return _fleet_report(args, command)
    try:
        budget = _budget(args.budget)
        output = Path(args.output)
        check_output(output)
        reading = read_messages(Path(args.input))
        runs = split_runs(reading.messages)
        chosen = _run_number(args.run, len(runs))
    except (ReportInputError, ValueError) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return ExitCode.REFUSED
    notes = _notes(reading, len(runs), chosen)
    for note in notes:
        print(f"{command}: {note}", file=sys.stderr)
    data = analyse(runs[chosen], budget=budget)
    try:
        written = write_report(data, output, source=Path(args.input).name, notes=notes)
    except OSError as exc:
        print(f"{command}: cannot write the report: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    print(written[-1])
    return ExitCode.OK
