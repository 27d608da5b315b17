"""``aio-dms run`` (and ``aio-dms replay``): the DMS service from the command line, with a progress
line on a terminal (:mod:`.progress`), a summary at the end — as text, and as a JSON document
with ``--summary-json`` (:mod:`pipelines.dms.summary`) — and the exit codes of
:class:`~pipelines.exit_codes.ExitCode`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import os
import sys
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import anyio
from rich.console import Console

from aio_runtime import configure_logging, now

from ..dms.config.kinds import CameraFile, Mode
from ..dms.config.settings import ServiceConfig, settings
from ..dms.config.text import integer, number
from ..dms.config.values import Setting, writable_file
from ..dms.frames.frame import Frame
from ..dms.messages import DriverStateV2
from ..dms.service import DmsService, StartupError, Summary
from ..dms.sinks import SINKS
from ..dms.summary import (
    FrameAgeMs,
    FrameCounts,
    RunFacts,
    RunSummaryRecord,
    SinkRecord,
    build_record,
    format_record,
    write_summary_json,
)
from ..echo import shown_path
from ..exit_codes import ExitCode, stopped_exit_code
from ..stopping import Stopping
from .progress import ProgressDisplay, follow_progress, progress_console
from .replay_compare import (
    CompareRequest,
    add_compare_arguments,
    collecting,
    compare_request,
    written_comparison,
)

__all__ = [
    "add_arguments",
    "add_log_format",
    "add_setting_arguments",
    "config_from",
    "flag_of",
    "main",
    "run",
    "single_value_flags",
]

_DEFAULTS = ServiceConfig()
_METAVARS: dict[Callable[[str], Any] | None, str] = {number: "SECONDS", integer: "N"}
"""The metavar of a setting parsed by one of these, where it declares none."""


def add_arguments(parser: argparse.ArgumentParser, command: str = "run") -> None:
    """``aio-dms COMMAND``'s options: one per setting of the service that the command takes
    (generated from its declaration, its default shown), and the log format; ``replay``'s
    ``INPUT`` first."""
    if command == "replay":
        parser.add_argument(
            "input",
            metavar="INPUT",
            nargs="?",  # required: checked after parsing, to say what took it (see main)
            help="a recording of ours, a video file, or an openpilot route segment directory "
            "(its dcamera.hevc, with the frame ids and timestamps of its rlog)",
        )
    add_setting_arguments(parser, command)
    add_log_format(parser)
    parser.add_argument(
        "--summary-json",
        metavar="PATH",
        help="write the run's summary to PATH as one JSON document as the command ends, "
        "however it ends (a file there is replaced) (default: none)",
    )
    if command == "replay":
        add_compare_arguments(parser)


def add_setting_arguments(
    parser: argparse.ArgumentParser,
    command: str,
    *,
    without: frozenset[str] = frozenset(),
    defaults: dict[str, Any] | None = None,
    shown: dict[str, str] | None = None,
) -> None:
    """One option per setting of the service that ``command`` takes, but the ones named in
    ``without`` (generated from its declaration, its default shown: the declared one, or the
    one ``defaults`` gives, which the parsed options then hold, or what ``shown`` says of it)."""
    for item, declared in settings():
        flag = _flag(item, declared)
        if not flag or command not in declared.commands or item.name in without:
            continue  # set through another setting's flag, or not by this command
        given = (defaults or {}).get(item.name)
        default = _shown(item, declared) if given is None else str(given)
        text = f"{declared.help} (default: {(shown or {}).get(item.name, default)})"
        if isinstance(item.default, bool):
            parser.add_argument(flag, dest=item.name, action="store_true", help=text)
            continue
        nargs: int | str | None = len(declared.together) if declared.together else None
        parser.add_argument(
            flag,
            dest=item.name,
            default=declared.command_line_default if given is None else given,
            metavar=declared.metavar or _METAVARS.get(declared.parse),
            choices=declared.choices,
            nargs="?" if declared.bare is not None else nargs,
            const=declared.bare,
            help=text,
        )


def add_log_format(parser: argparse.ArgumentParser) -> None:
    """``--log-format``: how log events are written to standard error."""
    parser.add_argument(
        "--log-format",
        choices=("console", "json"),
        default="console",
        help="how log events are written to standard error (default: console)",
    )


def single_value_flags() -> set[str]:
    """The flags of ``run`` and ``replay`` that take one value (which may begin with ``-``); a
    flag whose value may be left out is not one of them."""
    flags = {"--log-format", "--summary-json", "--compare", "--tolerance", "--max-disagreement"}
    for item, declared in settings():
        if not isinstance(item.default, bool) and not declared.together and declared.bare is None:
            flags.add(_flag(item, declared))
    return flags - {""}


def config_from(args: argparse.Namespace, **fixed: Any) -> ServiceConfig:
    """The config the parsed options say (the ones not given keep their defaults; ``fixed``:
    settings the command sets itself); :class:`ValueError` for a value that does not parse or
    check."""
    given: dict[str, Any] = {}
    for item, declared in settings():
        value = getattr(args, item.name, None)
        if value is None or value is False:
            continue
        if declared.together:
            given.update(zip(declared.together, value, strict=True))
        else:
            given[item.name] = value
    return ServiceConfig(**given, **fixed)


def _flag(item: dataclasses.Field[Any], declared: Setting) -> str:
    return declared.flag if declared.flag is not None else "--" + item.name.replace("_", "-")


def flag_of(setting_name: str) -> str | None:
    """The command-line flag that sets ``setting_name`` (None: no flag does)."""
    for item, declared in settings():
        if item.name == setting_name or setting_name in declared.together:
            return _flag(item, declared) or None
    return None


def _shown(item: dataclasses.Field[Any], declared: Setting) -> str:
    if declared.command_line_default is not None:
        return declared.command_line_default
    if declared.shown is not None:
        return declared.shown
    defaults = [getattr(_DEFAULTS, name) for name in declared.together or (item.name,)]
    return " ".join(str(value) for value in defaults)


@dataclass
class _Served:
    """What the service left, however ``_serve`` ended: the service (once made), when it ended
    on the loop's clock, and its messages by frameId when they are compared (``--compare``)."""

    service: DmsService | None = None
    ended: float | None = None
    compared: dict[int, DriverStateV2] | None = None


async def _serve(
    config: ServiceConfig,
    stopping: Stopping,
    source: AsyncIterable[Frame] | None,
    served: _Served,
    console: Console | None,
) -> None:
    """Run the service until it has ended: by itself, or stopped by a signal
    (``stopping.requested`` then); its progress drawn on ``console``, if given."""
    service = served.service = DmsService(config, source=source)
    messages = service.messages() if served.compared is not None else None  # from the first
    loop = asyncio.get_running_loop()  # the command line runs on asyncio
    scope = anyio.CancelScope()

    def stop() -> None:
        loop.call_soon_threadsafe(scope.cancel)

    try:
        with stopping.calling(stop):
            with scope:
                comparing = (
                    collecting(messages, served.compared)
                    if messages is not None and served.compared is not None
                    else contextlib.nullcontext()
                )
                async with comparing, service, anyio.create_task_group() as tg:
                    for line in (await service.started()).lines():
                        print(line, file=sys.stderr)  # where it listens, as bound
                    if console is not None:
                        label = "replay" if config.mode is Mode.REPLAY else "run"
                        tg.start_soon(follow_progress, service, ProgressDisplay(console, label))
                    await service.finished()
                    tg.cancel_scope.cancel()
    finally:
        served.ended = now()


def _summary_path(text: str | None, config: ServiceConfig) -> Path | None:
    """Where ``--summary-json`` writes (None: nowhere); :class:`ValueError` for a path that
    cannot be written, or one the run reads or writes itself (:func:`_run_files`)."""
    if text is None:
        return None
    if not text:
        raise ValueError("--summary-json: expected a file path, got ''")
    path = Path(text)
    writable_file("--summary-json", path)
    for flag, other in _run_files(config).items():
        if other is not None and path.resolve() == other.resolve():
            raise ValueError(f"--summary-json {shown_path(text)} is the {flag} file")
    return path


def _run_files(config: ServiceConfig) -> dict[str, Path | None]:
    """The files the run reads or writes, by the option that names them."""
    return {
        "--camera": config.camera.path if isinstance(config.camera, CameraFile) else None,
        "--model": config.model,
        **{
            flag_of(kind.setting) or kind.setting: kind.file(config)
            for kind in SINKS
            if kind.writes_file
        },
    }


def _ending(
    summary: Summary, stopping: Stopping, command: str
) -> tuple[int, str | None, str | None]:
    """How the run ended: its exit code, what stopped it (None: it ended by itself), why it
    failed (None: it did not)."""
    stopped = "signal" if stopping.requested else None
    if summary.reader_closed is not None:
        stopped = "standard output closed by its reader"
    if stopped is not None:
        return stopped_exit_code(command), stopped, None
    if summary.sink_error is not None:
        return ExitCode.FAILED, None, f"a sink failed: {summary.sink_error}"
    if summary.camera_error is not None:
        return ExitCode.FAILED, None, f"the camera failed: {summary.camera_error}"
    if summary.frames.valid == 0:
        return ExitCode.FAILED, None, "not one frame was valid"
    return ExitCode.OK, None, None


def main(args: argparse.Namespace, stopping: Stopping) -> int:
    """``aio-dms run`` or ``aio-dms replay INPUT``, as ``args`` say: the exit code."""
    if args.command != "replay":
        return run(args, stopping)
    if args.input is None:
        bare = next(d.bare for item, d in settings() if item.name == "cereal_zmq")
        taken = getattr(args, "cereal_zmq", None)
        hint = (
            f" (--cereal-zmq took {taken!r} as its host: write --cereal-zmq=HOST, or put INPUT "
            "before it)"
            if taken not in (None, bare)
            else ""
        )
        return _refused(f"INPUT is required{hint}")
    if args.input == "synthetic":
        return _refused(
            "INPUT is a recording, a video file or a route segment, not the synthetic camera"
        )
    return run(args, stopping, camera=args.input, mode=Mode.REPLAY)


def _refused(message: str) -> int:
    print(f"aio-dms replay: {message}", file=sys.stderr)
    return ExitCode.REFUSED


def run(
    args: argparse.Namespace,
    stopping: Stopping,
    *,
    source: AsyncIterable[Frame] | None = None,
    **fixed: Any,
) -> int:
    """Run the service as ``args`` say (``source``, ``fixed``: what the command sets itself);
    where it listens at the start, on standard error (``health: http://HOST:PORT/``, ``zmq:
    ADDRESS``, ``cereal driverStateV2: tcp://HOST:45495``); the summary at the end, on standard
    output (standard error when the messages go there), and as a JSON document where
    ``--summary-json`` says; the exit code. A signal before the service has started raises
    :class:`~pipelines.stopping.Interrupted` (the entry point reports it, with
    :func:`~pipelines.dms.summary.record_before_start`)."""
    command = f"aio-dms {args.command}"
    configure_logging(args.log_format)
    try:
        config = config_from(args, **fixed)  # the machine's side is checked as the service starts
        summary_json = _summary_path(getattr(args, "summary_json", None), config)
        taken = {**_run_files(config), "--summary-json": summary_json}
        comparing = compare_request(args, config, taken) if args.command == "replay" else None
    except ValueError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return ExitCode.REFUSED
    facts = RunFacts(
        args.command,
        run_id=config.run_id,
        input=str(config.camera),
        device=config.device.value,
        model=str(config.model) if config.model is not None else "reference",
    )
    out = sys.stderr if config.jsonl == "-" else sys.stdout
    served = _Served(compared=None if comparing is None else {})
    console = progress_console(config, sys.stderr, sys.stdout)
    try:
        anyio.run(_serve, config, stopping, source, served, console)
    except StartupError as exc:
        flag = flag_of(exc.setting) if exc.setting else None
        print(f"{command}: {exc}" + (f" [{flag}]" if flag else ""), file=sys.stderr)
        return ExitCode.REFUSED
    except Exception as exc:  # a fault of ours: whatever summary there is, then the traceback
        if served.service is not None and summary_json is not None:
            failed = dataclasses.replace(
                facts,
                run_id=served.service.run_id,
                exit_code=ExitCode.FAILED,
                error=_described(exc),
            )
            _write(command, summary_json, _summary_record(served.service.summary, failed))
        raise
    assert served.service is not None
    summary = served.service.summary
    summary.frames.check()
    code, stopped, error = _ending(summary, stopping, args.command)
    facts = dataclasses.replace(
        facts, run_id=served.service.run_id, exit_code=code, stopped=stopped, error=error
    )
    record = _summary_record(summary, facts, ended=served.ended)
    if summary.reader_closed is not None:
        out = sys.stderr
    written = summary_json is None or _write(command, summary_json, record)
    _print_summary(format_record(record), out)
    if error is not None:
        print(f"{command}: {error}", file=sys.stderr)
    if comparing is not None and served.compared is not None and code == ExitCode.OK:
        code = _compared(command, comparing, served.compared, out)
    if not written:
        return ExitCode.FAILED if code == ExitCode.OK else code
    return code


def _compared(
    command: str, request: CompareRequest, ours: dict[int, DriverStateV2], out: TextIO
) -> int:
    """The comparison's table on ``out``, its document written; the exit code it makes."""
    try:
        result, beyond = written_comparison(request, ours)
    except OSError as exc:
        print(f"{command}: the comparison could not be written to {request.output}: {exc}",
              file=sys.stderr)  # fmt: skip
        return ExitCode.FAILED
    _print_summary(result.table(), out)
    for line in beyond:
        print(f"{command}: differs from openpilot's: {line}", file=sys.stderr)
    return ExitCode.DIFFERS if beyond else ExitCode.OK


def _print_summary(text: str, out: TextIO) -> None:
    """The summary on ``out``; on standard error when ``out``'s reader has gone (a closed pipe:
    standard output then goes nowhere, so that the interpreter's last flush of it is quiet)."""
    try:
        print(text, file=out, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        print(text, file=sys.stderr)


def _described(exc: BaseException) -> str:
    """``exc`` in one line, a group by its first error."""
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _described(exc.exceptions[0])
    return f"{type(exc).__name__}: {exc}"


def _write(command: str, path: Path, record: RunSummaryRecord) -> bool:
    """Write the summary document; False (said on standard error) if it could not be."""
    try:
        write_summary_json(path, record)
    except OSError as exc:
        print(f"{command}: the summary could not be written to {path}: {exc}", file=sys.stderr)
        return False
    return True


def _summary_record(
    summary: Summary, facts: RunFacts, *, ended: float | None = None
) -> RunSummaryRecord:
    """``summary`` as the ``--summary-json`` document. ``ended``: the service's end on the
    clock of its transitions (the loop's), up to which the last state's time counts (None: up to
    the last change)."""
    frames = summary.frames
    ages = [summary.latency_ms(q) for q in (50, 90, 99, 100)]
    p50, p90, p99, most = (None if math.isnan(age) else age for age in ages)
    invalid = dict(frames.invalid.most_common())
    dropped = dict(sorted(frames.dropped.items()))
    return build_record(
        facts,
        FrameCounts(
            received=frames.received,
            published=frames.valid + sum(invalid.values()),
            valid=frames.valid,
            late=frames.late,
            invalid=sum(invalid.values()),
            dropped=sum(dropped.values()),
        ),
        invalid,
        dropped,
        FrameAgeMs(p50=p50, p90=p90, p99=p99, max=most),
        summary.transitions,
        ended,
        [
            SinkRecord(
                name=sink.name,
                published=sink.published,
                delivered=sink.delivered,
                dropped=sink.dropped,
                failed=sink.failed,
                closedByReader=sink.closed_by_reader,
            )
            for sink in summary.sinks
        ],
    )
