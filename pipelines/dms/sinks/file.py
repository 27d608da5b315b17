"""What the file sinks share: records written to a descriptor by a thread of the sink's own.

:class:`FileSink` holds the records a subclass makes of each message (:meth:`FileSink._record`,
on the publisher's thread: bytes, or the message itself for an encoder that takes messages) and
writes them on its thread, so a slow disk or a stalled reader never blocks the event loop. The
writer takes one record at a time, or everything held at once (``batch``), hands what it took to
the sink's :class:`StreamEncoder` (a compressor, a table format, or the bytes as they are) and
writes what that gives (``os.write`` of at most ``chunk`` bytes at a time, after ``poll`` says
there is room). A record is *delivered* once the bytes that carry it are written: at once for an
encoder that gives out all it took, later for one that holds records (:attr:`StreamEncoder.held`:
bz2 until its stream's end, Parquet until a row group is full). An encoder that fails on what it
was given fails the sink as a write does. Policy (see :mod:`.base`):

- live: at most ``backlog`` records wait to be taken; past that the oldest is dropped (latest
  wins), counted and logged (when dropping starts and when it stops);
- replay: nothing is dropped; ``await sink.room()`` returns once fewer than ``backlog`` wait.

A write that fails — a full disk (``/dev/full``), a pipe whose reader went away, a closed file —
ends the sink: :meth:`FileSink.failure` is a :class:`~.base.SinkFailed`, logged once, and
:meth:`FileSink.wait_failure` returns it at once; what was held, and everything published after, is
dropped (counted). Standard output closed by its reader (``| head``) is a
:class:`~.base.ReaderClosed` instead: an end, not a failure.

:meth:`FileSink.close` lets the thread write what is held, then the stream's end, for at most
``timeout`` seconds and counts the rest as dropped; one exception to exactness: a write the kernel
itself holds (a terminal stopped with XOFF, a hung network file system) cannot be interrupted:
what it carries is counted dropped although it may still appear.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import os
import select
import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import anyio.to_thread

from aio_runtime import get_logger

from ..config.kinds import Mode
from ..messages import DriverStateV2
from .base import (
    DRAIN_TIMEOUT,
    LIVE_BACKLOG,
    CountingSink,
    DropLog,
    ReaderClosed,
    SinkError,
    SinkFailed,
    SinkStats,
    Waiters,
    check_backlog,
)

__all__ = ["FileSink", "PlainStream", "StreamEncoder", "open_for_writing"]

_log = get_logger(__name__)

_ABORT_WAIT = 1.0
"""Seconds close waits for the writer to stop once told to (it wakes from ``poll`` at once)."""
_READER_GONE = (errno.EPIPE, errno.ECONNRESET)

R = TypeVar("R")
"""What a file sink makes of a message: its record."""
R_contra = TypeVar("R_contra", contravariant=True)


class StreamEncoder(Protocol[R_contra]):
    """How the records a writer took become the bytes it writes; used on the writer's thread
    only."""

    @property
    def held(self) -> int:
        """How many of the records :meth:`encode` took the bytes it gave out do not carry yet
        (0 for an encoder that gives out all it took; :meth:`end` gives out the rest)."""

    def encode(self, records: Sequence[R_contra]) -> bytes:
        """The bytes that carry ``records`` (perhaps not all yet, for an encoder that holds)."""

    def end(self) -> bytes:
        """The stream's last bytes, written once everything held is written, as the sink
        closes."""


class PlainStream:
    """Records written as they are."""

    held = 0

    def encode(self, records: Sequence[bytes]) -> bytes:
        return b"".join(records)

    def end(self) -> bytes:
        return b""


class _Aborted(Exception):
    """The writer was told to stop mid-write (closing past its bound)."""


class FileSink(CountingSink, abc.ABC, Generic[R]):
    """Records written to ``fd`` (the sink owns it, and closes it) by a thread of the sink's own,
    each made into bytes by ``encoder``; see the module's description. A subclass says what
    record a message is (:meth:`_record`)."""

    def __init__(
        self,
        fd: int,
        *,
        name: str,
        encoder: StreamEncoder[R],
        delivery: Mode = Mode.LIVE,
        backlog: int = LIVE_BACKLOG,
        batch: bool = False,
        chunk: int = select.PIPE_BUF,
        stdout: bool = False,
    ) -> None:
        super().__init__(name, delivery)
        self._backlog = check_backlog(backlog)
        self._fd = fd
        self._encoder = encoder
        self._batch = batch
        self._chunk = chunk
        self._stdout = stdout
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._ready = threading.Condition(self._lock)
        self._records: deque[R] = deque()
        self._writing = 0
        """Records taken by the writer and not yet written."""
        self._encoded = 0
        """Records written into an encoder that holds them (:attr:`StreamEncoder.held`)."""
        self._closing = False
        """No more records are taken; the writer finishes what is held."""
        self._abort = False
        """The writer stops now."""
        self._finished = False
        """The counts are final."""
        self._writer_done = False
        self._ended = False
        """The stream's end was written (after everything taken)."""
        self._released = False
        self._room = Waiters()
        self._drops = DropLog(self._name, backlog=self._backlog)
        self._thread = threading.Thread(target=self._write_records, name=self._name, daemon=True)
        self._thread.start()

    @abc.abstractmethod
    def _record(self, message: DriverStateV2) -> R:
        """What the encoder takes of ``message`` (on the publisher's thread)."""

    def publish(self, message: DriverStateV2) -> None:
        record = self._record(message)
        live = self._delivery is Mode.LIVE
        with self._lock:
            self._published += 1
            if self._failure is not None or self._closing:
                self._dropped += 1
                return
            overflow = live and len(self._records) >= self._backlog
            if overflow:
                self._records.popleft()  # the oldest goes: latest wins
                self._dropped += 1
            caught_up = len(self._records) <= self._backlog // 2
            self._records.append(record)
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
            lambda: bool(self._failure or self._closing or len(self._records) < self._backlog),
        )

    def _pending(self) -> int:
        return self._held()

    def _counts_final(self) -> bool:
        return self._finished

    def _held(self) -> int:
        """Records published and not yet delivered nor dropped (under the lock)."""
        return len(self._records) + self._writing + self._encoded

    def close(self, timeout: float = DRAIN_TIMEOUT) -> SinkStats:
        """Write what is held, then the stream's end, for at most ``timeout`` seconds
        (blocking), then count what is left as dropped and close the file (standard output
        itself stays open)."""
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
            left = self._held()
            self._dropped += left
            self._records.clear()
            self._writing = self._encoded = 0
            release = self._writer_done
        if first:
            if left:
                self._drops.dropped(left, why="closed with messages not yet written")
            self._drops.delivering(why="closed")
            self._room.wake()
            self._changes.wake()
        if release:
            self._release()
        return self.stats()

    async def aclose(self, timeout: float = DRAIN_TIMEOUT) -> SinkStats:
        return await anyio.to_thread.run_sync(self.close, timeout)

    # -- the writer thread -------------------------------------------------------------------

    def _write_records(self) -> None:
        poll = select.poll()
        poll.register(self._fd, select.POLLOUT)
        poll.register(self._wake_r, select.POLLIN)
        try:
            while True:
                with self._ready:
                    while not self._records and not self._closing and not self._abort:
                        self._ready.wait()
                    if self._abort:
                        return
                    if not self._records:
                        break  # closing, everything taken: the stream's end follows
                    taken = self._take()
                    self._writing = len(taken)
                self._room.wake()
                if not self._written(poll, taken):
                    return
            self._ended = self._written(poll, [], end=True)
        finally:
            with self._lock:
                self._writer_done = True
                release = self._finished
            if release:
                self._release()

    def _take(self) -> list[R]:
        """The records the writer takes next (under the lock)."""
        if not self._batch:
            return [self._records.popleft()]
        taken = list(self._records)
        self._records.clear()
        return taken

    def _written(self, poll: select.poll, taken: list[R], *, end: bool = False) -> bool:
        """Encode ``taken`` and write it (``end``: write the stream's end); count what that
        delivered. False: the writer stops (it failed, or close gave up on it)."""
        try:
            data = self._encoder.end() if end else self._encoder.encode(taken)
        except Exception as exc:  # the encoder refused what it was given: as a failed write
            self._fail_with(SinkFailed(self._name, f"could not encode: {exc}"))
            return False
        try:
            self._write(poll, data)
        except _Aborted:
            return False  # close counts what was held
        except OSError as exc:
            self._fail(exc)
            return False
        with self._lock:
            if self._finished:
                return False  # close gave up on this write and counted it
            self._writing = 0
            held = self._encoder.held  # taken, and not carried yet by the bytes written
            self._delivered += self._encoded + len(taken) - held
            self._encoded = held
        return True

    def _write(self, poll: select.poll, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._abort:
                raise _Aborted
            ready = dict(poll.poll())
            if self._wake_r in ready:
                continue  # told to stop: seen above
            try:
                written = os.write(self._fd, view[: self._chunk])
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
        self._fail_with(failure)

    def _fail_with(self, failure: SinkError) -> None:
        with self._lock:
            self._failure = failure
            self._dropped += self._held()
            self._records.clear()
            self._writing = self._encoded = 0
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


def open_for_writing(path: Path, name: str, *, append: bool = False, new: bool = False) -> int:
    """A descriptor to write ``path`` (non-blocking, close-on-exec): a new file, or — unless
    ``new`` — a FIFO or a device as it is, and a regular file that exists only when ``append``
    (then appended to). :class:`ValueError` in one line, naming ``name``, for a path that cannot
    be opened so (a missing directory, a directory, no permission, a FIFO that no one reads, a
    file that exists)."""
    parent = path.parent
    if not parent.exists():
        raise ValueError(f"{name}: directory {parent} does not exist")
    if not parent.is_dir():
        raise ValueError(f"{name}: {parent} is not a directory")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        if new:
            return os.open(path, flags | os.O_EXCL, 0o644)
        if not append:
            with contextlib.suppress(FileExistsError):  # a FIFO or a device: opened below
                return os.open(path, flags | os.O_EXCL, 0o644)
            if path.is_file():
                raise ValueError(f"{name}: the file exists (refused unless appending to it)")
        return os.open(path, flags, 0o644)
    except FileExistsError:
        raise ValueError(f"{name}: exists (a new file is expected)") from None
    except IsADirectoryError:
        raise ValueError(f"{name}: is a directory, expected a file to write") from None
    except PermissionError:
        raise ValueError(f"{name}: not writable (permission denied)") from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise ValueError(f"{name}: a FIFO that no one reads (start its reader first)") from None
        raise ValueError(f"{name}: cannot open for writing: {exc.strerror}") from None
