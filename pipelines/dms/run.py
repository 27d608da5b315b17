"""``aio-dms run``: the DMS service from the command line, with a summary at the end."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

import anyio

from aio_runtime import configure_logging

from .config import add_arguments as add_settings
from .config import from_arguments
from .service import DmsService, Summary

__all__ = ["add_arguments", "format_summary", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``aio-dms run``'s options: one per setting of the service, and the log format."""
    add_settings(parser)
    parser.add_argument(
        "--log-format",
        choices=("console", "json"),
        default="console",
        help="how log events are written to standard error (default: console)",
    )


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
        config = from_arguments(args)
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
