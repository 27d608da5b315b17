"""The frames of a fleet run directory: its Parquet files found, checked and read.

A fleet run directory ``RUN`` holds ``RUN/frames/<recording>/part-0.parquet``, one file per
recording, each written by :class:`~pipelines.dms.sinks.parquet.ParquetSink` (its columns,
:data:`~pipelines.dms.sinks.parquet.PARQUET_COLUMNS`). The directory names are the recordings'
names quoted, but the ``recording`` column of each row is what says which recording a row is of;
names are never parsed. Hidden files and directories (a ``.part-0.parquet.partial`` left by an
interrupted recording) are not read.

pyarrow is imported by the functions that read, not by importing this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...extras import FLEET_EXTRA
from ..sinks.parquet import parquet_schema

__all__ = ["FRAMES_DIR", "frame_files", "is_run_directory", "read_frames"]

FRAMES_DIR = "frames"
"""The folder of a run directory that holds the recordings' Parquet files."""


def is_run_directory(path: Path) -> bool:
    """Whether ``path`` looks like a fleet run directory (it has a ``frames`` folder); nothing
    is read."""
    return (path / FRAMES_DIR).is_dir()


def _pyarrow() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(
            f"reading a fleet run needs pyarrow, which is not installed: {FLEET_EXTRA}"
        ) from None
    return pq


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def frame_files(run: Path) -> list[Path]:
    """The run's Parquet files, in name order, each one's schema checked (its footer read):
    :class:`ValueError`, one line, for a ``run`` that is no run directory — no ``frames``
    folder, not one Parquet file in it, a file that cannot be read as Parquet or whose columns
    are not the frames' schema."""
    pq = _pyarrow()
    import pyarrow as pa

    frames = run / FRAMES_DIR
    if not frames.is_dir():
        raise ValueError(f"{str(run)!r} is not a fleet run directory (no {FRAMES_DIR}/ in it)")
    try:
        files = sorted(
            file
            for folder in frames.iterdir()
            if folder.is_dir() and not folder.name.startswith(".")
            for file in folder.iterdir()
            if file.suffix == ".parquet" and not file.name.startswith(".") and file.is_file()
        )
    except OSError as exc:
        raise ValueError(f"{str(frames)!r} cannot be read: {_first_line(exc)}") from None
    if not files:
        raise ValueError(f"{str(frames)!r} holds no Parquet file of a recording")
    expected = parquet_schema()
    for file in files:
        try:
            schema = pq.read_schema(file)
        except (OSError, pa.ArrowException) as exc:
            raise ValueError(
                f"{str(file)!r} is not a readable Parquet file: {_first_line(exc)}"
            ) from None
        if not schema.equals(expected, check_metadata=False):
            missing = [name for name in expected.names if name not in schema.names]
            what = f"lacks {missing[:3]}" if missing else "has other columns or types"
            raise ValueError(f"{str(file)!r} is not a file of frames: its schema {what}")
    return files


def read_frames(files: Sequence[Path], columns: Sequence[str]) -> Any:
    """``columns`` of every row of ``files`` (from :func:`frame_files`) as one ``pyarrow.Table``;
    :class:`ValueError`, one line, when a file cannot be read after all."""
    pq = _pyarrow()
    import pyarrow as pa

    try:
        return pq.read_table(
            [str(file) for file in files],
            columns=list(columns),
            schema=parquet_schema(),
            partitioning=None,
        )
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"the frames cannot be read: {_first_line(exc)}") from None
