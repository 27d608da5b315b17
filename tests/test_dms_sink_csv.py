"""The CSV sink: the Parquet columns as text, one row per frame, to a new file."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import anyio
import numpy as np
import pytest
from dms_messages import message
from sink_checks import assert_exact, fill_disk

from pipelines.dms.config.kinds import Mode
from pipelines.dms.sinks.base import SinkFailed
from pipelines.dms.sinks.csv import CsvSink
from pipelines.dms.sinks.parquet import PARQUET_COLUMNS, message_row

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def _read(path):
    with path.open(newline="") as f:
        return list(csv.reader(f))


def _text(value) -> str:
    return "" if value is None else str(value)


def test_every_frame_is_one_row_of_the_parquet_columns_as_text(tmp_path):
    path = tmp_path / "run.csv"
    sink = CsvSink(path, recording="drive.dmsrec")
    messages = [message(seq, valid=seq % 3 != 1) for seq in range(30)]
    for each in messages:
        sink.publish(each)
    stats = sink.close()
    assert (stats.published, stats.delivered, stats.dropped) == (30, 30, 0)
    header, *rows = _read(path)
    assert tuple(header) == PARQUET_COLUMNS
    assert rows == [[_text(v) for v in message_row(m, "drive.dmsrec")] for m in messages]
    valid = [m for m in messages if m.left_driver_data is not None]
    assert valid  # the driver values read back exactly, float32 as written
    column = header.index("left.faceProb")
    for row, each in zip(rows, messages, strict=True):
        if each.left_driver_data is not None:
            assert np.float32(row[column]) == np.float32(each.left_driver_data["faceProb"])
        else:
            assert row[column] == ""


def test_a_stalled_camera_s_status_is_no_row_and_a_run_with_no_row_names_its_columns(tmp_path):
    path = tmp_path / "run.csv"
    sink = CsvSink(path)
    sink.publish(dataclasses.replace(message(0, valid=False), frame_id=-1, timestamp_sof=0))
    stats = sink.close()
    assert (stats.published, stats.delivered) == (0, 0)
    assert _read(path) == [list(PARQUET_COLUMNS)]


def test_a_path_that_exists_or_cannot_be_created_is_refused_in_one_line(tmp_path):
    there = tmp_path / "run.csv"
    there.write_text("an earlier run's")
    with pytest.raises(ValueError, match=r"^csv .*exists"):
        CsvSink(there)
    with pytest.raises(ValueError, match="does not exist"):
        CsvSink(tmp_path / "no" / "run.csv")
    assert there.read_text() == "an earlier run's"


async def test_a_replay_loses_nothing(tmp_path):
    path = tmp_path / "run.csv"
    sink = CsvSink(path, delivery=Mode.REPLAY, backlog=4)
    with anyio.fail_after(30):
        for seq in range(40):
            await sink.room()
            sink.publish(message(seq))
        stats = await sink.aclose()
    assert (stats.published, stats.delivered, stats.dropped) == (40, 40, 0)
    assert [row[3] for row in _read(path)[1:]] == [str(100 + seq) for seq in range(40)]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
async def test_a_full_disk_fails_the_sink_typed(tmp_path):
    path = tmp_path / "run.csv"
    sink = CsvSink(path)
    fill_disk(path)  # its descriptor now writes where there is no space
    for seq in range(3):
        sink.publish(message(seq))
    with anyio.fail_after(10):
        failure = await sink.wait_failure()
    assert isinstance(failure, SinkFailed) and "No space left on device" in str(failure)
    stats = await sink.aclose()
    assert stats.failed == str(failure) and (stats.published, stats.delivered) == (3, 0)
    assert_exact(stats)
