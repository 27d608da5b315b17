"""``aio-dms replay SEGMENT --compare PATH``: our driver states against openpilot's own in the
segment's log (here: Events of an earlier replay of the same segment, as openpilot's model daemon
would have logged them), the table, the document and exit code 3 beyond the limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openpilot_segments import build_segment

from pipelines.cli import main
from pipelines.dms.openpilot.events import schema
from pipelines.dms.openpilot.logs import read_log
from pipelines.exit_codes import ExitCode

pytestmark = pytest.mark.timeout(180)

FRAMES = 6
REPLAY = ["--device", "cpu", "--no-budget", "--health-port", "-1"]


def logged_states(tmp_path: Path, segment: Path) -> list[bytes]:
    """Our driverStateV2 Events of a replay of ``segment`` (its log written by ``--rlog``)."""
    out = tmp_path / "ours"
    out.mkdir()
    assert main(["replay", str(segment), *REPLAY, "--rlog", str(out / "rlog")]) == ExitCode.OK
    return [
        e.as_builder().to_bytes() for e in read_log(out / "rlog") if e.which() == "driverStateV2"
    ]


def flipped_face(event_bytes: bytes) -> bytes:
    """The Event with both sides' faceProb across openpilot's 0.7 threshold."""
    with schema().Event.from_bytes(event_bytes) as reader:
        event = reader.as_builder()
    state = event.driverStateV2
    for side in (state.leftDriverData, state.rightDriverData):
        side.faceProb = 0.0 if side.faceProb > 0.7 else 1.0
    return event.to_bytes()


@pytest.fixture
def segment(tmp_path: Path) -> Path:
    return build_segment(tmp_path / "route--0", frames=FRAMES, size=(1344, 760)).path


def test_the_same_model_on_the_same_segment_differs_in_nothing(tmp_path, segment, capsys):
    with (segment / "rlog").open("ab") as log:  # openpilot's own outputs, logged in the car
        log.write(b"".join(logged_states(tmp_path, segment)))
    capsys.readouterr()
    document = tmp_path / "compare.json"
    argv = ["replay", str(segment), *REPLAY, "--compare", str(document), "--tolerance", "0"]
    assert main([*argv, "--max-disagreement", "0"]) == ExitCode.OK
    result = json.loads(document.read_text())
    assert result["frames"] == {
        "ours": FRAMES, "theirs": FRAMES, "compared": FRAMES, "onlyOurs": 0, "onlyTheirs": 0
    }  # fmt: skip
    assert result["maxAbsDifference"] == 0.0 and result["beyond"] == []
    assert set(result["disagreement"]) == {"faceDetected", "eyesClosed", "phone", "distractedPose"}
    assert "left.faceOrientation.0" in result["fields"]
    table = capsys.readouterr().out
    assert "faceDetected" in table and f"compared {FRAMES}" in table


def test_decisions_that_flip_beyond_the_limit_exit_3_saying_which(tmp_path, segment, capsys):
    states = logged_states(tmp_path, segment)
    flipped = [flipped_face(e) if i % 2 else e for i, e in enumerate(states)]
    with (segment / "rlog").open("ab") as log:
        log.write(b"".join(flipped))
    capsys.readouterr()
    document = tmp_path / "compare.json"
    argv = ["replay", str(segment), *REPLAY, "--compare", str(document)]
    assert main([*argv, "--max-disagreement", "0.25"]) == ExitCode.DIFFERS
    err = capsys.readouterr().err
    assert "differs from openpilot's: faceDetected disagrees on 50.00% > 25.00%" in err
    result = json.loads(document.read_text())
    assert result["disagreement"]["faceDetected"] == 0.5
    assert result["beyond"] == ["faceDetected disagrees on 50.00% > 25.00%"]
    assert main([*argv, "--max-disagreement", "0.5"]) == ExitCode.OK  # at the limit: within


def test_a_segment_without_openpilot_s_driver_states_is_refused_before_work(
    tmp_path, segment, capsys
):
    document = tmp_path / "compare.json"
    code = main(["replay", str(segment), *REPLAY, "--compare", str(document)])
    err = capsys.readouterr().err.splitlines()
    assert code == ExitCode.REFUSED and len(err) == 1
    assert "holds no driverStateV2 of openpilot's" in err[0]
    assert not document.exists()


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        (lambda seg, tmp: [str(seg / "compare.json")], "is inside the segment replayed"),
        (
            lambda seg, tmp: [str(tmp / "c.json"), "--jsonl", str(tmp / "c.json")],
            "is the --jsonl file",
        ),
        (
            lambda seg, tmp: [str(tmp / "c.json"), "--summary-json", str(tmp / "c.json")],
            "is the --summary-json file",
        ),
    ],
)
def test_the_comparison_never_overwrites_the_segment_nor_another_output(
    tmp_path, segment, capsys, where, expected
):
    with (segment / "rlog").open("ab") as log:
        log.write(b"".join(logged_states(tmp_path, segment)))
    capsys.readouterr()
    code = main(["replay", str(segment), *REPLAY, "--compare", *where(segment, tmp_path)])
    err = capsys.readouterr().err.splitlines()
    assert code == ExitCode.REFUSED and len(err) == 1 and expected in err[0], err
