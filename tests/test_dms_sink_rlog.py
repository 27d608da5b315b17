"""openpilot's log as a sink: Events in order, compressed by the name, readable after a kill;
live drops counted, replays lossless; full disks and bad paths."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import anyio
import pytest
import zstandard
from dms_messages import message
from sink_checks import assert_exact, fill_disk

from pipelines.dms.config.kinds import Mode
from pipelines.dms.openpilot.events import DRIVER_STATE, STATUS, events_of, read_events
from pipelines.dms.openpilot.logs import BZ2_MAGIC, ZSTD_MAGIC, read_log, read_log_bytes
from pipelines.dms.sinks.base import LIVE_BACKLOG, SinkFailed
from pipelines.dms.sinks.rlog import RlogSink, _Bz2Stream, _ZstdStream

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("rlog.zst", "rlog.bz2", "rlog")


def messages(count: int, start: int = 0):
    """Frames' messages, each with its own publish time; every fifth a camera-stall status."""
    for seq in range(start, start + count):
        sent = dataclasses.replace(message(seq), log_mono_time=5_000_000_000 + seq * 50_000_000)
        if seq % 5 == 4:
            sent = dataclasses.replace(message(seq, valid=False), frame_id=-1, timestamp_sof=0)
        yield sent


def seqs_in(events) -> list[int]:
    """The ``seq`` of each status Event, with the driverStateV2 Events checked in between: one
    before its message's status exactly when the message is a frame's."""
    seqs, frame_before = [], None
    for event in events:
        if event.which() == DRIVER_STATE:
            assert frame_before is None
            frame_before = event.driverStateV2.frameId
        else:
            status = event.dmsStatus
            assert (frame_before is None) == (status.frameId == -1)
            assert frame_before in (None, status.frameId)
            seqs.append(status.seq)
            frame_before = None
    return seqs


@pytest.mark.parametrize("name", NAMES)
async def test_a_replay_writes_every_message_as_its_events_in_order(tmp_path, name):
    path = tmp_path / name
    sink = RlogSink(path, delivery=Mode.REPLAY, backlog=4)
    sent = list(messages(300))
    for item in sent:
        await sink.room()
        sink.publish(item)
    stats = await sink.aclose(timeout=30)
    assert (stats.published, stats.delivered, stats.dropped) == (300, 300, 0)
    assert_exact(stats)
    # The very bytes of each message's Events, concatenated in order: nothing lost or reordered.
    assert read_log_bytes(path) == b"".join(e for item in sent for _, e in events_of(item))
    events = list(read_log(path))
    assert seqs_in(events) == list(range(300))
    assert [e.logMonoTime for e in events if e.which() == STATUS] == [
        item.log_mono_time for item in sent
    ]
    assert stats.name == f"rlog {path}" and stats.delivery is Mode.REPLAY


@pytest.mark.parametrize(
    ("name", "magic", "compression"),
    [("rlog.zst", ZSTD_MAGIC, "zstd"), ("a.bz2", BZ2_MAGIC, "bz2"), ("rlog", b"", None)],
)
def test_the_name_decides_the_compression(tmp_path, name, magic, compression):
    sink = RlogSink(tmp_path / name)
    sink.publish(message(0))
    sink.close()
    raw = (tmp_path / name).read_bytes()
    assert sink.compression == compression and raw.startswith(magic)
    if compression is None:
        assert raw == b"".join(e for _, e in events_of(message(0)))


def test_a_zstd_log_is_one_stream_whose_frame_ends_at_close(tmp_path):
    path = tmp_path / "rlog.zst"
    sink = RlogSink(path)
    for item in messages(50):
        sink.publish(item)
    sink.close()
    decompressor = zstandard.ZstdDecompressor().decompressobj()
    data = decompressor.decompress(path.read_bytes())
    assert decompressor.eof and decompressor.unused_data == b""  # one frame, ended, no more
    assert seqs_in(read_events(data)) == list(range(50))


@pytest.mark.parametrize(
    ("name", "stream", "delivered"), [("rlog.bz2", _Bz2Stream, 0), ("rlog.zst", _ZstdStream, 10)]
)
def test_delivered_means_readable_zstd_at_each_write_bz2_once_its_stream_ends(
    tmp_path, monkeypatch, name, stream, delivered
):
    """Ten messages written, the writer then held inside its next write: a zstd log has
    delivered all ten (each write's block flushed), a bz2 log none (its stream has not ended)."""
    given, release = threading.Condition(), threading.Event()
    count = [0]
    encode = stream.encode

    def counted(self, records):
        with given:
            count[0] += len(records)
            given.notify_all()
        if count[0] > 10:
            assert release.wait(30)
        return encode(self, records)

    monkeypatch.setattr(stream, "encode", counted)
    sink = RlogSink(tmp_path / name)
    sent = list(messages(11))
    try:
        for item in sent[:10]:
            sink.publish(item)
        with given:
            assert given.wait_for(lambda: count[0] == 10, timeout=10)
        sink.publish(sent[10])
        with given:  # the writer counted what it wrote of the first ten, and is held
            assert given.wait_for(lambda: count[0] == 11, timeout=10)
        held = sink.stats()
        assert (held.published, held.delivered, held.pending) == (11, delivered, 11 - delivered)
    finally:
        release.set()
    stats = sink.close()
    assert (stats.published, stats.delivered, stats.dropped) == (11, 11, 0)
    assert seqs_in(read_log(tmp_path / name)) == list(range(11))


@pytest.fixture
def held_writer(monkeypatch):
    """``held.entered`` is set once the writer is inside its first write; it stays there until
    ``held.release`` is set."""
    entered, release = threading.Event(), threading.Event()
    encode = _ZstdStream.encode

    def held(self, records):
        entered.set()
        assert release.wait(30)
        return encode(self, records)

    monkeypatch.setattr(_ZstdStream, "encode", held)
    yield entered, release
    release.set()


def test_a_live_log_whose_writer_is_behind_drops_the_oldest_counted_exactly(
    tmp_path, held_writer, captured_logs
):
    entered, release = held_writer
    path = tmp_path / "rlog.zst"
    sink = RlogSink(path)
    sink.publish(message(0))
    assert entered.wait(10)  # the writer holds message 0, and is stuck writing it
    for seq in range(1, LIVE_BACKLOG + 6):
        sink.publish(message(seq))  # never blocks
    behind = sink.stats()
    assert (behind.published, behind.dropped, behind.pending) == (LIVE_BACKLOG + 6, 5, 201)
    release.set()
    stats = sink.close(timeout=30)
    assert (stats.delivered, stats.dropped) == (LIVE_BACKLOG + 1, 5)
    assert_exact(stats)
    assert seqs_in(read_log(path)) == [0, *range(6, LIVE_BACKLOG + 6)]  # 1-5 were the oldest
    started = [e for e in captured_logs if e["event"] == "sink dropping messages"]
    stopped = [e for e in captured_logs if e["event"] == "sink stopped dropping"]
    assert len(started) == 1 and len(stopped) == 1 and stopped[0]["dropped"] == 5


def test_closing_past_its_bound_counts_what_is_left_as_dropped(tmp_path, held_writer):
    _, release = held_writer
    sink = RlogSink(tmp_path / "rlog.zst")
    for item in messages(20):
        sink.publish(item)
    stats = sink.close(timeout=0.05)  # the writer is held: nothing gets written
    assert (stats.published, stats.delivered, stats.dropped) == (20, 0, 20)
    assert_exact(stats)
    release.set()
    sink.publish(message(20))  # after closing: counted, not written
    assert sink.stats().dropped == 21


@pytest.mark.parametrize("delivery", list(Mode))
async def test_a_full_disk_fails_the_sink_at_once_typed(tmp_path, delivery, captured_logs):
    path = tmp_path / "rlog.zst"
    sink = RlogSink(path, delivery=delivery, backlog=2)
    fill_disk(path)  # the disk fills: the log's descriptor now writes where there is no space
    sink.publish(message(0))
    with anyio.fail_after(10):
        failure = await sink.wait_failure()
        for seq in range(1, 6):
            await sink.room()  # a failed sink never holds a replay
            sink.publish(message(seq))
    assert isinstance(failure, SinkFailed) and "No space left on device" in str(failure)
    assert str(path) in str(failure) and sink.failure() is failure
    stats = await sink.aclose()
    assert stats.failed == str(failure)
    assert (stats.published, stats.delivered, stats.dropped) == (6, 0, 6)
    assert_exact(stats)
    assert len([e for e in captured_logs if e["event"] == "sink failed"]) == 1


KILLED_WRITER = textwrap.dedent(
    """
    import dataclasses, sys, time
    sys.path.insert(0, "tests")
    from dms_messages import message
    from pipelines.dms.sinks.rlog import RlogSink

    # A backlog the 30 s of publishing cannot fill: a writer thread slow to start on a busy host
    # drops nothing, so what reads back is a prefix of what was published
    sink = RlogSink(sys.argv[1], backlog=100_000)
    seq = 0
    ready = False
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        sink.publish(dataclasses.replace(message(seq), log_mono_time=seq))
        seq += 1
        if not ready and sink.stats().delivered >= 100:
            # killed from here on, mid-publishing
            print("ready" if sink.stats().dropped == 0 else "dropped", flush=True)
            ready = True
        time.sleep(0.0005)
    """
)


def test_a_zstd_log_whose_writer_was_killed_reads_back_whole_events_in_order(tmp_path):
    path = tmp_path / "rlog.zst"
    with subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == b"ready\n"
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
        finally:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    events = list(read_log(path))  # the frame was never ended: its flushed blocks read whole
    seqs = seqs_in(events)
    assert len(seqs) >= 100 and seqs == list(range(len(seqs)))
    assert [e.logMonoTime for e in events if e.which() == STATUS] == seqs


def test_a_path_that_exists_is_refused_whatever_it_is(tmp_path):
    earlier = tmp_path / "rlog"
    earlier.write_bytes(b"an earlier run's")
    for path in (earlier, Path("/dev/null")):
        with pytest.raises(ValueError, match="exists") as refused:
            RlogSink(path)
        assert "\n" not in str(refused.value) and str(path) in str(refused.value)
    assert earlier.read_bytes() == b"an earlier run's"


@pytest.mark.parametrize(
    ("name", "complaint"),
    [
        ("out.txt", r"\.zst \(zstd\), \.bz2 or no extension"),
        ("rlog.zstd", r"\.zst \(zstd\), \.bz2 or no extension"),
        ("missing/rlog.zst", "directory .* does not exist"),
        ("file/rlog", "is not a directory"),
        (".", "is a directory|exists"),
    ],
)
def test_a_path_that_cannot_be_a_log_is_refused_in_one_line(tmp_path, name, complaint):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=complaint) as refused:
        RlogSink(tmp_path / name)
    assert "\n" not in str(refused.value) and str(tmp_path) in str(refused.value)
    assert not (tmp_path / "out.txt").exists()


def test_a_backlog_that_bounds_nothing_is_refused(tmp_path):
    with pytest.raises(ValueError, match="backlog must be"):
        RlogSink(tmp_path / "rlog", backlog=0)
    assert not (tmp_path / "rlog").exists()


def test_messages_are_encoded_once_for_every_sink_that_asks(monkeypatch):
    from pipelines.dms.openpilot import events

    calls = []
    encode = events.encode
    monkeypatch.setattr(events, "encode", lambda item: calls.append(item) or encode(item))
    sent = message(3)
    assert events.events_of(sent) is events.events_of(sent) and len(calls) == 1
    assert [member for member, _ in events.events_of(sent)] == [DRIVER_STATE, STATUS]
