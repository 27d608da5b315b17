"""The Parquet sink: one row per frame in a fixed schema, row groups counted as delivered, and a
file that is whole or not there."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from dms_messages import message
from sink_checks import assert_exact, fill_disk

from pipelines.dms.config.kinds import Mode
from pipelines.dms.openpilot.compare import flatten
from pipelines.dms.sinks.base import SinkFailed
from pipelines.dms.sinks.parquet import (
    DRIVER_COLUMNS,
    PARQUET_COLUMNS,
    ParquetSink,
    _ParquetStream,
    parquet_schema,
    partial_path,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parent.parent


def frames(count: int, start: int = 0):
    """Frames' messages: every third invalid, without driver data."""
    for seq in range(start, start + count):
        yield message(seq, valid=seq % 3 != 1)


def stall(seq: int):
    """A stalled camera's status message (no frame)."""
    return dataclasses.replace(message(seq, valid=False), frame_id=-1, timestamp_sof=0)


class HeldEncoder:
    """The Parquet encoder, watched: :meth:`taken` waits until it has been given ``n`` records;
    once :meth:`hold_at` ``n``, the writer stops inside the call that gives it its ``n``-th
    (``entered`` set) until ``release`` is set."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self._given = threading.Condition()
        self._count = 0
        self._at: int | None = None

    def hold_at(self, n: int) -> HeldEncoder:
        self._at = n
        return self

    def taken(self, n: int) -> bool:
        with self._given:
            return self._given.wait_for(lambda: self._count >= n, timeout=10)

    def wrap(self, encode):
        def held(stream, records):
            with self._given:
                self._count += len(records)
                self._given.notify_all()
            if self._at is not None and self._count >= self._at:
                self.entered.set()
                assert self.release.wait(30)
            return encode(stream, records)

        return held


@pytest.fixture
def held_encoder(monkeypatch):
    held = HeldEncoder()
    monkeypatch.setattr(_ParquetStream, "encode", held.wrap(_ParquetStream.encode))
    yield held
    held.release.set()


def test_every_frame_is_one_row_of_the_fixed_schema_with_the_message_s_values(tmp_path):
    path = tmp_path / "out.parquet"
    sink = ParquetSink(path, recording="drive-1")
    sent = list(frames(30))
    for item in sent:
        sink.publish(item)
    sink.complete()
    stats = sink.close()
    assert (stats.published, stats.delivered, stats.dropped) == (30, 30, 0)
    assert sink.written == path and not sink.partial.exists()
    table = pq.read_table(path)
    assert table.schema == parquet_schema() and tuple(table.column_names) == PARQUET_COLUMNS
    rows = table.to_pylist()
    assert [row["seq"] for row in rows] == [m.seq for m in sent]
    for row, item in zip(rows, sent, strict=True):
        record = item.to_record()
        for column in ("runId", "frameId", "valid", "availability", "reason", "reasonKind"):
            assert row[column] == record[column], column
        assert row["recording"] == "drive-1"
        assert row["eventValid"] == (item.valid and item.availability.value != "unavailable")
        assert [row[f"readiness.{k}"] for k in record["readiness"]] == [
            *record["readiness"].values()
        ]
        flat = flatten(item)
        if flat is None:  # no driver data: every driver column null
            assert all(row[column] is None for column in DRIVER_COLUMNS)
        else:
            stored = {column: float(np.float32(value)) for column, value in flat.items()}
            assert {column: row[column] for column in DRIVER_COLUMNS} == stored  # as float32
        assert row["recordedTimestampSof"] is None  # a live frame's (messages made here)


def test_the_schema_types_each_column_and_says_which_may_be_null():
    schema = parquet_schema()
    kinds = {field.name: (str(field.type), field.nullable) for field in schema}
    assert kinds["recording"] == kinds["runId"] == kinds["availability"] == ("string", False)
    assert kinds["seq"] == kinds["frameId"] == kinds["timestampSof"] == ("int64", False)
    assert (
        kinds["valid"] == kinds["eventValid"] == kinds["readiness.outputValid"] == ("bool", False)
    )
    assert kinds["reasonKind"] == ("string", True)
    assert kinds["recordedTimestampEof"] == ("int64", True)
    assert kinds["frameAge"] == kinds["gpuExecutionTime"] == ("double", False)
    assert {kinds[column] for column in DRIVER_COLUMNS} == {("float", True)}
    assert DRIVER_COLUMNS[:4] == (
        "wheelOnRightProb",
        "left.faceOrientation.0",
        "left.faceOrientation.1",
        "left.faceOrientation.2",
    )
    assert set(DRIVER_COLUMNS) == set(flatten(message(0)))  # compare's naming, column for column


def test_a_stalled_camera_s_status_is_no_row_and_not_counted(tmp_path):
    path = tmp_path / "out.parquet"
    sink = ParquetSink(path, recording="drive")
    sink.publish(message(0))
    sink.publish(stall(1))
    sink.publish(message(2))
    sink.complete()
    stats = sink.close()
    assert (stats.published, stats.delivered) == (2, 2)
    assert pq.read_table(path).column("frameId").to_pylist() == [100, 102]


def test_a_row_is_delivered_once_the_row_group_holding_it_is_written(tmp_path, held_encoder):
    held_encoder.hold_at(26)
    path = tmp_path / "out.parquet"
    sink = ParquetSink(path, recording="drive", row_group=10)
    for item in frames(25):
        sink.publish(item)
    assert held_encoder.taken(25)
    sink.publish(message(25))
    assert held_encoder.entered.wait(10)  # the first 25 written: the writer holds the 26th
    held = sink.stats()
    assert (held.published, held.delivered, held.pending) == (26, 20, 6)  # two row groups
    held_encoder.release.set()
    sink.complete()
    stats = sink.close()
    assert (stats.delivered, stats.dropped) == (26, 0)
    metadata = pq.ParquetFile(path).metadata
    groups = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert groups == [10, 10, 6]


async def test_a_replay_waits_for_room_and_loses_nothing(tmp_path, held_encoder):
    held_encoder.hold_at(1)
    sink = ParquetSink(tmp_path / "out.parquet", recording="drive", backlog=4)
    sink.publish(message(0))
    assert await anyio.to_thread.run_sync(held_encoder.entered.wait, 10)  # it holds message 0

    async def produce():
        for seq in range(1, 40):
            await sink.room()
            sink.publish(message(seq))

    async with anyio.create_task_group() as tg:
        tg.start_soon(produce)
        await anyio.wait_all_tasks_blocked()  # the producer waits for room
        assert sink.stats().published == 1 + 4  # the one being written, and the backlog
        held_encoder.release.set()
    sink.complete()
    stats = await sink.aclose()
    assert (stats.published, stats.delivered, stats.dropped) == (40, 40, 0)
    assert stats.delivery is Mode.REPLAY
    assert pq.read_table(sink.path).column("seq").to_pylist() == list(range(40))


def test_a_replay_that_did_not_end_by_itself_leaves_no_file_and_its_rows_apart(
    tmp_path, captured_logs
):
    path = tmp_path / "out.parquet"
    sink = ParquetSink(path, recording="drive", row_group=8)
    for item in frames(20):
        sink.publish(item)
    stats = sink.close()  # never told the replay was complete
    assert (stats.delivered, stats.dropped, stats.failed) == (20, 0, None)
    assert not path.exists() and sink.written is None
    assert sink.partial == tmp_path / ".out.parquet.partial"
    assert pq.read_table(sink.partial).column("seq").to_pylist() == list(range(20))
    (warning,) = [e for e in captured_logs if e["event"].startswith("parquet file not completed")]
    assert warning["partial"] == str(sink.partial) and warning["rows"] == 20


def test_closing_past_its_bound_leaves_no_file_and_nothing_unreadable(tmp_path, held_encoder):
    held_encoder.hold_at(1)
    path = tmp_path / "out.parquet"
    sink = ParquetSink(path, recording="drive")
    for item in frames(5):
        sink.publish(item)
    sink.complete()
    stats = sink.close(timeout=0.05)  # the writer is held: its rows and footer never written
    held_encoder.release.set()
    assert (stats.published, stats.delivered, stats.dropped) == (5, 0, 5)
    assert_exact(stats)
    assert not path.exists() and not sink.partial.exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
async def test_a_full_disk_fails_the_sink_typed_and_leaves_no_file(tmp_path, captured_logs):
    path = tmp_path / "out.parquet"
    sink = ParquetSink(path, recording="drive", row_group=2)
    fill_disk(
        sink.partial
    )  # the disk fills: the partial file's descriptor now writes where there is no space
    for item in frames(3):
        sink.publish(item)
    with anyio.fail_after(10):
        failure = await sink.wait_failure()
        await sink.room()  # a failed sink never holds a replay
    assert isinstance(failure, SinkFailed) and "No space left on device" in str(failure)
    sink.complete()
    stats = await sink.aclose()
    assert stats.failed == str(failure) and (stats.published, stats.delivered) == (3, 0)
    assert_exact(stats)
    assert not path.exists() and not sink.partial.exists()


def test_a_file_that_appears_at_the_path_meanwhile_is_kept_and_the_sink_fails(tmp_path):
    path = tmp_path / "out.parquet"
    sink = ParquetSink(path, recording="drive")
    sink.publish(message(0))
    path.write_bytes(b"another's")
    sink.complete()
    stats = sink.close()
    assert stats.failed is not None and "could not be completed" in stats.failed
    assert path.read_bytes() == b"another's" and sink.written is None
    assert pq.read_table(sink.partial).num_rows == 1  # the rows stay apart, readable


def test_without_hard_links_the_complete_file_is_renamed(tmp_path, monkeypatch):
    def no_links(source, target):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / "out.parquet"
    sink = ParquetSink(path, recording="drive")
    sink.publish(message(0))
    sink.complete()
    assert sink.close().failed is None
    assert pq.read_table(path).num_rows == 1 and not sink.partial.exists()


def test_an_empty_replay_is_a_file_of_the_schema_and_no_rows(tmp_path):
    path = tmp_path / "out.parquet"
    sink = ParquetSink(path, recording="drive")
    sink.complete()
    sink.close()
    table = pq.read_table(path)
    assert table.num_rows == 0 and table.schema == parquet_schema()


def test_files_of_many_recordings_read_as_one_dataset_passing_over_partial_ones(tmp_path):
    for name, count in (("a", 3), ("b", 5), ("c", 2)):
        sink = ParquetSink(tmp_path / f"{name}.parquet", recording=name)
        for item in frames(count):
            sink.publish(item)
        if name != "c":  # c's replay was interrupted: its rows stay apart
            sink.complete()
        sink.close()
    assert partial_path(tmp_path / "c.parquet").exists()
    table = ds.dataset(tmp_path, format="parquet", schema=parquet_schema()).to_table()
    counts = table.group_by("recording").aggregate([("frameId", "count")]).to_pylist()
    assert sorted((c["recording"], c["frameId_count"]) for c in counts) == [("a", 3), ("b", 5)]
    both = pa.concat_tables(
        [pq.read_table(tmp_path / "a.parquet"), pq.read_table(tmp_path / "b.parquet")]
    )
    assert both.num_rows == 8


def test_a_path_that_exists_or_cannot_be_created_is_refused_in_one_line(tmp_path):
    earlier = tmp_path / "earlier.parquet"
    earlier.write_bytes(b"an earlier run's")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "file").write_text("")
    cases = {
        earlier: "exists",
        tmp_path / "dangling": "exists",
        tmp_path: "exists",
        tmp_path / "missing" / "out.parquet": "directory .* does not exist",
        tmp_path / "file" / "out.parquet": "is not a directory",
    }
    for path, complaint in cases.items():
        with pytest.raises(ValueError, match=complaint) as refused:
            ParquetSink(path, recording="drive")
        assert "\n" not in str(refused.value) and str(path) in str(refused.value)
    assert earlier.read_bytes() == b"an earlier run's"
    with pytest.raises(ValueError, match="row_group must be a whole number of rows"):
        ParquetSink(tmp_path / "out.parquet", recording="drive", row_group=0)
    with pytest.raises(ValueError, match="recording's name"):
        ParquetSink(tmp_path / "out.parquet", recording="")
    assert not (tmp_path / "out.parquet").exists()


def test_an_earlier_run_s_partial_file_is_replaced(tmp_path):
    path = tmp_path / "out.parquet"
    partial_path(path).write_bytes(b"a killed run's, without its footer")
    sink = ParquetSink(path, recording="drive")
    sink.publish(message(0))
    sink.complete()
    sink.close()
    assert pq.read_table(path).num_rows == 1 and not partial_path(path).exists()


def test_without_pyarrow_the_sink_is_refused_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ValueError, match=r"needs pyarrow.*pip install 'aio-dms\[fleet\]'"):
        ParquetSink(tmp_path / "out.parquet", recording="drive")
    assert not partial_path(tmp_path / "out.parquet").exists()


LEAN_IMPORT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, "tests")
    import pipelines.dms
    from pipelines.dms.sinks.parquet import ParquetSink
    from pipelines.dms.service import DmsService
    sink = ParquetSink(sys.argv[1], recording="drive")
    print("pyarrow" in sys.modules)
    from dms_messages import message
    sink.publish(message(0))
    sink.complete()
    sink.close()
    print("pyarrow" in sys.modules)
    """
)


def test_pyarrow_is_imported_only_once_rows_are_written(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", LEAN_IMPORT, str(tmp_path / "out.parquet")],
        cwd=ROOT, capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]
