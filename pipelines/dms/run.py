"""``aio-dms run``: the DMS service from the command line, with a summary at the end."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from typing import Any

import anyio

from aio_runtime import configure_logging

from .config import ServiceConfig, Setting, settings
from .service import DmsService, Summary

__all__ = ["add_arguments", "config_from", "format_summary", "run"]

_DEFAULTS = ServiceConfig()
_METAVARS: dict[object, str] = {float: "SECONDS", int: "N"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``aio-dms run``'s options: one per setting of the service (generated from its
    declaration, its default shown), and the log format."""
    for item, declared in settings():
        flag = _flag(item, declared)
        if not flag:
            continue  # set through another setting's flag
        text = f"{declared.help} (default: {_shown(item, declared)})"
        if isinstance(item.default, bool):
            parser.add_argument(flag, dest=item.name, action="store_true", help=text)
            continue
        parser.add_argument(
            flag,
            dest=item.name,
            default=declared.command_line_default,
            metavar=declared.metavar or _METAVARS.get(declared.parse, None),
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


def config_from(args: argparse.Namespace) -> ServiceConfig:
    """The config the parsed options say (the ones not given keep their defaults);
    :class:`ValueError` for a value that does not parse or check."""
    given: dict[str, Any] = {}
    for item, declared in settings():
        value = getattr(args, item.name, None)
        if value is None or value is False:
            continue
        if declared.together:
            given.update(zip(declared.together, value, strict=True))
        else:
            given[item.name] = value
    return ServiceConfig(**given)


def _flag(item: dataclasses.Field[Any], declared: Setting) -> str:
    return declared.flag if declared.flag is not None else "--" + item.name.replace("_", "-")


def _shown(item: dataclasses.Field[Any], declared: Setting) -> str:
    if declared.command_line_default is not None:
        return declared.command_line_default
    if declared.shown is not None:
        return declared.shown
    defaults = [getattr(_DEFAULTS, name) for name in declared.together or (item.name,)]
    return " ".join(str(value) for value in defaults)


def format_summary(summary: Summary) -> str:
    frames = summary.frames
    lines = [
        "",
        "summary",
        f"  frames received      {frames.received}",
        f"  published valid      {frames.valid}",
        f"  published invalid    {sum(frames.invalid.values())}",
    ]
    for reason, count in frames.invalid.most_common():
        lines.append(f"    {count:5d}  {reason[:100]}")
    lines.append(f"  dropped              {sum(frames.dropped.values())}")
    for stage, count in sorted(frames.dropped.items()):
        lines.append(f"    {count:5d}  at {stage}")
    lines.append(
        "  frame age ms         "
        f"p50 {summary.latency_ms(50):.1f}  p99 {summary.latency_ms(99):.1f}  "
        f"max {summary.latency_ms(100):.1f}"
    )
    lines.append("  availability")
    start = summary.transitions[0][0] if summary.transitions else 0.0
    for when, state in summary.transitions:
        lines.append(f"    {when - start:8.3f} s  {state[:110]}")
    return "\n".join(lines)


def run(args: argparse.Namespace, *, out: Any = None) -> int:
    configure_logging(args.log_format, stream=sys.stderr)
    try:
        config = config_from(args)
        config.check_environment()
    except ValueError as exc:
        print(f"aio-dms run: {exc}", file=sys.stderr)
        return 2

    async def main() -> Summary:
        async with DmsService(config) as service:
            async with anyio.create_task_group() as tg:

                async def stop_on_signal() -> None:
                    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                        async for _ in signals:
                            tg.cancel_scope.cancel()
                            return

                tg.start_soon(stop_on_signal)
                await service.finished()
                tg.cancel_scope.cancel()
            return service.summary

    summary = anyio.run(main)
    summary.frames.check()
    print(format_summary(summary), file=out or sys.stdout)
    if summary.camera_error is not None:
        print(f"aio-dms run: the camera failed: {summary.camera_error}", file=sys.stderr)
        return 1
    return 0
