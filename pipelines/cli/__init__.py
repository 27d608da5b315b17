"""The ``aio-dms`` command.

Signals are handled from the process's first line of ours (:mod:`pipelines.__main__`, which
imports this module; :func:`main` installs them where it is called otherwise); every
command ends with an exit code of :class:`~pipelines.exit_codes.ExitCode`; a bad option is one
line on standard error (exit 2), never a traceback or a usage block. ``run``, ``replay``,
``record``, ``model-info`` and ``report`` need the ``dms`` extra (``pip install 'aio-dms[dms]'``);
without it they are refused so, naming the module that is missing, and ``demo`` and
``--version`` still work.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from typing import NoReturn

from ..dms.summary import RunFacts, format_record, record_before_start, write_summary_json
from ..echo import cut_words
from ..exit_codes import ExitCode, stopped_exit_code
from ..extras import DMS_EXTRA, FLEET_EXTRA
from ..stopping import Interrupted, Stopping

__all__ = ["DMS_EXTRA", "main"]

_DMS_COMMANDS = ("run", "replay", "record", "model-info", "fleet")
_DMS_MODULES = (
    "pipelines.cli.run",
    "pipelines.dms.model.contract",
    "pipelines.dms.model.reference",
    "hypercorn.config",  # imported by the health server as it starts
)
"""What the DMS commands import (all of the DMS service)."""
_OWN_PACKAGES = ("aio_runtime", "transports", "pipelines")


class _Parser(argparse.ArgumentParser):
    """A bad option is one line: what was wrong, no usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.REFUSED, f"{self.prog}: {cut_words(message)}\n")


def _missing_dms_dependency() -> str | None:
    """The module that the DMS commands import and is not installed (the first their imports
    reach; its top-level package), or None when nothing is missing. A module of this project's
    own that does not import is a broken installation, not a missing extra: that error
    propagates."""
    try:
        for module in _DMS_MODULES:
            importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if not missing or missing in _OWN_PACKAGES:
            raise
        return missing  # what a distribution installs: ``hypercorn`` for ``hypercorn.config``
    return None


def _model_info(model: str | None) -> int:
    import json
    from pathlib import Path

    from ..dms.config.values import readable_file
    from ..dms.model.contract import load_contract
    from ..dms.model.limits import ModelContractError
    from ..dms.model.reference import reference_model_path

    if model is not None:
        try:  # as run and replay check it: refused before any work
            readable_file("model", Path(model), "expected an ONNX model file")
        except ValueError as exc:
            print(f"aio-dms model-info: {exc}", file=sys.stderr)
            return ExitCode.REFUSED
    try:
        contract = load_contract(model if model is not None else reference_model_path())
    except (ModelContractError, OSError) as exc:
        print(f"aio-dms model-info: {exc}", file=sys.stderr)
        return ExitCode.FAILED  # the model was checked, and fails
    print(json.dumps(contract.to_json(), indent=2))
    return ExitCode.OK


def _parser(with_dms: bool = True) -> argparse.ArgumentParser:
    """The command line; ``with_dms``: the DMS service is installed (without it, ``run`` and
    ``replay`` take none of its options, and the DMS commands' help says what to install)."""
    needs = "" if with_dms else f" (needs the dms extra: {DMS_EXTRA})"
    parser = _Parser(
        prog="aio-dms",
        description="Driver monitoring on in-car inference hardware, with no unbounded wait.",
        epilog="Exit codes: 0 success (a run stopped by a signal included), 1 a run or a "
        "recording that failed, or model-info of a model that fails its check, 2 refused before "
        "work started, 130 a replay or a recording interrupted, or a second signal.",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    commands.add_parser(
        "demo",
        help="a short demonstration of the runtime core: bounded waits, a mailbox timeout, "
        "availability going unavailable and recovering",
    )
    run_parser = commands.add_parser(
        "run",
        help="run the DMS service (defaults: synthetic camera, the bundled reference model, "
        "the simulated accelerator)" + needs,
    )
    replay = commands.add_parser(
        "replay",
        help="replay a recording, a video or an openpilot route segment through the service as "
        "fast as it goes, losing nothing: each stage waits for the next, and the sinks for "
        "their readers" + needs,
    )
    replay.add_argument(
        "input",
        metavar="INPUT",
        nargs="?",  # required: checked after parsing, to say what took it (see _main)
        help="a recording of ours, a video file, or an openpilot route segment directory (its "
        "dcamera.hevc, with the frame ids and timestamps of its rlog)",
    )
    record = commands.add_parser(
        "record",
        help="record frames from a camera source (as run takes it: at its pace) to a recording "
        "that replay reads, each frame compressed losslessly" + needs,
    )
    model_info = commands.add_parser(
        "model-info",
        help="print a DMS model's contract as JSON: inputs with shapes and dtypes, the output, "
        "the output slices as [start, stop]; the model is checked as the service would load it"
        + needs,
    )
    model_info.add_argument(
        "--model",
        metavar="PATH",
        help="an ONNX model with openpilot's driver-monitoring contract (default: the untrained "
        "reference model, built on first use)",
    )
    fleet = commands.add_parser(
        "fleet",
        help="replay many recordings on a Ray cluster (a local one by default) into one "
        "Parquet dataset, with summaries; 'fleet compare RUN_A RUN_B' compares two runs"
        + (needs if needs else f" (needs the fleet extra: {FLEET_EXTRA})"),
        description="Replay many recordings through the service's replay mode on a Ray "
        "cluster, into one Parquet dataset (OUT/frames) with a summary a recording and for the "
        "fleet (OUT/fleet.json, OUT/recordings.parquet). 'aio-dms fleet compare RUN_A RUN_B "
        "[--out DIR]' compares two runs of the same recordings.",
        epilog="Exit codes: 0 every recording complete, 1 the outputs could not be written, 2 "
        "refused before work started (a cluster that cannot be had included), 4 some "
        "recordings failed (each with its reason), 130 stopped by a signal.",
    )
    if with_dms:
        from .fleet import add_fleet_arguments
        from .record import add_record_arguments
        from .run import add_arguments

        add_arguments(run_parser, "run")
        add_arguments(replay, "replay")
        add_record_arguments(record)
        add_fleet_arguments(fleet)
    from .report import add_arguments as add_report_arguments

    add_report_arguments(
        commands.add_parser(
            "report",
            help="pictures of a run from its JSON lines (availability, frame age and latency, "
            "invalid frames by kind, detection and recovery per fault), or of a fleet run "
            "directory (valid share per recording, time away from available by reason kind, "
            "model time) and its comparison of two models (differences per field, decision "
            "flips per recording), and a page showing them",
        )
    )
    return parser


def _values_may_be_negative(argv: list[str]) -> list[str]:
    """``--calib -0.1,0,0`` as ``--calib=-0.1,0,0``: a value that begins with ``-`` is the
    option's value, not another option (argparse takes only plain negative numbers so)."""
    from .run import single_value_flags

    flags = single_value_flags() | {"--model", "--output"}
    joined: list[str] = []
    tokens = iter(argv)
    for token in tokens:
        if token in flags:
            value = next(tokens, None)
            if value is not None and value.startswith("-") and value not in flags:
                joined.append(f"{token}={value}")
                continue
            joined.append(token)
            if value is not None:
                joined.append(value)
            continue
        joined.append(token)
    return joined


def _word_value(argv: list[str], flag: str) -> str | None:
    """The value the command line gives ``flag`` (``--flag V``, ``--flag=V``, or an
    abbreviation argparse takes, ``--fl V``; the last one given counts), None if none. Read from
    the words themselves: a signal may come before the parser exists."""
    found = None
    for at, token in enumerate(argv):
        if token == "--":
            break
        name, equals, value = token.partition("=")
        if len(name) > len("--") and flag.startswith(name):
            found = value if equals else (argv[at + 1] if at + 1 < len(argv) else None)
    return found


def _jsonl_on_stdout(argv: list[str]) -> bool:
    """The command line sends the JSON lines to standard output (``--jsonl -``, ``--jsonl=-``,
    or an abbreviation argparse takes, ``--js -``; the last one given counts)."""
    return _word_value(argv, "--jsonl") == "-"


def _stopped_before_work(argv: list[str]) -> int:
    """A signal before the command had begun its work: nothing was published. A run's or a
    replay's summary says so (on standard error when the messages were to go to standard
    output, as at the end of a run; and as the ``--summary-json`` document where the words ask
    for one); the exit code of a command stopped by a signal. Nothing is imported here: the
    signal may have interrupted an import, which is then not safe to redo."""
    command = argv[0] if argv else None
    code = stopped_exit_code(command)
    if command in ("run", "replay"):
        words = argv[1:]
        facts = RunFacts(command, run_id=_word_value(words, "--run-id") or None, exit_code=code)
        record = record_before_start(facts)
        print(format_record(record), file=sys.stderr if _jsonl_on_stdout(words) else sys.stdout)
        path = _word_value(words, "--summary-json")
        if path:
            try:
                write_summary_json(path, record)
            except OSError as exc:
                print(
                    f"aio-dms {command}: the summary could not be written: {exc}", file=sys.stderr
                )
    else:
        print("aio-dms: stopped by a signal before it had started", file=sys.stderr)
    return code


def main(argv: list[str] | None = None, stopping: Stopping | None = None) -> int:
    """Run the command ``argv`` says; its exit code. ``stopping``: the process's signal
    handling, installed by the entry point (:mod:`pipelines.__main__`) before this module was
    imported; installed here if not given (a caller in its own process, a test)."""
    stopping = Stopping.install() if stopping is None else stopping
    argv = sys.argv[1:] if argv is None else argv
    try:
        stopping.arm()  # a signal held while this module was imported: acted on here
        return _main(argv, stopping)
    except Interrupted:  # wherever it came from before the command's loop ran
        return _stopped_before_work(argv)
    finally:
        stopping.end()  # what is left is ending: a first signal changes nothing any more


def _missing_fleet_dependency() -> str | None:
    """The module of the fleet extra that is not installed, or None."""
    return next((module for module in ("pyarrow", "ray") if not _installed(module)), None)


def _needs_fleet() -> int:
    print(
        "aio-dms fleet: fleet replays need the fleet extra, which is not installed (no module "
        f"named {_missing_fleet_dependency()!r}): {FLEET_EXTRA}",
        file=sys.stderr,
    )
    return ExitCode.REFUSED


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (found, not imported: the report imports it only once
    its input has been read)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # blocked (None in sys.modules)
        return False


def _needs_extra(command: str, missing: str) -> int:
    print(
        f"aio-dms {command}: the DMS service needs the dms extra, which is not installed "
        f"(no module named {missing!r}): {DMS_EXTRA}",
        file=sys.stderr,
    )
    return ExitCode.REFUSED


def _main(argv: list[str], stopping: Stopping) -> int:
    missing = _missing_dms_dependency()
    if missing is not None and argv and argv[0] in _DMS_COMMANDS:
        return _needs_extra(argv[0], missing)
    if argv[:2] == ["fleet", "compare"] and missing is None:
        if _missing_fleet_dependency() is not None:
            return _needs_fleet()
        from .fleet_compare import compare_command

        return compare_command(argv[2:])
    parser = _parser(with_dms=missing is None)
    if not argv:
        parser.print_usage(sys.stderr)
        parser.error("a command is required (demo, run, replay, record, model-info or report)")
    args = parser.parse_args(_values_may_be_negative(argv) if missing is None else argv)
    if args.command == "demo":
        from .demo import main as demo_main

        return demo_main(stopping)
    if args.command == "model-info":
        return _model_info(args.model)
    if args.command == "record":
        from .record import record

        return record(args, stopping)
    if args.command == "fleet":
        if _missing_fleet_dependency() is not None:
            return _needs_fleet()
        from .fleet import fleet

        return fleet(args, stopping)
    if args.command == "report":
        if not _installed("matplotlib"):  # its pictures need the extra too
            return _needs_extra("report", "matplotlib")
        from .report import report

        return report(args)
    from ..dms.config.kinds import Mode
    from .run import run

    if args.command == "replay":
        if args.input is None:
            from ..dms.config.settings import settings

            bare = next(d.bare for item, d in settings() if item.name == "cereal_zmq")
            taken = getattr(args, "cereal_zmq", None)
            hint = (
                f" (--cereal-zmq took {taken!r} as its host: write --cereal-zmq=HOST, or put "
                "INPUT before it)"
                if taken not in (None, bare)
                else ""
            )
            parser.error(f"replay: INPUT is required{hint}")
        if args.input == "synthetic":
            parser.error(
                "replay: INPUT is a recording, a video file or a route segment, not the "
                "synthetic camera"
            )
        return run(args, stopping, camera=args.input, mode=Mode.REPLAY)
    return run(args, stopping)


if __name__ == "__main__":  # python -m pipelines.cli: the process's entry point, as aio-dms's
    from pipelines.__main__ import main as entry

    entry()
