"""Model against model over a fleet: two run directories joined frame by frame, the differences
per field, the decisions that flip per recording, the files written, and what is refused."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fleet_runs import frames, varied_recording, write_run

from pipelines.cli import fleet_compare as compare_command_module
from pipelines.cli import main
from pipelines.cli.fleet_compare import compare_command
from pipelines.dms.fleet.compare import (
    COMPARISON_FILES,
    FIELD_COLUMNS,
    HISTOGRAM_BINS,
    RECORDING_COLUMNS,
    compare_runs,
    read_comparison,
    write_comparison,
)
from pipelines.dms.model.reference import build_reference_model, build_shifted_model, write_model
from pipelines.dms.openpilot.policy import DECISIONS
from pipelines.dms.sinks.parquet import DRIVER_COLUMNS
from pipelines.exit_codes import ExitCode

pytestmark = pytest.mark.timeout(120)

NONE_FLIPPED = dict.fromkeys(DECISIONS, 0)


def _runs(tmp_path: Path, baseline: list[pa.Table], candidate: list[pa.Table]):
    return write_run(tmp_path / "a", baseline), write_run(tmp_path / "b", candidate)


def _field(comparison, column):
    return next(f for f in comparison.fields if f.field == column)


def test_runs_of_the_same_frames_differ_in_nothing(tmp_path):
    a, b = _runs(tmp_path, [frames("r", range(6))], [frames("r", range(6))])
    found = compare_runs(a, b)
    assert (found.rows_baseline, found.rows_candidate, found.compared) == (6, 6, 6)
    assert [f.field for f in found.fields] == list(DRIVER_COLUMNS)
    assert {f.max_abs for f in found.fields} == {0.0} and {f.mean for f in found.fields} == {0.0}
    (recording,) = found.recordings
    assert recording.flips == NONE_FLIPPED and recording.max_flip_share == 0.0
    assert recording.max_flip_decision is None
    assert found.flip_shares == dict.fromkeys(DECISIONS, 0.0)


def test_a_field_s_differences_have_their_exact_figures_and_flip_what_they_cross(tmp_path):
    # baseline faceProb 0.5 (no face); the candidate's crosses 0.7 on three frames of eight
    moved = [0.5, 0.5, 0.5, 0.5, 0.75, 0.75, 0.25, 1.0]
    a, b = _runs(
        tmp_path, [frames("r", range(8))], [frames("r", range(8), {"left.faceProb": moved})]
    )
    found = compare_runs(a, b)
    face = _field(found, "left.faceProb")
    assert (face.count, face.mean, face.mean_abs) == (8, 0.75 / 8, 1.25 / 8)
    assert (face.p50_abs, face.p90_abs, face.p99_abs, face.max_abs) == (0.0, 0.5, 0.5, 0.5)
    assert face.non_finite == 0
    assert len(face.edges) == HISTOGRAM_BINS + 1 and (face.edges[0], face.edges[-1]) == (-0.5, 0.5)
    # 41 bins of 1/41 from -0.5: -0.25 in bin 10, 0 in the middle one, 0.25 in 30, 0.5 (the
    # last edge) in the last
    assert {at: n for at, n in enumerate(face.counts) if n} == {10: 1, 20: 4, 30: 2, 40: 1}
    assert all(f.max_abs == 0 for f in found.fields if f.field != "left.faceProb")
    (recording,) = found.recordings
    assert recording.flips == {**NONE_FLIPPED, "faceDetected": 3}
    assert recording.flip_shares["faceDetected"] == 3 / 8
    assert (recording.max_flip_share, recording.max_flip_decision) == (3 / 8, "faceDetected")
    assert recording.mean_abs == pytest.approx(1.25 / 8 / len(DRIVER_COLUMNS), rel=1e-15)


def test_frames_in_one_run_only_are_counted_per_recording_not_compared(tmp_path):
    a, b = _runs(
        tmp_path,
        [frames("r", range(10)), frames("s", range(3))],
        [frames("r", range(2, 12)), frames("t", range(4))],
    )
    found = compare_runs(a, b)
    by_name = {r.recording: r for r in found.recordings}
    r, s, t = by_name["r"], by_name["s"], by_name["t"]
    assert (r.frames, r.compared, r.only_baseline, r.only_candidate) == (8, 8, 2, 2)
    assert (s.frames, s.compared, s.only_baseline, s.only_candidate) == (0, 0, 3, 0)
    assert (t.frames, t.compared, t.only_baseline, t.only_candidate) == (0, 0, 0, 4)
    assert s.flip_shares == dict.fromkeys(DECISIONS) and s.max_flip_share is None
    assert math.isnan(s.mean_abs)
    assert found.compared == 8 and _field(found, "left.faceProb").count == 8
    assert [x.recording for x in found.recordings] == ["r", "s", "t"]  # nothing compared: last


def test_a_frame_without_driver_data_on_either_side_is_not_compared(tmp_path):
    a, b = _runs(
        tmp_path,
        [frames("r", range(5), no_driver=[1])],
        [frames("r", range(5), {"left.phoneProb": [0.75] * 5}, no_driver=[3])],
    )
    (recording,) = compare_runs(a, b).recordings
    assert (recording.frames, recording.compared) == (5, 3)
    assert recording.flips["phone"] == 3 and recording.flip_shares["phone"] == 1.0


def test_recordings_are_ordered_by_largest_flip_share_then_by_mean_difference(tmp_path):
    eyes = {"left.leftEyeProb": [0.5] * 4}  # an eye no longer open: no difference that flips
    baseline = [frames(name, range(4)) for name in ("calm", "eyes", "some", "most")]
    candidate = [
        frames("calm", range(4)),
        frames("eyes", range(4), eyes),
        frames("some", range(4), {"left.phoneProb": [0.75, 0.25, 0.25, 0.25]}),
        frames("most", range(4), {"left.faceProb": [0.75, 0.75, 0.5, 0.5]}),
    ]
    found = compare_runs(*_runs(tmp_path, baseline, candidate))
    assert [r.recording for r in found.recordings] == ["most", "some", "eyes", "calm"]
    assert [r.max_flip_share for r in found.recordings] == [0.5, 0.25, 0.0, 0.0]
    assert found.recordings[2].mean_abs > 0 and found.recordings[3].mean_abs == 0


def test_decisions_are_taken_on_the_side_the_baseline_has_openpilot_monitor(tmp_path):
    right_hand = {"wheelOnRightProb": [0.875] * 4}
    left_phone = {**right_hand, "left.phoneProb": [0.75] * 4}
    right_phone = {**right_hand, "right.phoneProb": [0.75] * 4}
    a, b = _runs(
        tmp_path,
        [frames("left", range(4), right_hand), frames("right", range(4), right_hand)],
        [frames("left", range(4), left_phone), frames("right", range(4), right_phone)],
    )
    by_name = {r.recording: r for r in compare_runs(a, b).recordings}
    assert by_name["left"].flips["phone"] == 0  # openpilot does not watch that side
    assert by_name["right"].flips["phone"] == 4


def test_a_value_that_is_not_finite_is_an_infinite_difference_written_as_null(tmp_path):
    values = [0.25, math.nan, 0.25, 0.25]
    a, b = _runs(
        tmp_path, [frames("r", range(4))], [frames("r", range(4), {"left.sleepProb": values})]
    )
    found = compare_runs(a, b)
    sleep = _field(found, "left.sleepProb")
    assert sleep.non_finite == 1 and sleep.max_abs == math.inf and math.isnan(sleep.mean)
    assert sum(sleep.counts) == 3
    write_comparison(found, tmp_path / "out")
    document = json.loads((tmp_path / "out" / "comparison.json").read_text())
    written = next(f for f in document["fields"] if f["field"] == "left.sleepProb")
    assert written["maxAbs"] is None and written["mean"] is None and written["nonFinite"] == 1
    again = read_comparison(tmp_path / "out")
    assert _field(again, "left.sleepProb").max_abs == math.inf


def test_the_comparison_is_written_as_two_tables_and_one_document(tmp_path):
    baseline = [frames("x", range(4)), frames("y", range(4))]
    candidate = [frames("x", range(4)), frames("y", range(4), {"left.faceProb": [0.75] * 4})]
    found = compare_runs(*_runs(tmp_path, baseline, candidate))
    out = tmp_path / "deep" / "comparison"
    write_comparison(found, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(COMPARISON_FILES)  # no leftovers
    fields = pq.read_table(out / "fields.parquet")
    assert fields.column_names == list(FIELD_COLUMNS)
    assert fields.column("field").to_pylist() == list(DRIVER_COLUMNS)
    recordings = pq.read_table(out / "recordings.parquet")
    assert recordings.column_names == list(RECORDING_COLUMNS)
    assert recordings.column("recording").to_pylist() == ["y", "x"]
    assert recordings.column("flipShare.faceDetected").to_pylist() == [1.0, 0.0]
    document = json.loads((out / "comparison.json").read_text())
    assert document["recordings"] == recordings.to_pylist()
    assert document["fields"] == fields.to_pylist()
    assert document["flipShare"]["faceDetected"] == 0.5 and document["compared"] == 8
    assert read_comparison(out) == found
    write_comparison(found, out)  # again, over the files there
    assert sorted(p.name for p in out.iterdir()) == sorted(COMPARISON_FILES)


def test_the_table_lists_the_fields_that_moved_most_and_the_top_recordings(tmp_path):
    baseline = [frames(f"drive-{i}", range(4)) for i in range(12)]
    candidate = [frames(f"drive-{i}", range(4)) for i in range(11)]
    candidate.append(frames("drive-11", range(4), {"right.phoneProb": [0.5] * 4}))
    text = compare_runs(*_runs(tmp_path, baseline, candidate)).table(fields=3, recordings=5)
    lines = text.splitlines()
    header = next(at for at, line in enumerate(lines) if line.startswith("field"))
    assert lines[header + 1].split()[:2] == ["right.phoneProb", "0.02083"]  # 4 of 48 by 0.25
    assert "compared 48 frames of 12 recordings" in text
    first = next(at for at, line in enumerate(lines) if line.startswith("recording"))
    assert lines[first + 1].startswith("drive-11 ")  # it moved most; nothing flipped
    assert lines[-1] == "... 7 more in recordings.parquet"


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("nothing", "is not a fleet run directory (no frames/ in it)"),
        ("empty", "holds no Parquet file of a recording"),
        ("hidden only", "holds no Parquet file of a recording"),
        ("garbage", "is not a readable Parquet file"),
        ("other schema", "is not a file of frames: its schema lacks"),
        ("retyped", "is not a file of frames: its schema has other columns or types"),
        ("twice", "1 rows repeat a (recording, frameId)"),
    ],
)
def test_a_directory_that_is_no_fleet_run_is_a_one_line_value_error(tmp_path, setup, expected):
    good = write_run(tmp_path / "good", [frames("r", range(3))])
    bad = tmp_path / "bad"
    folder = bad / "frames" / "r"
    if setup != "nothing":
        folder.mkdir(parents=True)
    if setup == "hidden only":
        pq.write_table(frames("r", range(3)), folder / ".part-0.parquet.partial")
    elif setup == "garbage":
        (folder / "part-0.parquet").write_bytes(b"not parquet at all")
    elif setup == "other schema":
        pq.write_table(pa.table({"recording": ["r"], "frameId": [0]}), folder / "part-0.parquet")
    elif setup == "retyped":
        table = frames("r", range(3))
        at = table.schema.get_field_index("frameAge")
        retyped = table.set_column(at, "frameAge", table["frameAge"].cast(pa.float32()))
        pq.write_table(retyped, folder / "part-0.parquet")
    elif setup == "twice":  # a second file holds a frame of "r" again
        write_run(bad, [frames("r", range(3))])
        (bad / "frames" / "again").mkdir()
        pq.write_table(frames("r", [2]), bad / "frames" / "again" / "part-0.parquet")
    for a, b in ((bad, good), (good, bad)):
        with pytest.raises(ValueError) as refused:
            compare_runs(a, b)
        assert expected in str(refused.value) and "\n" not in str(refused.value)


def test_a_hidden_partial_file_beside_the_recordings_is_not_read(tmp_path):
    a, b = _runs(tmp_path, [frames("r", range(3))], [frames("r", range(3))])
    pq.write_table(frames("half", range(2)), b / "frames" / "r" / ".part-0.parquet.partial")
    assert [r.recording for r in compare_runs(a, b).recordings] == ["r"]


# -- the shifted model: a candidate whose flips are known from the baseline's own outputs --------


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p) - np.log1p(-p)


def _shift_between(logits: np.ndarray) -> float:
    """A shift that moves about half the frames' logits across 0, none of them near it: minus
    the middle of the widest gap between neighbouring logits in their middle half."""
    ordered = np.sort(logits)
    quarter = len(ordered) // 4
    middle = ordered[quarter : len(ordered) - quarter]
    at = int(np.argmax(np.diff(middle)))
    return -float(middle[at] + middle[at + 1]) / 2


REPLAY = [
    "--device",
    "cpu",
    "--calib",
    "0,0,0",
    "--health-port",
    "-1",
    "--budget",
    "2",
    "--threads",
    "1",
]


def _replay(recording: Path, run: Path, model: Path, capsys) -> None:
    out = run / "frames" / recording.name / "part-0.parquet"
    out.parent.mkdir(parents=True)
    argv = ["replay", str(recording), *REPLAY, "--model", str(model), "--parquet", str(out)]
    assert main(argv) == ExitCode.OK, capsys.readouterr().err
    capsys.readouterr()


def test_the_reference_model_against_it_with_one_head_shifted_flips_exactly_the_known_frames(
    tmp_path, capsys
):
    recordings = [varied_recording(tmp_path / f"drive-{i}.dmsrec", 30, seed=i) for i in (1, 2)]
    reference = write_model(build_reference_model(), tmp_path / "reference.onnx")
    for recording in recordings:
        _replay(recording, tmp_path / "baseline", reference, capsys)
    rows = pq.read_table(list((tmp_path / "baseline" / "frames").glob("*/part-0.parquet")))
    right = rows["wheelOnRightProb"].to_numpy() > 0.5
    side, suffix = ("right", "rhd") if right.mean() > 0.5 else ("left", "lhd")
    on_side = right == (side == "right")
    logits = _logit(rows[f"{side}.phoneProb"].to_numpy().astype(np.float64))
    shift = _shift_between(logits[on_side])
    assert np.min(np.abs(logits + shift)) > 1e-5  # no frame's outcome hangs on rounding
    model = build_shifted_model(f"using_phone_prob_{suffix}", shift)
    candidate = write_model(model, tmp_path / "shifted.onnx")
    for recording in recordings:
        _replay(recording, tmp_path / "candidate", candidate, capsys)
    found = compare_runs(tmp_path / "baseline", tmp_path / "candidate")
    names = rows["recording"].to_numpy(zero_copy_only=False)
    flipped = on_side & ((logits > 0) != (logits + shift > 0))
    assert 0 < flipped.sum() < on_side.sum()  # some frames cross, others do not
    for recording in found.recordings:
        mine = names == recording.recording
        assert recording.compared == mine.sum() == 30
        assert recording.flips == {**NONE_FLIPPED, "phone": int(flipped[mine].sum())}
    moved = {f.field for f in found.fields if f.max_abs > 0}
    assert moved == {f"{side}.phoneProb"}  # the rest of the output is the reference model's
    assert found.flip_shares["phone"] == flipped.sum() / len(flipped)


# -- aio-dms fleet compare --------------------------------------------------------------------


def test_the_command_prints_the_table_and_writes_beside_the_candidate(tmp_path, capsys):
    baseline = [frames("r", range(4))]
    candidate = [frames("r", range(4), {"left.faceProb": [0.75] * 4})]
    a, b = _runs(tmp_path, baseline, candidate)
    assert compare_command([str(a), str(b)]) == ExitCode.OK
    captured = capsys.readouterr()
    assert (
        captured.out == compare_runs(a, b).table() + f"\n\ncomparison written to {b}/comparison\n"
    )
    assert not captured.err
    assert read_comparison(b / "comparison").recordings[0].flips["faceDetected"] == 4
    out = tmp_path / "elsewhere"
    assert compare_command([str(a), str(b), "--out", str(out)]) == ExitCode.OK
    assert sorted(p.name for p in out.iterdir()) == sorted(COMPARISON_FILES)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["{missing}", "{b}"], "is not a fleet run directory"),
        (["{a}", "{plain}"], "is not a fleet run directory"),
        (["{a}", "{b}", "--out", "{file}"], "--out: output"),
        (["{a}", "{b}", "--out", "{file}/sub"], "cannot be made"),
        (["{a}", "{b}", "--out", "{b}/frames/r"], "is inside the frames of"),
        (["{a}", "{b}", "--out", "{a}"], "is a run directory compared"),
        (["{a}", "{b}", "--out", ""], "--out: expected a directory"),
        (["{a}", "{b}", "--outward", "x"], "unrecognized arguments"),
        (["{a}"], "the following arguments are required: RUN_B"),
    ],
)
def test_the_command_refuses_bad_input_in_one_line_with_exit_2(tmp_path, capsys, argv, expected):
    a, b = _runs(tmp_path, [frames("r", range(2))], [frames("r", range(2))])
    (tmp_path / "plain").mkdir()
    (tmp_path / "file").write_text("a file")
    paths = {
        "a": a,
        "b": b,
        "missing": tmp_path / "missing",
        "plain": tmp_path / "plain",
        "file": tmp_path / "file",
    }
    code = compare_command([arg.format(**paths) for arg in argv])
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == ExitCode.REFUSED
    assert len(lines) == 1 and lines[0].startswith("aio-dms fleet compare: "), lines
    assert expected in lines[0] and not captured.out
    assert not (b / "comparison").exists()


def test_a_comparison_that_cannot_be_written_fails_with_exit_1(tmp_path, capsys, monkeypatch):
    a, b = _runs(tmp_path, [frames("r", range(2))], [frames("r", range(2))])

    def no_room(comparison, out):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(compare_command_module, "write_comparison", no_room)
    assert compare_command([str(a), str(b)]) == ExitCode.FAILED
    captured = capsys.readouterr()
    assert captured.err == (
        "aio-dms fleet compare: the comparison could not be written: "
        "[Errno 28] No space left on device\n"
    )
    assert not captured.out


def test_the_command_s_help_exits_0(capsys):
    assert compare_command(["--help"]) == ExitCode.OK
    assert "RUN_A" in capsys.readouterr().out
