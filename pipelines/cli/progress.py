"""A command's progress on a terminal: one line on standard error, redrawn as frames go by —
frames done of how many (or seconds of the duration), the share of published frames that were
valid, and the availability now.

Shown only where someone watches and it cannot get in the way: for a replay or a bounded run
(``--frames``, ``--duration``), when standard error is a terminal, and not while the JSON lines go
to standard output on a terminal (the two would share the screen). Never on standard output.
Drawn with ``rich``; log lines written meanwhile go above the line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from ..dms.config.kinds import Mode
from ..dms.config.settings import ServiceConfig
from ..dms.sinks.base import SubscriptionStalled

if TYPE_CHECKING:
    from ..dms.service import DmsService

__all__ = ["ProgressDisplay", "Terminal", "follow_progress", "progress_console"]

REDRAW_EVERY = 0.1
"""Seconds between two redraws, at the most often."""


class Terminal(Protocol):
    def isatty(self) -> bool: ...


def progress_console(config: ServiceConfig, stderr: TextIO, stdout: Terminal) -> Console | None:
    """The console to draw the progress of a service run with ``config`` on (``stderr``), or
    None where there is to be none (see the module's description)."""
    bounded = config.mode is Mode.REPLAY or config.frames is not None or config.duration is not None
    if not bounded or not stderr.isatty():
        return None
    if config.jsonl == "-" and stdout.isatty():
        return None
    return Console(file=stderr)


class ProgressDisplay:
    """The progress line of one command (``label``) on ``console``: :meth:`update` as often as
    there is news (it redraws at most every ``every`` seconds of ``clock``), :meth:`close` at the
    end (the last figures drawn, the line ended)."""

    def __init__(
        self,
        console: Console,
        label: str,
        *,
        every: float = REDRAW_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._every = every
        self._clock = clock
        self._drawn: float | None = None
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[done]}"),
            TextColumn("{task.fields[valid]}"),
            TextColumn("{task.fields[availability]}"),
            TimeElapsedColumn(),
            console=console,
            auto_refresh=False,
            redirect_stdout=False,
        )
        self._task: TaskID = self._progress.add_task(
            label, total=None, done="", valid="", availability=""
        )
        self._progress.start()

    def update(
        self,
        *,
        frames: int,
        total_frames: int | None = None,
        seconds: float | None = None,
        total_seconds: float | None = None,
        valid: int = 0,
        published: int = 0,
        availability: str = "",
        force: bool = False,
    ) -> None:
        """News: ``frames`` done (of ``total_frames`` where known); or, for a run bounded in
        time, ``seconds`` of ``total_seconds``; ``valid`` of ``published``; the availability
        (as short as it can be said: the line is one line)."""
        now = self._clock()
        if not force and self._drawn is not None and now - self._drawn < self._every:
            return
        self._drawn = now
        total: float | None
        if total_seconds is not None and seconds is not None:
            done = f"{min(seconds, total_seconds):.1f}/{total_seconds:g} s, {frames} frames"
            completed, total = min(seconds, total_seconds), total_seconds
        else:
            done = f"{frames}/{total_frames} frames" if total_frames else f"{frames} frames"
            completed, total = frames, total_frames
        share = f"valid {100 * valid / published:.0f} %" if published else "valid -"
        self._progress.update(
            self._task,
            completed=completed,
            total=total,
            done=done,
            valid=share,
            availability=availability,
        )
        self._progress.refresh()

    def close(self) -> None:
        """End the line (the cursor shown again)."""
        self._progress.stop()


async def follow_progress(service: DmsService, display: ProgressDisplay) -> None:
    """Update ``display`` from ``service`` as it publishes, until cancelled (or, replaying, its
    subscription is closed for holding the replay); then draw the last figures and close it."""
    config, started = service.config, time.monotonic()

    def show(force: bool = False) -> None:
        frames = service.summary.frames
        total = service.source_length
        if config.frames is not None:
            total = config.frames if total is None else min(total, config.frames)
        display.update(
            frames=frames.received,
            total_frames=total,
            seconds=time.monotonic() - started if config.duration is not None else None,
            total_seconds=config.duration,
            valid=frames.valid,
            published=frames.valid + sum(frames.invalid.values()),
            availability=_availability(service),
            force=force,
        )

    try:
        async for _ in service.messages():
            show()
    except SubscriptionStalled:  # the loop held up for the stall limit: the line stops there
        pass
    finally:
        show(force=True)
        display.close()


def _availability(service: DmsService) -> str:
    """The state and, where there is one, its reason's kind: ``degraded (frame budget)``."""
    state = service.availability.state
    reason = f" ({state.reason.kind})" if state.reason is not None else ""
    return state.availability.value + reason
