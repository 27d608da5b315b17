"""``aio-dms record``: frames from any camera source the service takes — the synthetic camera, a
video file, a recording, an openpilot route segment — to a recording that ``aio-dms replay``
reads.

The source is taken as ``aio-dms run --camera`` takes it: at its own pace (a file at its frame
rate), its frames stamped as a live service sees them. Every option is checked before any frame is
taken: the camera as ``run`` checks it (a route segment is opened first: its log read), the count
(at least 1), the output (a new file, in a directory that exists: a recording is never
overwritten). A signal stops the recording with what was written kept whole; so does a camera
that fails.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
from rich.console import Console

from aio_runtime import configure_logging

from ..dms.config.kinds import CameraSpec
from ..dms.config.settings import ServiceConfig
from ..dms.config.values import writable_file
from ..dms.frames import open_camera, open_first
from ..dms.frames.frame import Frame
from ..dms.frames.recording import record_frames
from ..dms.frames.recording_reader import RecordingReader
from ..dms.frames.source import FrameSource, closing
from ..echo import shown_path
from ..exit_codes import ExitCode, stopped_exit_code
from ..stopping import Stopping
from .progress import ProgressDisplay
from .run import add_log_format

__all__ = ["add_arguments", "main", "single_value_flags"]


def add_arguments(parser: argparse.ArgumentParser, command: str = "record") -> None:
    """``aio-dms record``'s options."""
    parser.add_argument(
        "--camera",
        metavar="synthetic|PATH",
        default="synthetic",
        help="synthetic, a video file, a recording, or an openpilot route segment directory "
        "(default: synthetic)",
    )
    parser.add_argument(
        "--frames", metavar="N", required=True, help="how many frames to record (required)"
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        required=True,
        help="the recording to write: a new file, each frame compressed losslessly (zstd) "
        "(required)",
    )
    add_log_format(parser)


def single_value_flags() -> set[str]:
    """The options that take one value (which may begin with ``-``)."""
    return {"--camera", "--frames", "--output", "--log-format"}


def main(args: argparse.Namespace, stopping: Stopping) -> int:
    """Record as ``args`` say; a line on what was written; the exit code: 0 recorded (or the
    source ended first: it says so), 1 the camera failed, 2 refused before any frame was taken,
    130 stopped by a signal."""
    configure_logging(args.log_format)
    try:
        config = ServiceConfig(camera=args.camera, frames=args.frames)  # as `run` checks them
        config.check_environment()
        output = _new_file(args.output)
    except ValueError as exc:
        print(f"aio-dms record: {exc}", file=sys.stderr)
        return ExitCode.REFUSED
    assert config.frames is not None
    console = Console(file=sys.stderr) if sys.stderr.isatty() else None
    started = time.monotonic()
    try:
        failure = anyio.run(_record, config.camera, output, config.frames, stopping, console)
    except _Refused as exc:
        print(f"aio-dms record: {exc}", file=sys.stderr)
        return ExitCode.REFUSED
    seconds = time.monotonic() - started
    if stopping.requested and not output.exists():  # stopped as a route segment opened
        print("aio-dms record: stopped by a signal before the first frame", file=sys.stderr)
        return stopped_exit_code("record")
    try:
        with RecordingReader(output) as recording:  # whole, however the recording ended
            frames, raw = len(recording), sum(record.size for record in recording.records)
    except (OSError, ValueError) as exc:  # a write that failed part-way (a full disk)
        print(f"aio-dms record: {failure or 'the recording failed'}; {exc}", file=sys.stderr)
        return ExitCode.FAILED
    print(_said(frames, output.stat().st_size, raw, output, seconds))
    if stopping.requested:
        print(f"aio-dms record: stopped by a signal after {frames} frames", file=sys.stderr)
        return stopped_exit_code("record")
    if failure is not None:
        print(f"aio-dms record: the recording failed: {failure}", file=sys.stderr)
        return ExitCode.FAILED
    if frames < config.frames:
        print(
            f"aio-dms record: the camera ended after {frames} of {config.frames} frames",
            file=sys.stderr,
        )
    return ExitCode.OK


def _new_file(text: str) -> Path:
    if not text:
        raise ValueError("output: expected a file path, got ''")
    path = Path(text)
    writable_file("output", path)
    if path.exists():
        raise ValueError(f"output {shown_path(text)} exists: a recording is never overwritten")
    return path


class _Refused(Exception):
    """The camera, refused as it opened: before any frame was taken (one line, the reason)."""


async def _record(
    camera: CameraSpec, output: Path, frames: int, stopping: Stopping, console: Console | None
) -> str | None:
    """Record from ``camera`` until ``frames`` are written, the source ends or fails (returned:
    why), or a signal comes; the progress drawn on ``console``, if given. A route segment that
    cannot be replayed: :class:`_Refused`, before the output is made."""
    loop = asyncio.get_running_loop()  # the command line runs on asyncio
    scope = anyio.CancelScope()
    display = ProgressDisplay(console, "record") if console is not None else None
    taken = 0

    async def shown(source: FrameSource) -> AsyncIterator[Frame]:
        nonlocal taken
        async for frame in source:
            if display is not None:
                display.update(frames=taken, total_frames=frames)
            taken += 1
            yield frame

    def stop() -> None:
        loop.call_soon_threadsafe(scope.cancel)

    try:
        with stopping.calling(stop), scope:
            try:
                source = await open_first(camera) or open_camera(camera)
            except (ValueError, OSError) as exc:  # a segment's log, its video; or their bound
                raise _Refused(str(exc).splitlines()[0]) from exc
            async with closing(source):
                await record_frames(shown(source), output, frames=frames, exist_ok=False)
    except _Refused:
        raise
    except Exception as exc:  # a source that fails ends the recording, reported, not a crash
        return f"{type(exc).__name__}: {exc}"
    finally:
        if display is not None:
            display.update(frames=taken, total_frames=frames, force=True)
            display.close()
    return None


def _said(frames: int, size: int, raw: int, output: Path, seconds: float) -> str:
    if not frames:
        return f"recorded 0 frames to {output}"
    per_frame, raw_per_frame = size / frames, raw / frames
    return (
        f"recorded {frames} frames to {output}: {size / 1e6:.1f} MB, {per_frame / 1e3:.1f} kB a "
        f"frame ({raw_per_frame / 1e6:.1f} MB as NV12, {raw_per_frame / per_frame:.0f}x smaller), "
        f"{frames / max(seconds, 1e-9):.1f} frames/s"
    )
