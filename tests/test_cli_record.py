"""``aio-dms record``: any camera source the service takes, to a recording that ``replay`` reads."""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest
from recordings_v1 import write_v1
from test_cli_stop import _source
from test_dms_camera import gray_images, patch, small_frames, write_video
from test_run_progress import REDRAW, Tty

from pipelines.cli import main
from pipelines.dms.frames.recording_reader import RecordingReader
from pipelines.exit_codes import ExitCode

pytestmark = [pytest.mark.timeout(120)]

CPU = ["--device", "cpu", "--calib", "0,0,0", "--health-port", "-1", "--budget", "2"]


def test_the_synthetic_camera_is_recorded_and_replayed(tmp_path, capsys):
    out = tmp_path / "cabin.dmsrec"
    assert main(["record", "--frames", "8", "-o", str(out)]) == ExitCode.OK
    said = capsys.readouterr().out
    assert said.startswith(f"recorded 8 frames to {out}: ") and "x smaller" in said
    with RecordingReader(out) as reader:
        assert reader.version == 2 and [r.frame_id for r in reader.records] == list(range(8))
        assert (reader.records[0].width, reader.records[0].height) == (1928, 1208)  # by default
        assert all(r.stored < r.size / 20 for r in reader.records)
    assert main(["replay", str(out), *CPU]) == ExitCode.OK
    assert "frames received      8" in capsys.readouterr().out


def test_a_recording_is_recorded_again_frame_for_frame_and_compressed(tmp_path, capsys):
    old, new = tmp_path / "old.dmsrec", tmp_path / "new.dmsrec"
    frames = small_frames(3, step_ns=1_000_000)
    write_v1(old, frames)
    assert main(["record", "--camera", str(old), "--frames", "3", "-o", str(new)]) == 0
    with RecordingReader(new) as reader:
        read = [reader.read(k) for k in range(len(reader))]
    assert [frame.frame_id for frame in read] == [0, 1, 2]
    sofs = [frame.timestamp_sof for frame in read]  # re-timed as a live service sees them ...
    assert [b - a for a, b in itertools.pairwise(sofs)] == [1_000_000] * 2  # ... spaced
    for copy, original in zip(read, frames, strict=True):
        np.testing.assert_array_equal(copy.buffer, original.buffer)


def test_a_video_file_is_recorded(tmp_path, capsys):
    video, out = tmp_path / "cabin.avi", tmp_path / "video.dmsrec"
    write_video(video, gray_images(5), fps=100)
    assert main(["record", "--camera", str(video), "--frames", "5", "-o", str(out)]) == 0
    with RecordingReader(out) as reader:
        assert len(reader) == 5 and (reader.records[0].width, reader.records[0].height) == (64, 48)


def test_a_camera_that_ends_first_is_said_and_what_it_gave_is_kept(tmp_path, capsys):
    old, new = tmp_path / "old.dmsrec", tmp_path / "new.dmsrec"
    write_v1(old, small_frames(2, step_ns=1_000_000))
    assert main(["record", "--camera", str(old), "--frames", "5", "-o", str(new)]) == ExitCode.OK
    assert "the camera ended after 2 of 5 frames" in capsys.readouterr().err
    with RecordingReader(new) as reader:
        assert len(reader) == 2


def test_a_camera_that_fails_fails_the_recording_and_leaves_it_whole(tmp_path, capsys):
    old, new = tmp_path / "old.dmsrec", tmp_path / "new.dmsrec"
    offsets = write_v1(old, small_frames(3, step_ns=1_000_000))
    patch(old, offsets[1] + 100, b"\xff")  # frame 1's data: its CRC no longer holds
    code = main(["record", "--camera", str(old), "--frames", "3", "-o", str(new)])
    captured = capsys.readouterr()
    assert code == ExitCode.FAILED
    assert "the recording failed: ReplayFormatError" in captured.err, captured.err
    assert captured.out.startswith("recorded 1 frames")
    with RecordingReader(new) as reader:
        assert len(reader) == 1


def test_a_signal_stops_the_recording_whole_and_exits_130(tmp_path, capsys, monkeypatch):
    out = tmp_path / "cut.dmsrec"
    monkeypatch.setattr("pipelines.cli.record.open_camera", lambda spec: _source(stop_after=3))
    assert main(["record", "--frames", "1000", "-o", str(out)]) == ExitCode.INTERRUPTED
    assert "stopped by a signal after" in capsys.readouterr().err
    with RecordingReader(out) as reader:
        assert 3 <= len(reader) < 1000
        reader.read(len(reader) - 1)  # the last record whole


def test_recording_on_a_terminal_shows_its_progress_on_standard_error(tmp_path, monkeypatch):
    old, new = tmp_path / "old.dmsrec", tmp_path / "new.dmsrec"
    write_v1(old, small_frames(3, step_ns=1_000_000))
    stderr, stdout = Tty(), Tty()
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(sys, "stdout", stdout)
    assert main(["record", "--camera", str(old), "--frames", "3", "-o", str(new)]) == 0
    assert "3/3 frames" in stderr.getvalue().split(REDRAW)[-1]
    assert "\x1b[" not in stdout.getvalue() and stdout.getvalue().startswith("recorded 3")
