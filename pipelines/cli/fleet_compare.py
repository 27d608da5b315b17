"""``aio-dms fleet compare RUN_A RUN_B [--out DIR]``: a candidate fleet run against a baseline.

RUN_A (the baseline) and RUN_B (the candidate) are fleet run directories of the same
recordings; the comparison (:func:`pipelines.dms.fleet.compare.compare_runs`) is written to ``DIR``
(:func:`pipelines.dms.fleet.compare.write_comparison`; default ``RUN_B/comparison``) and its table printed on
standard output, followed by the line naming ``DIR``. Everything is checked before anything is
written: both runs are run directories whose files have the frames' schema, ``DIR`` is a
directory or can be made one, and it is neither run directory nor inside their ``frames``
folders. A refusal is one line on standard error and
:attr:`~pipelines.exit_codes.ExitCode.REFUSED`; a comparison that cannot be written,
:attr:`~pipelines.exit_codes.ExitCode.FAILED`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from ..dms.fleet.compare import compare_runs, write_comparison
from ..dms.fleet.run_frames import FRAMES_DIR
from ..exit_codes import ExitCode
from .report import check_output

__all__ = [
    "COMMAND",
    "DEFAULT_OUT",
    "add_compare_arguments",
    "compare_command",
    "compare_parser",
    "run_compare",
]

COMMAND = "aio-dms fleet compare"
DEFAULT_OUT = "comparison"
"""Where the comparison goes by default: this folder of RUN_B."""


class _Parser(argparse.ArgumentParser):
    """A bad option is one line: what was wrong, no usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.REFUSED, f"{self.prog}: {message}\n")


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    """``aio-dms fleet compare``'s arguments, on ``parser``."""
    parser.add_argument("baseline", metavar="RUN_A", help="the baseline's fleet run directory")
    parser.add_argument(
        "candidate", metavar="RUN_B", help="the candidate's fleet run directory (same recordings)"
    )
    parser.add_argument(
        "--out", metavar="DIR",
        help="the directory to write fields.parquet, recordings.parquet and comparison.json to "
        f"(made if missing; files of those names are replaced; default: RUN_B/{DEFAULT_OUT})",
    )  # fmt: skip


def compare_parser() -> argparse.ArgumentParser:
    """The command line of ``aio-dms fleet compare`` on its own (a bad option: one line, exit 2)."""
    parser = _Parser(
        prog=COMMAND,
        description="Compare two fleet runs of the same recordings frame by frame: per driver "
        "field the differences B - A, per recording the share of frames where one of "
        "openpilot's decisions flips; largest changes first.",
    )
    add_compare_arguments(parser)
    return parser


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def _check_out(out: Path, runs: tuple[Path, Path]) -> None:
    for run in runs:
        if out.resolve() == run.resolve():
            raise ValueError(f"--out {str(out)!r} is a run directory compared (RUN_A or RUN_B)")
        if _inside(out, run / FRAMES_DIR):
            raise ValueError(f"--out {str(out)!r} is inside the frames of {str(run)!r}")
    try:
        check_output(out)
    except ValueError as exc:
        raise ValueError(f"--out: {exc}") from None


def run_compare(args: argparse.Namespace) -> int:
    """The command, its arguments parsed (by a parser :func:`add_compare_arguments` made): the
    exit code."""
    baseline, candidate = Path(args.baseline), Path(args.candidate)
    out = Path(args.out) if args.out is not None else candidate / DEFAULT_OUT
    try:
        if args.out == "":
            raise ValueError("--out: expected a directory, got ''")
        _check_out(out, (baseline, candidate))
        comparison = compare_runs(baseline, candidate)
    except ValueError as exc:
        print(f"{COMMAND}: {exc}", file=sys.stderr)
        return ExitCode.REFUSED
    try:
        write_comparison(comparison, out)
    except OSError as exc:
        print(f"{COMMAND}: the comparison could not be written: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    print(comparison.table())
    print(f"\ncomparison written to {out}")
    return ExitCode.OK


def compare_command(argv: list[str]) -> int:
    """``aio-dms fleet compare`` with the words after ``compare``: the exit code (a bad option's
    too, as argparse gives it; ``--help``'s, 0)."""
    try:
        args = compare_parser().parse_args(argv)
    except SystemExit as exc:  # argparse's own refusals and --help exit
        return exc.code if isinstance(exc.code, int) else ExitCode.REFUSED
    return run_compare(args)
