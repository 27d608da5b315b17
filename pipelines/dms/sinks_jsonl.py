"""The JSON lines sink: one record per line, to a file, a pipe or FIFO, or standard output.

Lines are written by a thread of the sink's own, so a slow disk or a stalled reader never blocks
the event loop. Each line is delivered once written whole (``os.write`` of at most ``PIPE_BUF``
bytes at a time, after ``poll`` says there is room: a line of up to 4 KiB reaches a pipe at once
or not at all). Policy (see :mod:`.sinks_policy`):

- live: at most ``backlog`` lines wait (default 200, 10 s at 20 Hz); past that the oldest is
  dropped (latest wins), counted and logged (when dropping starts and when it stops);
- replay: nothing is dropped; ``await sink.room()`` returns once fewer than ``backlog`` wait.

A write that fails — a full disk (``/dev/full``), a pipe whose reader went away, a closed file —
ends the sink: :meth:`JsonLinesSink.failure` is a :class:`~.sinks_policy.SinkFailed`, logged once,
and :meth:`JsonLinesSink.wait_failure` returns it at once; what was held, and everything published
after, is dropped (counted). Standard output closed by its reader (``| head``) is a
:class:`~.sinks_policy.ReaderClosed` instead: an end, not a failure. A regular file that exists
is refused unless ``append=True`` (then appended to): the lines of one run are never mixed into
another's by accident. A path that cannot be opened for writing (a missing directory, a directory,
no permission, a FIFO that no one reads, a file that exists) is a :class:`ValueError` at
construction, in one line; FIFOs and devices are written to as they are.

:meth:`JsonLinesSink.close` lets the thread write what is held for at most ``timeout`` seconds and
counts the rest as dropped; one exception to exactness: a write the kernel itself holds (a
terminal stopped with XOFF, a hung network file system) cannot be interrupted: that line is
counted dropped although it may still appear.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import sys
import threading
from collections import deque
from pathlib import Path

import anyio.to_thread

from aio_runtime import get_logger

from .config import Mode
from .messages import DriverStateV2
from .sinks_policy import (
    DRAIN_TIMEOUT,
    LIVE_BACKLOG,
    DropLog,
    ReaderClosed,
    SinkError,
    SinkFailed,
    SinkStats,
    Waiters,
    check_backlog,
)

__all__ = ["JsonLinesSink"]

_log = get_logger(__name__)

_CHUNK = select.PIPE_BUF
_ABORT_WAIT = 1.0
"""Seconds close waits for the writer to stop once told to (it wakes from ``poll`` at once)."""
_READER_GONE = (errno.EPIPE, errno.ECONNRESET)


class _Aborted(Exception):
    """The writer was told to stop mid-line (closing past its bound)."""


class JsonLinesSink:
    """One JSON record per line to ``path`` (``"-"``: standard output); see the module's
    description for the policy, failures and closing."""

    def __init__(
        self,
        path: str | Path,
        *,
        delivery: Mode = Mode.LIVE,
        backlog: int = LIVE_BACKLOG,
        name: str | None = None,
        append: bool = False,
    ) -> None:
        self._backlog = check_backlog(backlog)
        self._delivery = delivery
        self._stdout = str(path) == "-"
        self._name = name or f"jsonl {path}"
        self._fd = (
            _open_stdout(self._name)
            if self._stdout
            else _open_path(Path(path), self._name, append=append)
        )
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._lines: deque[bytes] = deque()
        self._writing = False
        self._published = self._delivered = self._dropped = 0
        self._failure: SinkError | None = None
        self._closing = False
        """No more lines are taken; the writer finishes what is held."""
        self._abort = False
        """The writer stops now."""
        self._finished = False
        """The counts are final."""
        self._writer_done = False
        self._released = False
        self._room = Waiters()
        self._changes = Waiters()
        self._drops = DropLog(self._name, backlog=self._backlog)
        self._thread = threading.Thread(target=self._write_lines, name=self._name, daemon=True)
        self._thread.start()

    @property
    def name(self) -> str:
        return self._name

    @property
    def delivery(self) -> Mode:
        return self._delivery

    def publish(self, message: DriverStateV2) -> None:
        line = (message.to_json() + "\n").encode()
        live = self._delivery is Mode.LIVE
        with self._lock:
            self._published += 1
            if self._failure is not None or self._closing:
                self._dropped += 1
                return
            overflow = live and len(self._lines) >= self._backlog
            if overflow:
                self._lines.popleft()  # the oldest goes: latest wins
                self._dropped += 1
            caught_up = len(self._lines) <= self._backlog // 2
            self._lines.append(line)
            self._ready.notify()
        if overflow:
            self._drops.dropped(why="the reader is behind")
        elif live and caught_up:
            self._drops.delivering()

    async def room(self) -> None:
        if self._delivery is Mode.LIVE:
            return
        await self._room.until(
            self._lock,
            lambda: bool(self._failure or self._closing or len(self._lines) < self._backlog),
        )

    def failure(self) -> SinkError | None:
        return self._failure

    async def wait_failure(self) -> SinkError | None:
        await self._changes.until(self._lock, lambda: self._failure is not None or self._finished)
        return self._failure

    def stats(self) -> SinkStats:
        with self._lock:
            return SinkStats(
                name=self._name,
                delivery=self._delivery,
                published=self._published,
                delivered=self._delivered,
                dropped=self._dropped,
                pending=len(self._lines) + self._writing,
                failed=None if isinstance(self._failure, ReaderClosed) else _text(self._failure),
                closed_by_reader=isinstance(self._failure, ReaderClosed),
            )

    def close(self, timeout: float = DRAIN_TIMEOUT) -> SinkStats:
        """Write what is held for at most ``timeout`` seconds (blocking), then count what is left
        as dropped and close the file (standard output itself stays open)."""
        with self._ready:
            self._closing = True
            self._ready.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._ready:
                self._abort = True
                self._ready.notify()
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
            self._thread.join(_ABORT_WAIT)
        with self._lock:
            first = not self._finished
            self._finished = True
            left = len(self._lines) + self._writing
            self._dropped += left
            self._lines.clear()
            self._writing = False
            release = self._writer_done
        if first:
            if left:
                self._drops.dropped(left, why="closed with lines not yet written")
            self._drops.delivering(why="closed")
            self._room.wake()
            self._changes.wake()
        if release:
            self._release()
        return self.stats()

    async def aclose(self, timeout: float = DRAIN_TIMEOUT) -> SinkStats:
        return await anyio.to_thread.run_sync(self.close, timeout)

    # -- the writer thread -------------------------------------------------------------------

    def _write_lines(self) -> None:
        poll = select.poll()
        poll.register(self._fd, select.POLLOUT)
        poll.register(self._wake_r, select.POLLIN)
        try:
            while True:
                with self._ready:
                    while not self._lines and not self._closing and not self._abort:
                        self._ready.wait()
                    if self._abort or not self._lines:
                        return
                    line = self._lines.popleft()
                    self._writing = True
                self._room.wake()
                try:
                    self._write(poll, line)
                except _Aborted:
                    return  # close counts the line
                except OSError as exc:
                    self._fail(exc)
                    return
                with self._lock:
                    if self._finished:
                        return  # close gave up on this line and counted it
                    self._writing = False
                    self._delivered += 1
        finally:
            with self._lock:
                self._writer_done = True
                release = self._finished
            if release:
                self._release()

    def _write(self, poll: select.poll, line: bytes) -> None:
        view = memoryview(line)
        while view:
            if self._abort:
                raise _Aborted
            ready = dict(poll.poll())
            if self._wake_r in ready:
                continue  # told to stop: seen above
            try:
                written = os.write(self._fd, view[:_CHUNK])
            except BlockingIOError:
                continue
            view = view[written:]

    def _fail(self, exc: OSError) -> None:
        if self._stdout and exc.errno in _READER_GONE:
            failure: SinkError = ReaderClosed(
                self._name, "standard output was closed by its reader"
            )
        else:
            code = errno.errorcode.get(exc.errno or 0, "?")
            failure = SinkFailed(self._name, f"write failed: {exc.strerror} ({code})")
        with self._lock:
            self._failure = failure
            self._dropped += len(self._lines) + self._writing
            self._lines.clear()
            self._writing = False
        if isinstance(failure, ReaderClosed):
            _log.info("sink ended: its reader closed standard output", sink=self._name)
        else:
            _log.error("sink failed", sink=self._name, error=str(failure))
        self._room.wake()
        self._changes.wake()

    def _release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        for fd in (self._fd, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _text(failure: SinkError | None) -> str | None:
    return None if failure is None else str(failure)


def _open_stdout(name: str) -> int:
    """A descriptor of our own for standard output (closing it leaves standard output open)."""
    try:
        fd = sys.stdout.fileno()
        sys.stdout.flush()  # what was printed before comes first
        return os.dup(fd)
    except (AttributeError, OSError, ValueError):
        raise ValueError(f"{name}: standard output is not an open file") from None


def _open_path(path: Path, name: str, *, append: bool) -> int:
    parent = path.parent
    if not parent.exists():
        raise ValueError(f"{name}: directory {parent} does not exist")
    if not parent.is_dir():
        raise ValueError(f"{name}: {parent} is not a directory")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        if not append:
            with contextlib.suppress(FileExistsError):  # a FIFO or a device: opened below
                return os.open(path, flags | os.O_EXCL, 0o644)
            if path.is_file():
                raise ValueError(f"{name}: the file exists (refused unless appending to it)")
        return os.open(path, flags, 0o644)
    except IsADirectoryError:
        raise ValueError(f"{name}: is a directory, expected a file to write") from None
    except PermissionError:
        raise ValueError(f"{name}: not writable (permission denied)") from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise ValueError(f"{name}: a FIFO that no one reads (start its reader first)") from None
        raise ValueError(f"{name}: cannot open for writing: {exc.strerror}") from None
