"""Replayed frames as Parquet: one row per frame's message, one fixed schema, a file whole or none.

Every column is always there, with its type, so that the files of many recordings concatenate
into one dataset (:data:`PARQUET_COLUMNS`, :func:`parquet_schema`):

- ``recording`` (string): the input's name, given to the sink;
- ``runId`` (string), ``seq``, ``frameId`` (int64);
- ``valid`` (bool, ours: valid output and calibration, published within the staleness bound),
  ``late`` (bool: valid, published after the deadline) and ``eventValid`` (bool, openpilot's
  ``Event.valid``: :func:`~..openpilot.events.event_valid`);
- ``availability`` (string), ``reason`` (string, empty when there is none), ``reasonKind``
  (string, null when there is no reason), ``availabilityReason`` and ``availabilityReasonKind``
  (the same of the availability's reason);
- ``readiness.deviceOnline`` ... ``readiness.outputValid`` (bool): the five readiness layers;
- ``timestampSof``, ``timestampEof`` (int64, ns, the service's clock), ``recordedTimestampSof``,
  ``recordedTimestampEof`` (int64, ns, as recorded; null for a live frame);
- ``frameAge``, ``modelExecutionTime``, ``gpuExecutionTime`` (float64, seconds);
- ``wheelOnRightProb`` and each side's driver fields, a list one column per element, named as
  :func:`~..openpilot.compare.flatten` names them (``left.faceOrientation.0``, ...,
  ``right.sleepProb``): float32, the model's own precision (its outputs are decoded in float32,
  so no value changes); all null when the message carries no driver data.

The values are the JSON record's (:meth:`~..messages.DriverStateV2.to_record`); ``rawPredictions``
is not a column. Stored compressed with zstd, the float columns in Parquet's ``BYTE_STREAM_SPLIT``
encoding (read by pyarrow, DuckDB, Polars, Spark 3.2 on). A status message of a stalled camera
(``frameId`` -1) is not a frame's and is not a row: this sink neither takes nor counts it, so that
a dataset has one row per (``recording``, ``frameId``), the same rows however fast the machine
that replayed it.

**Whole or none.** A Parquet file is readable only once its footer is written, so rows go to a
file of their own beside ``path``, ``.<name>.partial`` (hidden: a dataset reader passes over it);
a leftover one of an earlier run is replaced. A row group is written for every ``row_group`` rows
(1024), the rest and the footer as the sink closes. The file becomes ``path`` (linked, never over a
file that is there) at close only when the producer said the replay ended by itself
(:meth:`ParquetSink.complete`) and every row was written; a sink that cannot do that fails
(:class:`~.base.SinkFailed`). Otherwise ``path`` is not written: the partial file keeps
the rows written, readable, and a warning names it — unless its footer could not be written (a
failed write, a close past its bound), when it is removed, unreadable.

Policy (see :mod:`.base`): a replay's sink, lossless: the producer waits for room
(:meth:`~.file.FileSink.room`, fewer than ``backlog`` rows waiting); a row is *delivered*
once the row group that holds it is written. A write that fails (a full disk) fails the sink
(:class:`~.base.SinkFailed`). Rows are made on the sink's writer thread
(:class:`~.file.FileSink`); pyarrow is imported there, the first time it is needed, never
by importing this module. A ``path`` that exists or cannot be created, and a missing pyarrow, are
a :class:`ValueError` in one line, at construction.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aio_runtime import get_logger

from ...extras import FLEET_EXTRA
from ..config.kinds import Mode
from ..messages import DRIVER_FIELDS, READINESS_LAYERS, DriverStateV2
from ..openpilot.compare import SIDES, flatten
from ..openpilot.events import event_valid
from .base import DRAIN_TIMEOUT, LIVE_BACKLOG, SinkFailed, SinkStats, check_backlog
from .file import FileSink, open_for_writing

if TYPE_CHECKING:
    from ..config.settings import ServiceConfig
    from . import Rows

__all__ = [
    "DRIVER_COLUMNS",
    "PARQUET_COLUMNS",
    "ROW_GROUP",
    "ParquetSink",
    "message_row",
    "open_sinks",
    "parquet_schema",
    "partial_path",
]

ROW_GROUP = 1024
"""Rows a row group holds (the last one of a file, fewer)."""
_CHUNK = 1 << 20
"""Bytes per write: a Parquet file goes to a regular file, written in large pieces."""
_VECTORS = {"faceOrientation": 3, "faceOrientationStd": 3, "facePosition": 2, "facePositionStd": 2}
"""The driver fields that are lists, and their lengths (the decoded ``DriverData``)."""

_log = get_logger(__name__)


def _driver_columns() -> tuple[str, ...]:
    columns = ["wheelOnRightProb"]
    for short, _ in SIDES:
        for name in DRIVER_FIELDS:
            length = _VECTORS.get(name)
            if length is None:
                columns.append(f"{short}.{name}")
            else:
                columns.extend(f"{short}.{name}.{i}" for i in range(length))
    return tuple(columns)


DRIVER_COLUMNS = _driver_columns()
"""The driver state's columns, as :func:`~..openpilot.compare.flatten` names them."""

_TYPED: tuple[tuple[str, str, bool], ...] = (
    ("recording", "string", False),
    ("runId", "string", False),
    ("seq", "int64", False),
    ("frameId", "int64", False),
    ("valid", "bool_", False),
    ("late", "bool_", False),
    ("eventValid", "bool_", False),
    ("availability", "string", False),
    ("reason", "string", False),
    ("reasonKind", "string", True),
    ("availabilityReason", "string", False),
    ("availabilityReasonKind", "string", True),
    *((f"readiness.{layer}", "bool_", False) for layer in READINESS_LAYERS),
    ("timestampSof", "int64", False),
    ("timestampEof", "int64", False),
    ("recordedTimestampSof", "int64", True),
    ("recordedTimestampEof", "int64", True),
    ("frameAge", "float64", False),
    ("modelExecutionTime", "float64", False),
    ("gpuExecutionTime", "float64", False),
    *((column, "float32", True) for column in DRIVER_COLUMNS),
)
"""Each column: its name, its pyarrow type's name, whether it may be null."""

PARQUET_COLUMNS = tuple(name for name, _, _ in _TYPED)
"""The columns of every file, in order."""
_FLOATS = tuple(name for name, kind, _ in _TYPED if kind.startswith("float"))
"""Stored byte stream split (a third smaller with zstd than plain), without dictionaries."""


def parquet_schema() -> Any:
    """The files' ``pyarrow.Schema`` (imports pyarrow)."""
    import pyarrow as pa

    return pa.schema(
        [pa.field(name, getattr(pa, kind)(), nullable=null) for name, kind, null in _TYPED]
    )


def partial_path(path: str | Path) -> Path:
    """Where the rows for ``path`` are written until the file is complete."""
    path = Path(path)
    return path.with_name(f".{path.name}.partial")


def message_row(message: DriverStateV2, recording: str) -> tuple[Any, ...]:
    """``message``'s values, in :data:`PARQUET_COLUMNS`' order (None where a value is null),
    ``recording`` the first."""
    flat = flatten(message)
    if flat is None:
        driver: list[float | None] = [None] * len(DRIVER_COLUMNS)
    elif len(flat) != len(DRIVER_COLUMNS):
        raise ValueError(f"driver data with the columns {sorted(flat)}, not the schema's")
    else:
        driver = [flat[column] for column in DRIVER_COLUMNS]
    return (
        recording,
        message.run_id,
        message.seq,
        message.frame_id,
        message.valid,
        message.late,
        event_valid(message),
        message.availability.value,
        message.reason,
        message.reason_kind,
        message.availability_reason,
        message.availability_reason_kind,
        *(bool(message.readiness[layer]) for layer in READINESS_LAYERS),
        message.timestamp_sof,
        message.timestamp_eof,
        message.recorded_sof,
        message.recorded_eof,
        message.frame_age,
        message.model_execution_time,
        message.gpu_execution_time,
        *driver,
    )


class _Collected(io.RawIOBase):
    """Where pyarrow writes: the bytes it gave, until taken (its position counts them all)."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[bytes] = []
        self._position = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        part = bytes(data)
        self._parts.append(part)
        self._position += len(part)
        return len(part)

    def tell(self) -> int:
        return self._position

    def take(self) -> bytes:
        taken, self._parts = b"".join(self._parts), []
        return taken


class _ParquetStream:
    """Messages to a Parquet stream: a row group for every ``row_group`` of them, the rest and
    the footer at the end (on the writer's thread only)."""

    def __init__(self, recording: str, row_group: int) -> None:
        self._recording = recording
        self._row_group = row_group
        self._rows: list[DriverStateV2] = []
        self._out = _Collected()
        self._writer: Any = None
        self._schema: Any = None

    @property
    def held(self) -> int:
        return len(self._rows)

    def encode(self, records: Sequence[DriverStateV2]) -> bytes:
        self._rows.extend(records)
        size = self._row_group
        full = len(self._rows) // size * size
        for start in range(0, full, size):
            self._write(self._rows[start : start + size])
        del self._rows[:full]
        return self._out.take()

    def end(self) -> bytes:
        if self._rows:
            self._write(self._rows)
            self._rows = []
        self._opened().close()
        return self._out.take()

    def _opened(self) -> Any:
        if self._writer is None:
            import pyarrow.parquet as pq

            self._schema = parquet_schema()
            self._writer = pq.ParquetWriter(
                self._out,
                self._schema,
                compression="zstd",
                use_byte_stream_split=list(_FLOATS),
                use_dictionary=[name for name in PARQUET_COLUMNS if name not in _FLOATS],
            )
        return self._writer

    def _write(self, messages: Sequence[DriverStateV2]) -> None:
        import pyarrow as pa

        writer = self._opened()
        columns = zip(*(message_row(message, self._recording) for message in messages), strict=True)
        arrays = [
            pa.array(values, type=field.type)
            for values, field in zip(columns, self._schema, strict=True)
        ]
        writer.write_table(pa.Table.from_arrays(arrays, schema=self._schema))


class ParquetSink(FileSink[DriverStateV2]):
    """One row per frame's message, to the new Parquet file ``path`` once the replay is complete;
    see the module's description for the columns, what completes the file, and the policy.

    ``recording``: the ``recording`` column's value (the input's name); ``row_group``: rows a
    row group holds."""

    def __init__(
        self,
        path: str | Path,
        *,
        recording: str,
        backlog: int = LIVE_BACKLOG,
        row_group: int = ROW_GROUP,
        name: str | None = None,
    ) -> None:
        self.path = Path(path)
        name = name or f"parquet {self.path}"
        check_backlog(backlog)
        check_backlog(row_group, what="row_group", unit="rows")
        if not isinstance(recording, str) or not recording:
            raise ValueError(f"{name}: the recording's name must be a non-empty string")
        if not _installed("pyarrow"):
            raise ValueError(f"{name}: needs pyarrow, which is not installed: {FLEET_EXTRA}")
        if os.path.lexists(self.path):
            raise ValueError(f"{name}: exists (a new file is expected)")
        self.partial = partial_path(self.path)
        """Where the rows are until the file is complete (and stay when it is not)."""
        with contextlib.suppress(OSError):  # what cannot be removed is refused as it is opened
            self.partial.unlink()  # an earlier run's, left incomplete
        fd = open_for_writing(self.partial, name, new=True)
        super().__init__(
            fd,
            name=name,
            encoder=_ParquetStream(recording, row_group),
            delivery=Mode.REPLAY,
            backlog=backlog,
            batch=True,
            chunk=_CHUNK,
        )
        self._complete = False
        self._settled = False
        self.written: Path | None = None
        """``path`` once the file is complete there (after close); None until then, or ever."""

    def _record(self, message: DriverStateV2) -> DriverStateV2:
        return message  # made a row on the writer's thread

    def publish(self, message: DriverStateV2) -> None:
        if message.frame_id >= 0:  # a stalled camera's status is no frame's: not a row
            super().publish(message)

    def complete(self) -> None:
        """The replay ended by itself, every message published: close then completes the file
        (if every row is written)."""
        self._complete = True

    def close(self, timeout: float = DRAIN_TIMEOUT) -> SinkStats:
        """Write what is held and the footer for at most ``timeout`` seconds (blocking); then the
        file becomes ``path`` if the replay is complete, or the partial file stays (or goes, if
        unreadable) — see the module's description."""
        stats = super().close(timeout)
        with self._lock:
            first, self._settled = not self._settled, True
        if first:
            self._settle(stats)
        return self.stats()

    def _settle(self, stats: SinkStats) -> None:
        whole = self._ended and stats.failed is None and stats.dropped == 0
        if whole and self._complete:
            try:
                _link_new(self.partial, self.path)
            except OSError as exc:
                failure = SinkFailed(self.name, f"could not be completed: {exc}")
                with self._lock:
                    self._failure = failure
                _log.error("sink failed", sink=self.name, error=str(failure))
                return
            self.written = self.path
            return
        why = "the replay did not end by itself" if whole else "not every row was written"
        if whole:
            _log.warning(
                "parquet file not completed: its rows are kept apart",
                sink=self.name,
                why=why,
                rows=stats.delivered,
                partial=str(self.partial),
            )
            return
        with contextlib.suppress(OSError):
            self.partial.unlink()
        _log.warning("parquet file not completed: removed, unreadable", sink=self.name, why=why)


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # blocked (None in sys.modules)
        return False


def _link_new(partial: Path, path: Path) -> None:
    """``partial``, on disk, as ``path``, never over a file there (:class:`FileExistsError`)."""
    fd = os.open(partial, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(partial, path)
    except FileExistsError:
        raise
    except OSError:  # no hard links on this file system (vfat, some network ones): a rename
        if os.path.lexists(path):
            raise FileExistsError(f"{path} exists") from None
        os.rename(partial, path)
        return
    os.unlink(partial)


def open_sinks(config: ServiceConfig, rows: Rows) -> list[ParquetSink]:
    """The sink ``--parquet`` asks for: the replay's rows, of the recording ``rows`` names."""
    assert config.parquet is not None
    return [ParquetSink(config.parquet, recording=rows.recording, row_group=rows.row_group)]
