"""An openpilot route segment through the service: ``aio-dms replay SEGMENT`` publishes one message
per frame the log times, with the log's frame ids and timestamps, and loses none;
``aio-dms run --camera SEGMENT`` plays it at the log's pace; a segment that cannot be replayed is
refused before the service starts (nothing opened, nothing written), and one whose video breaks
mid-way is a camera that failed."""

from __future__ import annotations

import json
import re

import anyio
import pytest
from openpilot_segments import build_segment
from test_cli_outputs import CPU, read_lines
from test_dms_service import run as serve
from test_dms_service_io import CPU as CPU_SETTINGS
from test_openpilot_segments import BAD_SEGMENTS

from aio_runtime import Ledger, use_ledger
from aio_runtime.testing import threads_busy, virtual_time
from pipelines.cli import main
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.service import DmsService, StartupError
from pipelines.exit_codes import ExitCode

pytestmark = pytest.mark.timeout(120)

SIZE = (1344, 760)
"""A cabin camera's geometry: the warp and the model take its frames."""


def frame_records(path) -> list[dict]:
    return [record for record in read_lines(path) if record["frameId"] >= 0]


def test_aio_dms_replay_of_a_segment_publishes_every_timed_frame_with_the_log_s_ids(
    tmp_path, capsys
):
    built = build_segment(tmp_path / "route--2", frames=12, size=SIZE, dropped={3, 7, 8},
                          log="rlog.zst")  # fmt: skip
    out = tmp_path / "out.jsonl"
    argv = ["replay", str(built.path), *CPU, "--no-budget", "--jsonl", str(out)]
    code = main([*argv, "--summary-json", str(tmp_path / "summary.json")])
    captured = capsys.readouterr()
    assert code == ExitCode.OK, captured.err
    records = frame_records(out)
    assert [r["frameId"] for r in records] == built.frame_ids  # one each, in order: none lost
    assert [(r["recordedTimestampSof"], r["recordedTimestampEof"]) for r in records] == [
        (logged.timestamp_sof, logged.timestamp_eof) for logged in built.frames
    ]
    assert all(r["valid"] and r["leftDriverData"] for r in records[3:])  # warped and modelled
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["frames"]["received"] == 9 and summary["input"] == str(built.path)


def test_aio_dms_run_takes_a_segment_as_its_camera(tmp_path, capsys):
    built = build_segment(tmp_path / "route--0", frames=6, size=SIZE)
    out = tmp_path / "out.jsonl"
    code = main(["run", "--camera", str(built.path), *CPU, "--jsonl", str(out)])
    assert code == ExitCode.OK, capsys.readouterr().err
    assert [r["frameId"] for r in frame_records(out)] == built.frame_ids


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # hold= is for asyncio's loop
async def test_a_segment_played_live_keeps_the_log_s_pace(tmp_path, anyio_backend):
    built = build_segment(tmp_path / "route--0", frames=10, size=SIZE, dropped={4, 5})
    config = ServiceConfig(camera=str(built.path), health_port=None, **CPU_SETTINGS)
    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=0.005, hold=threads_busy(ledger)) as clock:
            start = clock.now()
            with anyio.fail_after(60):
                service, messages = await serve(config)
            elapsed = clock.now() - start
    frames = [m for m in messages if m.frame_id >= 0]
    assert [m.frame_id for m in frames] == built.frame_ids
    spacing = [m.timestamp_sof - frames[0].timestamp_sof for m in frames]
    assert spacing == [m.recorded_sof - frames[0].recorded_sof for m in frames]
    assert 9 * 0.05 <= elapsed < 9 * 0.05 + 0.5  # paced: the log's 0.45 s, not as fast as it goes
    assert service.summary.frames.received == 8


@pytest.mark.parametrize(("make", "says"), [
    (BAD_SEGMENTS[name][0], BAD_SEGMENTS[name][2])
    for name in ("no-log", "no-camera-states", "short-video", "not-hevc", "corrupt-log")
], ids=["no-log", "no-camera-states", "short-video", "not-hevc", "corrupt-log"])  # fmt: skip
def test_a_segment_that_cannot_be_replayed_is_refused_before_any_work(tmp_path, capsys, make, says):
    make(segment := tmp_path / "route--0")
    out = tmp_path / "out.jsonl"
    code = main(["replay", str(segment), *CPU, "--jsonl", str(out)])
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == ExitCode.REFUSED, captured.err
    assert len(lines) == 1 and lines[0].startswith("aio-dms replay: ") and "route--0" in lines[0]
    assert re.search(says, lines[0]), lines[0]
    assert not out.exists() and not captured.out  # refused before the sinks opened


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_embedding_application_gets_one_startup_error_for_a_bad_segment(
    tmp_path, ledger, anyio_backend
):
    build_segment(segment := tmp_path / "route--0", frames=6, video_frames=2)
    config = ServiceConfig(camera=str(segment), mode="replay", health_port=None, **CPU_SETTINGS)
    with anyio.fail_after(60):
        with pytest.raises(StartupError, match=r"the video holds 2 frames, its encode index"):
            async with DmsService(config):
                pass


def test_a_segment_whose_video_breaks_mid_way_is_a_camera_that_failed(tmp_path, capsys):
    import av
    import numpy as np

    def noise(position, width, height):
        return np.random.default_rng(position).integers(16, 235, (height, width), np.uint8)

    built = build_segment(tmp_path / "route--0", frames=6, size=SIZE, image=noise)
    video = built.path / "dcamera.hevc"
    with av.open(str(video), format="hevc") as container:
        sizes = [p.size for p in container.demux(container.streams.video[0]) if p.size]
    data = bytearray(video.read_bytes())
    at = sum(sizes[:4]) + 6  # frame 4's slice header
    data[at : at + 8] = b"\xff" * 8
    video.write_bytes(bytes(data))
    out = tmp_path / "out.jsonl"
    code = main(["replay", str(built.path), *CPU, "--no-budget", "--jsonl", str(out)])
    err = capsys.readouterr().err
    assert code == ExitCode.FAILED
    assert "the camera failed: SegmentError" in err and "video frame 4" in err
    assert [r["frameId"] for r in frame_records(out)] == built.frame_ids[:4]


def test_aio_dms_record_records_a_segment_with_the_log_s_frame_ids(tmp_path, capsys):
    from pipelines.dms.frames.recording_reader import RecordingReader

    built = build_segment(tmp_path / "route--0", frames=5, dropped={1})
    out = tmp_path / "out.dmsrec"
    code = main(["record", "--camera", str(built.path), "--frames", "3", "-o", str(out)])
    assert code == ExitCode.OK, capsys.readouterr().err
    with RecordingReader(out) as recording:
        assert [record.frame_id for record in recording.records] == built.frame_ids[:3]
