"""openpilot's log as a sink: every published message's cereal Events, written as openpilot
writes its logs, so that its own tools (``LogReader``, ``plotjuggler``) read what we publish.

The file holds each message's Events (:func:`~pipelines.dms.openpilot.events.events_of`:
``driverStateV2`` for a frame, then ``dmsStatus``), standard unpacked capnp messages
concatenated, in the order published. Its name decides its compression
(:func:`~pipelines.dms.openpilot.logs.compression_of`), as openpilot's reader does:

- ``.zst``: one zstd stream (level 10, as openpilot's logger), a block flushed
  (``COMPRESSOBJ_FLUSH_BLOCK``) every time the writer has written what it held, and the frame
  ended as the sink closes. Every flushed block ends on a message's last Event, so a writer killed
  at any moment leaves a log that :func:`~pipelines.dms.openpilot.logs.read_log` (and openpilot's
  reader) reads whole Events from: every message delivered, in order.
- ``.bz2``: one bz2 stream (level 9), readable only once the sink has closed (bz2 cannot flush
  its input short of ending the stream).
- no extension: plain (openpilot's reader takes only these three spellings: name it ``rlog``).

**Delivered** means readable from the file: a message counts delivered once the bytes that carry
all of its Events are written — plain, its Events; zstd, the flushed block that ends with them;
bz2, the stream's end, written at close (until then every message of a bz2 log is pending; a bz2
log whose end could not be written is dropped whole). The writer is a thread of the sink's own
(:class:`~.file.FileSink`), which takes everything held at once; the policy of the file
sinks applies (see :mod:`.base`): live, at most ``backlog`` messages wait (200, 10 s at
20 Hz), then the oldest is dropped, counted; replaying, nothing is lost (``await sink.room()``).
A write that fails (a full disk) fails the sink (:class:`~.base.SinkFailed`).

A path that exists — a file, a FIFO, a device — is refused (a log is never appended to nor
overwritten), so is a name with another extension and one that cannot be created (a missing
directory, a directory, no permission): a :class:`ValueError` in one line, at construction.
"""

from __future__ import annotations

import bz2
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.kinds import Mode
from ..messages import DriverStateV2
from ..openpilot.events import events_of
from ..openpilot.logs import compression_of
from .base import LIVE_BACKLOG, check_backlog
from .file import FileSink, PlainStream, StreamEncoder, open_for_writing

if TYPE_CHECKING:
    from ..config.settings import ServiceConfig
    from . import Rows

__all__ = ["BZ2_LEVEL", "ZSTD_LEVEL", "RlogSink", "open_sinks"]

ZSTD_LEVEL = 10
"""openpilot's logger compresses at zstd level 10."""
BZ2_LEVEL = 9
_CHUNK = 1 << 20
"""Bytes per write: a log goes to a regular file, written in large pieces."""


class RlogSink(FileSink[bytes]):
    """Every published message's Events to the new file ``path``, compressed by its name; see
    the module's description for the format, what counts as delivered, and the policy."""

    def __init__(
        self,
        path: str | Path,
        *,
        delivery: Mode = Mode.LIVE,
        backlog: int = LIVE_BACKLOG,
        name: str | None = None,
    ) -> None:
        path = Path(path)
        name = name or f"rlog {path}"
        try:
            compression = compression_of(path)
        except ValueError as exc:
            raise ValueError(f"{name}: {str(exc).split(': ', 1)[-1]}") from None
        check_backlog(backlog)
        encoder = _encoder(compression)
        fd = open_for_writing(path, name, new=True)
        super().__init__(
            fd,
            name=name,
            delivery=delivery,
            backlog=backlog,
            encoder=encoder,
            batch=True,
            chunk=_CHUNK,
        )
        self.compression = compression
        """``"zstd"``, ``"bz2"`` or None (plain)."""

    def _record(self, message: DriverStateV2) -> bytes:
        return b"".join(event for _, event in events_of(message))


def _encoder(compression: str | None) -> StreamEncoder[bytes]:
    if compression == "zstd":
        return _ZstdStream()
    if compression == "bz2":
        return _Bz2Stream()
    return PlainStream()


class _ZstdStream:
    """One zstd frame: what each write takes is flushed as a block of it."""

    held = 0

    def __init__(self) -> None:
        import zstandard

        self._flush_block = zstandard.COMPRESSOBJ_FLUSH_BLOCK
        self._compressor: Any = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compressobj()

    def encode(self, records: Sequence[bytes]) -> bytes:
        data: bytes = self._compressor.compress(b"".join(records))
        flushed: bytes = self._compressor.flush(self._flush_block)
        return data + flushed

    def end(self) -> bytes:
        ending: bytes = self._compressor.flush()
        return ending


class _Bz2Stream:
    """One bz2 stream: what it takes is out only once it ends."""

    def __init__(self) -> None:
        self._compressor = bz2.BZ2Compressor(BZ2_LEVEL)
        self.held = 0
        """Every message taken, until the stream ends."""

    def encode(self, records: Sequence[bytes]) -> bytes:
        self.held += len(records)
        return self._compressor.compress(b"".join(records))

    def end(self) -> bytes:
        self.held = 0
        return self._compressor.flush()


def open_sinks(config: ServiceConfig, rows: Rows) -> list[RlogSink]:
    """The sink ``--rlog`` asks for, its file made."""
    assert config.rlog is not None
    return [RlogSink(config.rlog, delivery=config.mode)]
