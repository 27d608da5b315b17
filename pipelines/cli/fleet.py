"""``aio-dms fleet INPUTS... --out DIR``: replay many recordings on a Ray cluster, to one dataset.

Everything is checked before a cluster is started: the options (the service's as ``replay`` takes
them, but its outputs and the settings the fleet sets for each replay), the inputs
(:mod:`pipelines.dms.fleet.inputs`) and ``--out`` (:mod:`pipelines.dms.fleet.layout`: new, or a run
to resume with the same settings). A refusal is one line, exit 2. Then the cluster
(:mod:`pipelines.dms.fleet.cluster`), the workers, the replays (:mod:`pipelines.dms.fleet.driver`),
and the summary on standard output; an overall progress line on standard error when it is a
terminal. Exit codes: 0 every recording complete, 4 some failed (each with its reason in the summary
and ``fleet.json``), 130 stopped by a signal (the recordings not complete marked interrupted), 2
refused (a cluster that cannot be had at ``--address`` included), 1 the outputs could not be
written. ``aio-dms fleet compare RUN_A RUN_B`` compares two runs.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
from pathlib import Path
from typing import Any

from aio_runtime import configure_logging

from ..dms.config.kinds import DeviceKind, Mode
from ..dms.config.text import integer, number
from ..dms.config.values import readable_file
from ..dms.fleet.cluster import ClusterError
from ..dms.fleet.driver import FleetProgress, run_fleet
from ..dms.fleet.inputs import find_recordings
from ..dms.fleet.layout import FIXED
from ..dms.fleet.plan import FleetOptions, plan_fleet
from ..dms.fleet.processes import descendants, kill
from ..dms.fleet.summary import format_fleet
from ..echo import shown, shown_path
from ..exit_codes import ExitCode
from ..stopping import Stopping

__all__ = ["FLEET_DEFAULTS", "add_arguments", "main", "single_value_flags"]

FLEET_DEFAULTS: dict[str, Any] = {"device": DeviceKind.CPU.value}
"""Where a fleet's default differs from a replay's: the model on onnxruntime on the CPU."""
_SHOWN = {
    "budget": "none: a fleet replays without a frame budget unless one is given, so that its "
    "rows do not depend on how loaded its machines are",
}


def add_arguments(parser: argparse.ArgumentParser, command: str = "fleet") -> None:
    """``aio-dms fleet``'s arguments."""
    from .run import add_log_format, add_setting_arguments

    parser.description = (
        "Replay many recordings through the service's replay mode on a Ray cluster, into one "
        "Parquet dataset (OUT/frames) with a summary a recording and for the fleet "
        "(OUT/fleet.json, OUT/recordings.parquet). 'aio-dms fleet compare RUN_A RUN_B "
        "[--out DIR]' compares two runs of the same recordings."
    )
    parser.epilog = (
        "Exit codes: 0 every recording complete, 1 the outputs could not be written, 2 refused "
        "before work started (a cluster that cannot be had included), 4 some recordings failed "
        "(each with its reason), 130 stopped by a signal."
    )

    defaults = FleetOptions(Path())
    parser.add_argument(
        "inputs", metavar="INPUT", nargs="+",
        help="recordings of ours, video files, openpilot route segment directories, "
        "directories holding them, or .txt files listing them (one path a line)",
    )  # fmt: skip
    parser.add_argument(
        "--out", metavar="DIR", required=True,
        help="the run's directory: new, empty, or a run to resume (recordings already "
        "replayed there are skipped)",
    )  # fmt: skip
    parser.add_argument(
        "--workers", metavar="N",
        help="workers (Ray actors), one recording each at a time; no more than the cluster's "
        "CPUs (default: one a CPU)",
    )  # fmt: skip
    parser.add_argument(
        "--address", metavar="HOST:PORT",
        help="join the Ray cluster there (its head's GCS address, or ray://HOST:PORT) instead "
        "of starting one on this machine; its token, if it asks for one, as Ray's tools take it "
        "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) (default: a local cluster)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline-model", metavar="PATH",
        help="replay every recording with this model too (into OUT/baseline) and compare the "
        "two (into OUT/comparison) (default: none)",
    )  # fmt: skip
    parser.add_argument(
        "--frame-timeout", metavar="SECONDS",
        help="a recording's wall-clock bound: --start-timeout plus this a frame; a worker past "
        f"it is killed and the recording fails (default: {defaults.frame_timeout:g})",
    )  # fmt: skip
    parser.add_argument(
        "--start-timeout", metavar="SECONDS",
        help="seconds a worker may take to start a recording's replay, within its bound "
        f"(default: {defaults.start_timeout:g})",
    )  # fmt: skip
    parser.add_argument(
        "--attempts", metavar="N",
        help="times a recording is handed out when its worker dies replaying it (default: "
        f"{defaults.attempts})",
    )  # fmt: skip
    add_setting_arguments(parser, "replay", without=FIXED, defaults=FLEET_DEFAULTS, shown=_SHOWN)
    add_log_format(parser)


def _options(args: argparse.Namespace) -> FleetOptions:
    from .run import config_from

    config = config_from(args, mode=Mode.REPLAY, no_budget=args.budget is None)
    config.check_environment()  # the model file: refused here rather than by every worker
    if config.model is not None:
        _checked_model("--model", config.model)
    defaults = FleetOptions(Path())
    baseline = None
    if args.baseline_model is not None:
        baseline = _checked_model("--baseline-model", Path(args.baseline_model))
    if not args.out:
        raise ValueError("--out: expected a directory path, got ''")
    try:
        Path(args.out).exists()
    except OSError as exc:  # not a path the machine can look at (a name too long)
        raise ValueError(f"--out {shown_path(args.out)}: {exc.strerror or exc}") from None
    workers = None if args.workers is None else _at_least_one("--workers", args.workers)
    return FleetOptions(
        Path(args.out),
        config,
        baseline_model=baseline,
        workers=workers,
        address=args.address,
        frame_timeout=_positive("--frame-timeout", args.frame_timeout, defaults.frame_timeout),
        start_timeout=_positive("--start-timeout", args.start_timeout, defaults.start_timeout),
        attempts=(
            defaults.attempts
            if args.attempts is None
            else _at_least_one("--attempts", args.attempts)
        ),
    )


def _checked_model(flag: str, path: Path) -> Path:
    """``path``, an ONNX model with the DMS contract (checked as a worker loads it)."""
    from ..dms.model.contract import load_contract

    readable_file(flag, path, "expected an ONNX model file")
    try:
        load_contract(path)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{flag} {shown_path(path)}: {exc}") from None
    return path


def _positive(flag: str, text: str | None, default: float) -> float:
    if text is None:
        return default
    try:
        value = number(text)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None
    if not 0 < value < math.inf:
        raise ValueError(f"{flag}: expected a number of seconds above 0, got {shown(text)}")
    return value


def _at_least_one(flag: str, text: str) -> int:
    try:
        value = integer(text)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None
    if value < 1:
        raise ValueError(f"{flag}: expected a whole number of at least 1, got {shown(text)}")
    return value


class _ProgressLine:
    """The fleet's progress on a terminal: recordings done, failed, frames a second."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("fleet"),
            BarColumn(),
            TextColumn("{task.fields[done]}"),
            TimeElapsedColumn(),
            console=Console(file=sys.stderr),
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._task = self._progress.add_task("fleet", total=None, done="")
        self._progress.start()

    def __call__(self, news: FleetProgress) -> None:
        rate = "-" if news.frames_per_second is None else f"{news.frames_per_second:.0f}"
        failed = f", {news.failed} failed" if news.failed else ""
        done = f"{news.done}/{news.total} recordings{failed}, {news.frames} frames, {rate} frames/s"
        self._progress.update(self._task, completed=news.done, total=news.total, done=done)

    def close(self) -> None:
        self._progress.stop()


def single_value_flags() -> set[str]:
    """The options that take one value (which may begin with ``-``): the service's, as
    ``replay`` takes them."""
    from .run import single_value_flags as service_flags

    return service_flags()


def main(args: argparse.Namespace, stopping: Stopping) -> int:
    """Run ``aio-dms fleet`` as ``args`` say; its exit code."""
    command = "aio-dms fleet"
    configure_logging(args.log_format)
    try:
        options = _options(args)
        plan = plan_fleet(find_recordings(args.inputs), options)
    except ValueError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return ExitCode.REFUSED
    stop = threading.Event()
    line = _ProgressLine() if sys.stderr.isatty() else None
    try:
        with stopping.calling(stop.set, at_exit=lambda: kill(descendants())):
            result = run_fleet(plan, stop=stop, progress=line)
    except ClusterError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return ExitCode.REFUSED
    except OSError as exc:
        print(f"{command}: the run's outputs could not be written: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    finally:
        if line is not None:
            line.close()
    print(format_fleet(result.summary, result.recordings), flush=True)
    if result.not_compared is not None:
        print(
            f"{command}: the two models were not compared: {result.not_compared}", file=sys.stderr
        )
    if result.comparison is not None:
        print(f"\nbaseline model against the model ({plan.runs['model'].comparison_dir})")
        print(result.comparison.table(), flush=True)
    if result.interrupted:
        return ExitCode.INTERRUPTED
    if any(s["status"] == "failed" for s in result.recordings):
        return ExitCode.SOME_FAILED
    return ExitCode.OK
