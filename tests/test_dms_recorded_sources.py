"""Recorded inputs pay what a live camera pays: a recording, a video file or a route segment is
read ahead on its source's worker thread and, paced, handed on at each frame's recorded end of
frame; a source that falls behind skips what it could only deliver stale — reading on where it
can catch up so, a segment skipping to its next keyframe unread where it cannot, never silent —
and the service counts the frames skipped as dropped at the camera. In virtual time, the clock
held while the source's thread works."""

from __future__ import annotations

import itertools
import threading
import time
import types

import anyio
import numpy as np
import pytest
from openpilot_segments import build_segment
from test_dms_service import run

from aio_runtime import Ledger, use_ledger
from aio_runtime.testing import threads_busy, virtual_time
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.frames import segment as segments
from pipelines.dms.frames.frame import Frame, nv12_layout
from pipelines.dms.frames.recorded import AHEAD, GiveWay
from pipelines.dms.frames.recording import record_frames
from pipelines.dms.frames.replay import ReplayCamera
from pipelines.dms.frames.segment import SegmentCamera
from pipelines.dms.frames.source import clock_ns
from pipelines.dms.service._calibration import CalibrationState
from pipelines.dms.service._job import FrameJob
from pipelines.dms.service._stages import Model

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

PERIOD_NS = 50_000_000
READOUT_NS = 11_000_000


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # hold= is for asyncio's loop


async def _frames(count: int):
    layout = nv12_layout(64, 48)
    for k in range(count):
        sof = 1_000_000_000 + k * PERIOD_NS
        buffer = np.full(layout.size, k % 250, np.uint8)
        yield Frame(buffer, 64, 48, layout.stride, frame_id=k, timestamp_sof=sof,
                    timestamp_eof=sof + READOUT_NS)  # fmt: skip


@pytest.fixture
async def recording(tmp_path):
    path = tmp_path / "drive.dmsrec"
    with anyio.fail_after(60):
        await record_frames(_frames(40), path)
    return path


def held(ledger):
    """Virtual time that stands still while the source's thread works (and waits 20 ms of real
    time before each jump: a read's end wakes the loop just after it leaves the ledger)."""
    return virtual_time(autojump_threshold=0.02, hold=threads_busy(ledger))


async def test_a_recorded_source_reads_ahead_of_the_frame_it_hands_on(recording, monkeypatch):
    started: list[tuple[int, int]] = []  # (record read, frames handed on by then)
    read = ReplayCamera._read_recorded

    def reading(self):
        started.append((self._next, self.delivered))
        return read(self)

    monkeypatch.setattr(ReplayCamera, "_read_recorded", reading)
    with use_ledger(Ledger()) as ledger:
        async with held(ledger), ReplayCamera(recording) as camera:
            with anyio.fail_after(30):
                frames = [frame.frame_id async for frame in camera]
    assert frames == list(range(40))
    # each record's read began while the frame AHEAD before it was still to be handed on
    reads = [(index, delivered) for index, delivered in started if AHEAD <= index < 40]
    assert len(reads) == 40 - AHEAD and all(done <= index - AHEAD for index, done in reads)


async def test_a_paced_recording_hands_each_frame_on_at_its_recorded_end_of_frame(recording):
    arrivals: list[tuple[Frame, int]] = []
    with use_ledger(Ledger()) as ledger:
        async with held(ledger), ReplayCamera(recording) as camera:
            with anyio.fail_after(30):
                async for frame in camera:
                    arrivals.append((frame, clock_ns()))
    first = arrivals[0][0]
    for frame, at in arrivals:
        assert frame.recorded_sof - first.recorded_sof == frame.timestamp_sof - first.timestamp_sof
        assert at == frame.timestamp_eof  # at its end of frame: its reading cost no age
    assert camera.skipped == 0


async def test_a_paced_recording_that_falls_behind_catches_up_by_reading_on(recording):
    """Its consumer is away for 0.6 s after frame 5: the frames that would now be older than the
    staleness bound are skipped, and since its reads are quicker than the frames' spacing the
    source reads on to the frame due then, handed on at its own end of frame."""
    delivered: list[tuple[Frame, int]] = []
    with use_ledger(Ledger()) as ledger:
        async with held(ledger), ReplayCamera(recording) as camera:
            with anyio.fail_after(30):
                async for frame in camera:
                    delivered.append((frame, clock_ns()))
                    if frame.frame_id == 5:
                        await anyio.sleep(0.6)
    ids = [frame.frame_id for frame, _ in delivered]
    gap = ids.index(5) + 1
    assert ids[:gap] == list(range(6)) and ids[gap:] == list(range(ids[gap], 40))
    assert ids[gap] >= 5 + 12 - 2  # 0.6 s is 12 periods: at most the bound's two left
    assert camera.skipped == ids[gap] - 6
    stale_ns = round(camera.stale_after * 1e9)
    assert all(at <= frame.timestamp_eof + stale_ns for frame, at in delivered)


def slow_decodes(monkeypatch) -> list[int]:
    """Every frame of a segment takes 60 ms to decode (more than its 50 ms spacing: a decoder
    that cannot catch up by decoding), held in virtual time; the count of frames decoded."""
    decoded: list[int] = []
    decode = segments.nv12_from_video

    def slow(frame):
        decoded.append(1)
        time.sleep(0.06)
        return decode(frame)

    monkeypatch.setattr(segments, "nv12_from_video", slow)
    return decoded


async def test_a_segment_that_cannot_catch_up_skips_to_its_next_keyframe_unread(
    tmp_path, monkeypatch
):
    built = build_segment(tmp_path / "seg--0", frames=40, keyframe_every=10)
    decoded = slow_decodes(monkeypatch)
    ids: list[int] = []
    with use_ledger(Ledger()) as ledger:
        async with held(ledger), SegmentCamera(built.path) as camera:
            with anyio.fail_after(60):
                async for frame in camera:
                    ids.append(frame.frame_id)
                    if len(ids) == 3:
                        await anyio.sleep(0.5)  # 10 periods away: behind frame 13 or so
    resumed = ids[3] - built.frames[0].frame_id
    assert resumed == 20  # the next keyframe at or after the frame due then
    assert camera.skipped == resumed - 3
    # decoded: the three handed on, those read ahead meanwhile, and from the keyframe on; not
    # the frames between, up to the keyframe
    assert len(decoded) <= 3 + 2 * (AHEAD + 1) + (40 - 20) < 40


async def test_a_segment_that_cannot_catch_up_nor_skip_hands_on_stale_frames_not_silence(
    tmp_path, monkeypatch
):
    """No keyframe but the first: behind, it has nothing to skip to, and rather than go silent
    it hands on the frame it has once it has handed on none for stale_after."""
    built = build_segment(tmp_path / "seg--0", frames=30)
    slow_decodes(monkeypatch)
    handed: list[tuple[Frame, int]] = []
    with use_ledger(Ledger()) as ledger:
        async with held(ledger), SegmentCamera(built.path) as camera:
            with anyio.fail_after(60):
                async for frame in camera:
                    handed.append((frame, clock_ns()))
                    if len(handed) == 3:
                        await anyio.sleep(0.5)
    assert len(handed) > 3 and camera.skipped > 0
    assert len(handed) + camera.skipped == 30  # every frame handed on or skipped, counted
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(handed[3:])]
    assert max(gaps, default=0) <= round(2 * camera.stale_after * 1e9)  # never silent long


async def test_the_frames_a_recorded_source_skips_are_dropped_at_the_camera_and_counted(
    recording,
):
    class Away(ReplayCamera):
        """A recording whose consumer's loop is not scheduled for 0.6 s at frame 10."""

        async def _next_recorded(self):
            frame = await super()._next_recorded()
            if frame is not None and frame.frame_id == 10:
                clock.jump(0.6)
            return frame

    config = ServiceConfig(device="cpu", health_port=None, calib=(0.0, 0.0, 0.0))
    with use_ledger(Ledger()) as ledger:
        async with held(ledger) as clock:
            service, messages = await run(config, Away(recording), within=30)
    frames = service.summary.frames
    frames.check()
    assert frames.dropped["camera"] >= 8 and frames.received == 40
    published = {m.frame_id for m in messages if m.frame_id >= 0}
    assert len(published) + sum(frames.dropped.values()) == 40
    assert not any(m.availability == "unavailable" and m.reason_kind == "camera" for m in messages)


# --- a model's run and a recorded source's reads take turns -----------------------------------


def test_reads_give_way_while_anything_holds_them():
    gives_way = GiveWay()
    assert gives_way.wait(0)
    with gives_way.held():
        with gives_way.held():
            assert not gives_way.wait(0)
        assert not gives_way.wait(0)  # one hold let go, one still held
    assert gives_way.wait(0)


async def test_a_recorded_source_s_read_waits_while_its_reads_give_way(recording, monkeypatch):
    """Held, the next read ahead does not start (it waits on the worker thread) until let go;
    the frames read already are handed on meanwhile."""
    waiting = threading.Event()
    wait = GiveWay.wait

    def waits(self, timeout):
        waiting.set()
        return wait(self, timeout)

    monkeypatch.setattr(GiveWay, "wait", waits)
    started: list[tuple[int, bool]] = []  # (record read, whether nothing held the reads)
    read = ReplayCamera._read_recorded

    def reading(self):
        started.append((self._next, self.gives_way.wait(0)))
        return read(self)

    monkeypatch.setattr(ReplayCamera, "_read_recorded", reading)
    with anyio.fail_after(30):
        async with ReplayCamera(recording, paced=False) as camera:
            camera.gives_way = GiveWay()
            assert (await anext(camera)).frame_id == 0
            for pending in list(camera._reads):
                await pending.done.wait()
            assert camera.ready_ahead == AHEAD
            with camera.gives_way.held():
                waiting.clear()
                assert (await anext(camera)).frame_id == 1  # read before: handed on
                await anyio.to_thread.run_sync(waiting.wait, 10)  # the next read waits...
                assert [index for index, _ in started] == [0, 1, 2]  # ...unstarted
                assert camera.ready_ahead == AHEAD - 1
            for pending in list(camera._reads):
                await pending.done.wait()
            assert camera.ready_ahead == AHEAD
            frames = [frame.frame_id async for frame in camera]
    assert frames == list(range(2, 40))
    assert [index for index, _ in started if index < 40] == list(range(40))
    assert all(free for _, free in started)


async def test_a_read_held_back_waits_at_most_the_staleness_bound(recording):
    """Reads that give way to work that never lets go still come, each after the bound."""
    with anyio.fail_after(30):
        async with ReplayCamera(recording, paced=False) as camera:
            camera.gives_way, camera.stale_after = GiveWay(), 0.005
            with camera.gives_way.held():
                frames = [frame.frame_id async for frame in camera]
    assert frames == list(range(40))


class _Camera:
    """The camera stage as the model stage sees it: whether its source's reads are behind."""

    def __init__(self, *, behind: bool) -> None:
        self.gives_way = GiveWay()
        self.behind = behind

    def reads_behind(self) -> bool:
        return self.behind


class _Policy:
    def __init__(self, *, overloaded: bool) -> None:
        self.overloaded = overloaded

    def admits(self, at: float, stale_at: float) -> bool:
        return True


class _Outcomes:
    def __init__(self) -> None:
        self.dropped_at: list[str] = []

    def dropped(self, stage: str, job) -> None:
        self.dropped_at.append(stage)

    def stage_done(self, job, stage: str, seconds: float) -> None:
        pass


class _Backend:
    runs_back_to_back = True

    def __init__(self, camera: _Camera) -> None:
        self.camera = camera
        self.reads_held: list[bool] = []  # per run: whether the camera's reads were held back

    async def infer(self, image, calib):
        self.reads_held.append(not self.camera.gives_way.wait(0))
        return np.zeros(1, np.float32), 0.0


class _Outbox:
    def __init__(self) -> None:
        self.sent: list[int] = []

    async def send(self, job) -> None:
        self.sent.append(job.number)


def _model_step(*, overloaded: bool, behind: bool):
    camera = _Camera(behind=behind)
    backend = _Backend(camera)
    outcomes, outbox = _Outcomes(), _Outbox()
    model = Model(
        None,  # type: ignore[arg-type]  # the device: its session is handed to the step
        CalibrationState(stale_after=1.0),
        policy=_Policy(overloaded=overloaded),  # type: ignore[arg-type]
        outcomes=outcomes,  # type: ignore[arg-type]
        camera=camera,  # type: ignore[arg-type]
    )
    layout = nv12_layout(64, 48)
    frame = Frame(np.zeros(layout.size, np.uint8), 64, 48, layout.stride, frame_id=0,
                  timestamp_sof=0, timestamp_eof=READOUT_NS)  # fmt: skip
    start = time.monotonic()
    job = FrameJob(frame, 0, start, start + 0.05, start + 10.0)
    job.image = np.zeros((1, 8), np.uint8)
    session = types.SimpleNamespace(backend=backend)
    return model, job, session, backend, outcomes, outbox


@pytest.mark.parametrize("overloaded", [False, True])
async def test_a_model_run_holds_a_recorded_source_s_reads_back_while_it_runs(overloaded):
    model, job, session, backend, outcomes, outbox = _model_step(
        overloaded=overloaded, behind=False
    )
    with anyio.fail_after(30):
        await model._step(job, session, outbox)
    assert backend.reads_held == [True] and outbox.sent == [0] and not outcomes.dropped_at
    assert model.camera.gives_way.wait(0)  # let go after the run


@pytest.mark.parametrize("overloaded", [False, True])
async def test_an_overloaded_service_leaves_a_source_with_no_frame_read_ahead_the_cpu(overloaded):
    """Overloaded, a frame is not started while the camera's recorded source has read no
    frame ahead: dropped (overload), its CPU left to the reading. Not overloaded, it is run."""
    model, job, session, backend, outcomes, outbox = _model_step(overloaded=overloaded, behind=True)
    with anyio.fail_after(30):
        await model._step(job, session, outbox)
    if overloaded:
        assert outcomes.dropped_at == ["overload"] and not backend.reads_held and not outbox.sent
    else:
        assert not outcomes.dropped_at and backend.reads_held == [True] and outbox.sent == [0]
