"""The ``aio-dms`` command: a table of its commands (:data:`COMMANDS`), one module each.

Signals are handled from the process's first line of ours (:mod:`pipelines.__main__`, which
imports this module; :func:`main` installs them where it is called otherwise); every
command ends with an exit code of :class:`~pipelines.exit_codes.ExitCode`; a bad option is one
line on standard error (exit 2), never a traceback or a usage block. A command whose extra is not
installed is refused so, naming the module that is missing and what installs it; ``demo`` and
``--version`` need none.

A command's module is imported only when the command is used and gives
``add_arguments(parser, command)`` and ``main(args, stopping) -> int``; and where it takes
options whose values may begin with ``-`` (``--calib -0.1,0,0``), ``single_value_flags()``, the
options that take one value.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import NoReturn

from ..dms.summary import RunFacts, format_record, record_before_start, write_summary_json
from ..echo import cut_words
from ..exit_codes import ExitCode, stopped_exit_code
from ..extras import DMS, DMS_EXTRA, FLEET, REPORT, Extra
from ..stopping import Interrupted, Stopping

__all__ = ["COMMANDS", "DMS_EXTRA", "Command", "build_parser", "main", "parse_args"]


@dataclass(frozen=True)
class Command:
    """A command of ``aio-dms``: its name, its module (relative to this package), its one-line
    help and the extras it needs, in the order they are checked."""

    name: str
    module: str
    help: str
    extras: tuple[Extra, ...] = ()

    def load(self) -> ModuleType:
        return importlib.import_module(self.module, __name__)


COMMANDS = (
    Command(
        "demo",
        ".demo",
        "a short demonstration of the runtime core: bounded waits, a mailbox timeout, "
        "availability going unavailable and recovering",
    ),
    Command(
        "run",
        ".run",
        "run the DMS service (defaults: synthetic camera, the bundled reference model, the "
        "simulated accelerator)",
        (DMS,),
    ),
    Command(
        "replay",
        ".run",
        "replay a recording, a video or an openpilot route segment through the service as fast "
        "as it goes, losing nothing: each stage waits for the next, and the sinks for their "
        "readers",
        (DMS,),
    ),
    Command(
        "record",
        ".record",
        "record frames from a camera source (as run takes it: at its pace) to a recording that "
        "replay reads, each frame compressed losslessly",
        (DMS,),
    ),
    Command(
        "model-info",
        ".model_info",
        "print a DMS model's contract as JSON: inputs with shapes and dtypes, the output, the "
        "output slices as [start, stop]; the model is checked as the service would load it",
        (DMS,),
    ),
    Command(
        "fleet",
        ".fleet",
        "replay many recordings on a Ray cluster (a local one by default) into one Parquet "
        "dataset, with summaries; 'fleet compare RUN_A RUN_B' compares two runs",
        (DMS, FLEET),
    ),
    Command(
        "report",
        ".report",
        "pictures of a run from its JSON lines (availability, frame age and latency, invalid "
        "frames by kind, detection and recovery per fault), or of a fleet run directory (valid "
        "share per recording, time away from available by reason kind, model time) and its "
        "comparison of two models (differences per field, decision flips per recording), and a "
        "page showing them",
        (REPORT,),
    ),
)
"""Every command, in the order ``--help`` lists them."""
_BY_NAME = {command.name: command for command in COMMANDS}


class _Parser(argparse.ArgumentParser):
    """A bad option is one line: what was wrong, no usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.REFUSED, f"{self.prog}: {cut_words(message)}\n")


def _missing(command: Command) -> tuple[Extra, str] | None:
    """The first extra ``command`` needs that is not installed, with the module missing."""
    for extra in command.extras:
        missing = extra.missing()
        if missing is not None:
            return extra, missing
    return None


def build_parser(chosen: Command | None = None) -> argparse.ArgumentParser:
    """The command line: every command with its help, and the options of ``chosen`` (None: of
    none; only its module is imported). A command that lacks an extra takes none of its options,
    and its help says what to install."""
    return _parser(chosen, _missing(chosen) if chosen is not None else None)


def _parser(chosen: Command | None, lacking: tuple[Extra, str] | None) -> argparse.ArgumentParser:
    """:func:`build_parser`, with what ``chosen`` lacks already asked (None: nothing, or no
    command chosen: then each command is asked)."""
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
    for command in COMMANDS:
        lacks = _missing(command) if chosen is None else lacking if command is chosen else None
        needs = f" (needs the {lacks[0].name} extra: {lacks[0].install})" if lacks else ""
        sub = commands.add_parser(command.name, help=command.help + needs)
        if command is chosen and lacks is None:
            command.load().add_arguments(sub, command.name)
    return parser


def _values_may_be_negative(argv: list[str], flags: set[str]) -> list[str]:
    """``--calib -0.1,0,0`` as ``--calib=-0.1,0,0``: a value that begins with ``-`` is the
    option's value, not another option (argparse takes only plain negative numbers so), for each
    of ``flags``, the options that take one value."""
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


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``argv`` as the command line parses it: its command's options, a value that begins with
    ``-`` taken as its option's; a bad option exits 2 with one line on standard error."""
    command = _BY_NAME.get(argv[0]) if argv else None
    return _parse(argv, command, _missing(command) if command is not None else None)


def _parse(
    argv: list[str], command: Command | None, lacking: tuple[Extra, str] | None
) -> argparse.Namespace:
    parser = _parser(command, lacking)
    if not argv:
        parser.print_usage(sys.stderr)
        names = ", ".join(c.name for c in COMMANDS[:-1])
        parser.error(f"a command is required ({names} or {COMMANDS[-1].name})")
    if command is not None and lacking is None:
        single = getattr(command.load(), "single_value_flags", None)
        argv = _values_may_be_negative(argv, single() if single is not None else set())
    return parser.parse_args(argv)


def _main(argv: list[str], stopping: Stopping) -> int:
    command = _BY_NAME.get(argv[0]) if argv else None
    lacking = _missing(command) if command is not None else None
    if command is not None and lacking is not None:
        extra, module = lacking
        print(extra.refusal(command.name, module), file=sys.stderr)
        return ExitCode.REFUSED
    if argv[:2] == ["fleet", "compare"]:
        from .fleet_compare import compare_command

        return compare_command(argv[2:])
    args = _parse(argv, command, lacking)
    code: int = _BY_NAME[args.command].load().main(args, stopping)
    return code
