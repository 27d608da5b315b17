"""The JSON lines sink: files, pipes and standard output; live and replay; failures; closing."""

from __future__ import annotations

import json
import os
import sys

import anyio
import pytest
from dms_messages import RUN_ID, message
from sink_checks import assert_exact

from aio_runtime.testing import virtual_time
from pipelines.dms.config.kinds import Mode
from pipelines.dms.sinks.base import LIVE_BACKLOG, ReaderClosed, SinkFailed
from pipelines.dms.sinks.jsonl import JsonLinesSink

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def fifo(tmp_path):
    """A FIFO and its read end (opened first, so the sink finds a reader), not read yet."""
    path = tmp_path / "out.fifo"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    yield path, reader
    os.close(reader)


def read_to_end(fd: int) -> list[dict]:
    """Every line in the pipe, once the sink has closed its end."""
    os.set_blocking(fd, True)
    data = b""
    while chunk := os.read(fd, 1 << 16):
        data += chunk
    return [json.loads(line) for line in data.decode().splitlines()]


def test_json_lines_go_to_a_new_file_one_record_per_line(tmp_path):
    path = tmp_path / "out.jsonl"
    sink = JsonLinesSink(path)
    for seq in range(3):
        sink.publish(message(seq))
    stats = sink.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["seq"] for line in lines] == [0, 1, 2]
    assert {line["runId"] for line in lines} == {RUN_ID}
    assert (stats.published, stats.delivered, stats.dropped, stats.failed) == (3, 3, 0, None)
    assert stats.name == f"jsonl {path}" and stats.delivery is Mode.LIVE


def test_a_file_that_exists_is_refused_unless_appended_to(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text('{"seq":-1}\n')  # an earlier run's
    with pytest.raises(ValueError, match="the file exists") as refused:
        JsonLinesSink(path)
    assert "\n" not in str(refused.value) and str(path) in str(refused.value)
    assert path.read_text() == '{"seq":-1}\n'  # untouched
    sink = JsonLinesSink(path, append=True)
    for seq in range(2):
        sink.publish(message(seq))
    sink.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [-1, 0, 1]  # kept, then appended


def test_a_fifo_or_a_device_that_exists_is_written_to_without_appending(fifo):
    path, reader = fifo
    sink = JsonLinesSink(path)
    sink.publish(message(0))
    stats = sink.close()
    assert stats.delivered == 1 and [line["seq"] for line in read_to_end(reader)] == [0]
    JsonLinesSink("/dev/null").close()


def test_a_path_that_cannot_be_written_is_refused_in_one_line(tmp_path, fifo):
    (tmp_path / "file").write_text("")
    unread_fifo = tmp_path / "unread.fifo"
    os.mkfifo(unread_fifo)
    cases = {
        tmp_path / "missing" / "out.jsonl": "directory .* does not exist",
        tmp_path / "file" / "out.jsonl": "is not a directory",
        tmp_path: "is a directory",
        unread_fifo: "a FIFO that no one reads",
    }
    for path, complaint in cases.items():
        with pytest.raises(ValueError, match=complaint) as caught:
            JsonLinesSink(path)
        assert "\n" not in str(caught.value) and str(path) in str(caught.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="permissions do not bind root")
def test_a_file_without_write_permission_is_refused(tmp_path):
    path = tmp_path / "read-only.jsonl"
    path.write_text("")
    path.chmod(0o444)
    with pytest.raises(ValueError, match="not writable"):
        JsonLinesSink(path, append=True)


@pytest.mark.parametrize("delivery", list(Mode))
async def test_a_full_disk_fails_the_sink_at_once_logged_once(delivery, captured_logs):
    sink = JsonLinesSink("/dev/full", delivery=delivery, backlog=2)
    sink.publish(message(0))
    with anyio.fail_after(10):
        failure = await sink.wait_failure()
        for seq in range(1, 6):
            await sink.room()  # a failed sink never holds a replay
            sink.publish(message(seq))
    assert isinstance(failure, SinkFailed) and not isinstance(failure, ReaderClosed)
    assert "No space left on device" in str(failure) and sink.failure() is failure
    stats = await sink.aclose()
    assert stats.failed == str(failure) and not stats.closed_by_reader
    assert (stats.published, stats.delivered, stats.dropped) == (6, 0, 6)
    assert_exact(stats)
    failed = [e for e in captured_logs if e["event"] == "sink failed"]
    assert len(failed) == 1 and failed[0]["log_level"] == "error"


async def test_a_live_sink_whose_reader_stalls_drops_the_oldest_and_counts_exactly(
    fifo, captured_logs
):
    path, reader = fifo
    sink = JsonLinesSink(path)
    for seq in range(300):
        sink.publish(message(seq))  # never blocks, though nobody reads
    stats = await sink.aclose(timeout=0.2)  # the bound passes: what is left is dropped
    lines = read_to_end(reader)
    assert len(lines) == stats.delivered > 0
    assert stats.dropped == 300 - stats.delivered >= 300 - LIVE_BACKLOG - 1
    assert_exact(stats)
    seqs = [line["seq"] for line in lines]
    assert seqs == sorted(seqs)
    started = [e for e in captured_logs if e["event"] == "sink dropping messages"]
    stopped = [e for e in captured_logs if e["event"] == "sink stopped dropping"]
    assert len(started) == 1 and len(stopped) == 1
    assert stopped[0]["dropped"] == stats.dropped


async def test_a_live_sink_holds_200_lines_for_a_stalled_reader_before_dropping(fifo):
    path, _ = fifo
    filler = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        while True:
            os.write(filler, b"\n" * 4096)  # the reader has stalled with the pipe full
    except BlockingIOError:
        pass
    sink = JsonLinesSink(path)
    for seq in range(LIVE_BACKLOG):
        sink.publish(message(seq))
    assert sink.stats().dropped == 0  # 200 held (one of them perhaps being written)
    for seq in range(LIVE_BACKLOG, LIVE_BACKLOG + 5):
        sink.publish(message(seq))
    assert sink.stats().dropped in (4, 5)  # 5 over, less the one the writer may have taken
    stats = await sink.aclose(timeout=0.1)
    assert (stats.published, stats.delivered, stats.dropped) == (LIVE_BACKLOG + 5, 0, 205)
    os.close(filler)


async def test_a_replay_waits_for_a_reader_stalled_5_s_and_loses_nothing(fifo):
    path, reader = fifo
    sink = JsonLinesSink(path, delivery=Mode.REPLAY, backlog=20)
    line_size = len(message(0).to_json()) + 1
    got: list[int] = []
    held: dict[str, int] = {}

    async def read():
        await anyio.sleep(5)  # stalled
        held["published"] = sink.stats().published
        data = b""
        while True:
            await anyio.wait_readable(reader)
            try:
                chunk = os.read(reader, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                break  # the sink closed its end
            data += chunk
        got.extend(json.loads(line)["seq"] for line in data.decode().splitlines())

    async def produce():
        for seq in range(500):
            await sink.room()
            sink.publish(message(seq))
        await sink.aclose(timeout=30)

    # The outer bound is the test's timeout: under virtual time, a deadline would be jumped to
    # while the writer thread works (the loop sees nothing to do), so none is set in here.
    async with virtual_time():
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            tg.start_soon(produce)
    assert got == list(range(500))
    # The producer was held: no more than the backlog, the line being written and what fits in
    # the pipe (64 KiB) had been published when the reader came back.
    assert held["published"] <= 20 + 1 + 65536 // line_size + 1 < 500
    stats = sink.stats()
    assert (stats.published, stats.delivered, stats.dropped) == (500, 500, 0)
    assert_exact(stats)


async def test_standard_output_closed_by_its_reader_ends_the_sink_without_failing_it(
    monkeypatch, captured_logs
):
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        sink = JsonLinesSink("-")
        os.close(read_end)  # `| head` has what it wanted
        sink.publish(message(0))
        with anyio.fail_after(10):
            failure = await sink.wait_failure()
        assert isinstance(failure, ReaderClosed) and not isinstance(failure, SinkFailed)
        stats = await sink.aclose()
    assert stats.closed_by_reader and stats.failed is None
    assert (stats.published, stats.delivered, stats.dropped) == (1, 0, 1)
    assert not [e for e in captured_logs if e["event"] == "sink failed"]


async def test_a_fifo_closed_by_its_reader_is_a_failure(tmp_path):
    path = tmp_path / "out.fifo"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    sink = JsonLinesSink(path)
    os.close(reader)
    sink.publish(message(0))
    with anyio.fail_after(10):
        failure = await sink.wait_failure()
    assert isinstance(failure, SinkFailed) and "EPIPE" in str(failure)
    assert_exact(await sink.aclose())


async def test_closing_writes_what_is_held_for_a_reading_reader(fifo):
    path, reader = fifo
    sink = JsonLinesSink(path, delivery=Mode.REPLAY, backlog=1000)
    for seq in range(100):
        sink.publish(message(seq))
    got: list[dict] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, lambda: got.extend(read_to_end(reader)))
        stats = await sink.aclose(timeout=30)
    assert [line["seq"] for line in got] == list(range(100))
    assert (stats.delivered, stats.dropped) == (100, 0)
    sink.publish(message(100))  # after closing: counted, not written
    assert sink.stats().dropped == 1
    with anyio.fail_after(1):
        assert await sink.wait_failure() is None  # closed without failing


def test_a_backlog_that_bounds_nothing_is_refused(tmp_path):
    with pytest.raises(ValueError, match="backlog must be"):
        JsonLinesSink(tmp_path / "out.jsonl", backlog=0)
