"""``aio-dms run`` (and ``aio-dms replay``): the DMS service from the command line, with a summary
at the end and the exit codes of :class:`~pipelines.exit_codes.ExitCode`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from collections.abc import AsyncIterable, Callable
from typing import Any, TextIO

import anyio

from aio_runtime import configure_logging

from ..exit_codes import ExitCode, stopped_exit_code
from ..stopping import Stopping
from .camera import Frame
from .config import Mode, ServiceConfig, Setting, settings
from .config_values import integer, number
from .run_summary import format_summary
from .service import DmsService, StartupError, Summary

__all__ = [
    "add_arguments",
    "config_from",
    "flag_of",
    "format_summary",
    "run",
    "single_value_flags",
]

_DEFAULTS = ServiceConfig()
_METAVARS: dict[Callable[[str], Any] | None, str] = {number: "SECONDS", integer: "N"}
"""The metavar of a setting parsed by one of these, where it declares none."""


def add_arguments(parser: argparse.ArgumentParser, command: str = "run") -> None:
    """``aio-dms COMMAND``'s options: one per setting of the service that the command takes
    (generated from its declaration, its default shown), and the log format."""
    for item, declared in settings():
        flag = _flag(item, declared)
        if not flag or command not in declared.commands:
            continue  # set through another setting's flag, or not by this command
        text = f"{declared.help} (default: {_shown(item, declared)})"
        if isinstance(item.default, bool):
            parser.add_argument(flag, dest=item.name, action="store_true", help=text)
            continue
        parser.add_argument(
            flag,
            dest=item.name,
            default=declared.command_line_default,
            metavar=declared.metavar or _METAVARS.get(declared.parse),
            choices=declared.choices,
            nargs=len(declared.together) if declared.together else None,
            help=text,
        )
    parser.add_argument(
        "--log-format",
        choices=("console", "json"),
        default="console",
        help="how log events are written to standard error (default: console)",
    )


def single_value_flags() -> set[str]:
    """The flags of ``run`` and ``replay`` that take one value (which may begin with ``-``)."""
    flags = {"--log-format"}
    for item, declared in settings():
        if not isinstance(item.default, bool) and not declared.together:
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


async def _serve(
    config: ServiceConfig, stopping: Stopping, source: AsyncIterable[Frame] | None
) -> Summary:
    """The service's summary once it has ended: by itself, or stopped by a signal
    (``stopping.requested`` then)."""
    service = DmsService(config, source=source)
    loop = asyncio.get_running_loop()  # the command line runs on asyncio
    scope = anyio.CancelScope()

    def stop() -> None:
        loop.call_soon_threadsafe(scope.cancel)

    with stopping.calling(stop):
        with scope:
            async with service, anyio.create_task_group() as tg:
                for line in (await service.started()).lines():
                    print(line, file=sys.stderr)  # where it listens, as bound
                if config.mode is Mode.REPLAY and sys.stderr.isatty():
                    tg.start_soon(_show_progress, service, sys.stderr)
                await service.finished()
                tg.cancel_scope.cancel()
    return service.summary


async def _show_progress(service: DmsService, stream: TextIO, every: float = 0.5) -> None:
    """A replay's progress on one line of a terminal, redrawn as messages are published (at most
    every ``every`` seconds): frames so far (of how many, where the file says), frames/s."""
    started = shown = time.monotonic()
    try:
        async for _ in service.messages():
            at = time.monotonic()
            if at - shown < every:
                continue
            shown = at
            frames = service.summary.frames
            total = service.source_length
            done = f"{frames.received}" + (
                f"/{total} ({100 * frames.received / total:.0f} %)" if total else ""
            )
            rate = frames.received / max(at - started, 1e-9)
            stream.write(f"\rreplay: {done} frames, {rate:.0f} frames/s, {frames.valid} valid ")
            stream.flush()
    finally:
        stream.write("\n")
        stream.flush()


def run(
    args: argparse.Namespace,
    stopping: Stopping,
    *,
    source: AsyncIterable[Frame] | None = None,
    **fixed: Any,
) -> int:
    """Run the service as ``args`` say (``source``, ``fixed``: what the command sets itself);
    where it listens at the start, on standard error (``health: http://HOST:PORT/``, ``zmq:
    ADDRESS``); the summary at the end, on standard output (standard error when the messages go there);
    the exit code. A signal before the service has started raises
    :class:`~pipelines.stopping.Interrupted` (the entry point reports it, with
    :func:`~pipelines.dms.run_summary.summary_before_start`)."""
    command = f"aio-dms {args.command}"
    configure_logging(args.log_format)
    try:
        config = config_from(args, **fixed)  # the machine's side is checked as the service starts
    except ValueError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return ExitCode.REFUSED
    out = sys.stderr if config.jsonl == "-" else sys.stdout
    try:
        summary = anyio.run(_serve, config, stopping, source)
    except StartupError as exc:
        flag = flag_of(exc.setting) if exc.setting else None
        print(f"{command}: {exc}" + (f" [{flag}]" if flag else ""), file=sys.stderr)
        return ExitCode.REFUSED
    summary.frames.check()
    stopped = "signal" if stopping.requested else None
    if summary.reader_closed is not None:
        stopped = "standard output closed by its reader"
        out = sys.stderr
    print(format_summary(summary, stopped=stopped), file=out)
    if stopped is not None:
        return stopped_exit_code(args.command)
    if summary.sink_error is not None:
        print(f"{command}: a sink failed: {summary.sink_error}", file=sys.stderr)
        return ExitCode.FAILED
    if summary.camera_error is not None:
        print(f"{command}: the camera failed: {summary.camera_error}", file=sys.stderr)
        return ExitCode.FAILED
    if summary.frames.valid == 0:
        print(f"{command}: not one frame was valid", file=sys.stderr)
        return ExitCode.FAILED
    return ExitCode.OK
