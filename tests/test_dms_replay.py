"""Replay mode: a file through the service as fast as the stages go, each stage waiting for the
next, nothing dropped; and the duration bound of a live run, whatever the camera does."""

from __future__ import annotations

import anyio
import numpy as np
import pytest
from test_dms_service import run
from test_dms_service_io import CPU, cabin_recording

from aio_runtime import Ledger, now, use_ledger
from aio_runtime.testing import threads_busy, virtual_time
from pipelines.dms.config.kinds import Mode
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.frames.frame import Frame
from pipelines.dms.frames.recording_reader import RecordingReader
from pipelines.dms.frames.source import CLOSE_BOUND, clock_ns, closing
from pipelines.dms.service import DmsService

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

GRACE = 0.005
"""Real seconds the virtual clock waits before each jump (see test_dms_service_virtual_time)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # hold= is for asyncio's loop


async def test_a_replay_goes_as_fast_as_the_stages_and_drops_no_frame(tmp_path):
    path = tmp_path / "cabin.dmsrec"
    ids = list(range(40))
    cabin_recording(path, ids, 1_700_000_000 * 10**9)  # 40 periods: 2 s as recorded
    config = ServiceConfig(
        camera=str(path), mode=Mode.REPLAY, no_budget=True, health_port=None, **CPU
    )
    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=GRACE, hold=threads_busy(ledger)) as clock:
            start = clock.now()
            with anyio.fail_after(30):
                _, messages = await run(config)
            elapsed = clock.now() - start
    assert [m.frame_id for m in messages] == ids  # every frame, in order: none dropped
    assert [m.seq for m in messages] == list(range(len(ids)))
    assert elapsed < 0.5  # unpaced: no frame waited for its recorded instant (2 s as recorded)
    first = next(k for k, m in enumerate(messages) if m.valid)
    assert all(m.valid for m in messages[first:])  # no budget: nothing is late


async def test_a_replay_hands_each_frame_on_and_counts_it(tmp_path):
    path = tmp_path / "cabin.dmsrec"
    cabin_recording(path, list(range(12)), 10**12)
    config = ServiceConfig(camera=str(path), mode="replay", health_port=None, **CPU)
    with anyio.fail_after(60):
        service, messages = await run(config)
    frames = service.summary.frames
    frames.check()
    assert frames.received == 12 and not frames.dropped
    assert len(messages) == 12 and service.source_length == 12


async def test_the_duration_bounds_a_live_run_whatever_the_camera_does():
    async def one_frame_then_an_hour_of_nothing():
        sof = clock_ns()
        y, uv = np.full((760, 1344), 90, np.uint8), np.full((380, 1344), 128, np.uint8)
        yield Frame.from_planes(y, uv, frame_id=0, timestamp_sof=sof, timestamp_eof=sof + 1)
        await anyio.sleep(3600)  # a recording with a long gap, a camera that stopped

    config = ServiceConfig(duration=3.0, health_port=None, **CPU)
    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=GRACE, hold=threads_busy(ledger)):
            with anyio.fail_after(60):  # virtual seconds: an unbounded run would take an hour
                started = now()
                service, _ = await run(config, one_frame_then_an_hour_of_nothing())
                ended = now()
    assert 3.0 <= ended - started < 4.0
    assert service.summary.frames.received == 1


@pytest.mark.parametrize("ended_by", ["duration", "stop"])
async def test_a_recording_played_live_is_closed_when_the_run_ends_before_it(
    tmp_path, monkeypatch, ended_by
):
    """A 3 s recording, as a live camera, in a run that ends at 1 s: by its duration, or
    stopped (as by a signal). The recording's file is closed either way."""
    path = tmp_path / "cabin.dmsrec"
    cabin_recording(path, list(range(60)), 10**12)
    opened: list[RecordingReader] = []
    closed: list[RecordingReader] = []
    open_reader, close_reader = RecordingReader.__init__, RecordingReader.close

    def recorded_open(self, *args, **kwargs):
        open_reader(self, *args, **kwargs)
        opened.append(self)

    def recorded_close(self):
        close_reader(self)
        closed.append(self)

    monkeypatch.setattr(RecordingReader, "__init__", recorded_open)
    monkeypatch.setattr(RecordingReader, "close", recorded_close)
    duration = 1.0 if ended_by == "duration" else None
    config = ServiceConfig(camera=str(path), duration=duration, health_port=None, **CPU)
    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=GRACE, hold=threads_busy(ledger)):
            with anyio.fail_after(30):
                started = now()
                async with DmsService(config) as service:
                    if ended_by == "duration":
                        await service.finished()
                    else:
                        await anyio.sleep(1.0)
                ended = now()
    assert 1.0 <= ended - started < 1.5
    assert 0 < service.summary.frames.received < 60  # it ended before the recording did
    assert len(opened) == 1 and closed == opened


async def test_a_replay_waits_for_a_reader_that_stalls_and_loses_nothing(tmp_path):
    path = tmp_path / "cabin.dmsrec"
    ids = list(range(30))
    cabin_recording(path, ids, 10**12)
    config = ServiceConfig(
        camera=str(path), mode=Mode.REPLAY, no_budget=True, health_port=None, **CPU
    )
    got = []
    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=GRACE, hold=threads_busy(ledger)) as clock:
            with anyio.fail_after(60):
                async with DmsService(config) as service:
                    reader = service.messages(backlog=4)

                    async def read():
                        async for message in reader:
                            got.append(message)
                            if len(got) == 5:
                                stalled_at = clock.now()
                                await anyio.sleep(5.0)  # the reader stalls for 5 s
                                assert clock.now() - stalled_at >= 5.0

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(read)
                        await service.finished()
                        tg.cancel_scope.cancel()
    assert [m.frame_id for m in got] == ids and [m.seq for m in got] == list(range(30))
    frames = service.summary.frames
    frames.check()
    assert not frames.dropped
    (subscriptions,) = (s for s in service.summary.sinks if s.name == "subscriptions")
    assert subscriptions.dropped == 0


async def test_live_a_stalled_reader_loses_only_what_is_counted():
    config = ServiceConfig(frames=40, health_port=None, **CPU)
    got = []
    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=GRACE, hold=threads_busy(ledger)):
            with anyio.fail_after(60):
                async with DmsService(config) as service:
                    reader = service.messages(backlog=8)

                    async def read():
                        async for message in reader:
                            got.append(message)
                            if len(got) == 3:
                                await anyio.sleep(3600)  # never reads again

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(read)
                        await service.finished()
                        tg.cancel_scope.cancel()
    (subscriptions,) = (s for s in service.summary.sinks if s.name == "subscriptions")
    published = service.summary.frames.ended - sum(service.summary.frames.dropped.values())
    assert subscriptions.published == published
    assert subscriptions.dropped == subscriptions.published - subscriptions.delivered > 0


async def test_a_source_whose_close_never_ends_is_left_behind_within_the_bound():
    """A caller's source whose cleanup hangs holds the run's end up for CLOSE_BOUND, no more."""
    closed: list[str] = []

    class Stuck:
        def __aiter__(self):
            return self

        async def __anext__(self):
            raise StopAsyncIteration

        async def aclose(self) -> None:
            closed.append("asked")
            await anyio.Event().wait()  # never set

    async with virtual_time():
        start = now()
        with anyio.CancelScope() as scope:
            async with closing(Stuck()):
                scope.cancel()  # the run is stopped: the close still runs, shielded
        assert closed == ["asked"] and now() - start == pytest.approx(CLOSE_BOUND)
