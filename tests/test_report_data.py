"""The report's pure part: messages read back and turned into the data of each picture."""

from __future__ import annotations

import json
import math

import pytest
from report_runs import GPU_HANG, INTERVAL, Step, lines, messages, ok, published, records, sof

from aio_runtime import Availability
from pipelines.dms.report import (
    Message,
    ReportInputError,
    analyse,
    parse_lines,
    publication_times,
    read_messages,
    split_runs,
)

A, D, U = Availability.AVAILABLE, Availability.DEGRADED, Availability.UNAVAILABLE


def test_a_message_reads_back_as_it_was_published():
    record = records([Step("U", "gpu-queue: compute timeline >= 5: timed out", age=0.15)])[0]
    message = Message.from_record(record)
    assert (message.seq, message.frame_id, message.availability) == (0, 0, U)
    assert message.kind == "gpu-queue" and not message.valid
    assert message.frame_age == 0.15 and message.model_time == 0.012


def test_a_valid_message_s_reason_may_be_null():
    message = Message.from_record({**records([ok()])[0], "reason": None})
    assert (message.reason, message.kind, message.valid) == ("", "", True)


def test_a_message_s_own_reason_kind_and_run_id_are_taken_as_given():
    record = {**records([Step("D", "late: 3 ms")])[0], "reasonKind": "frame budget", "runId": "r1"}
    message = Message.from_record(record)
    assert message.kind == "frame budget" and message.run_id == "r1"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"seq": None}, "seq"),
        ({"seq": "3"}, "seq"),
        ({"valid": 1}, "valid"),
        ({"frameAge": float("nan")}, "frameAge"),
        ({"availability": "gone"}, "availability"),
        ({"timestampSof": True}, "timestampSof"),
        ({"reason": 5}, "reason"),
    ],
)
def test_a_record_that_is_no_message_is_refused_naming_the_field(change, named):
    record = {**records([ok()])[0], **change}
    with pytest.raises(ValueError, match=named):
        Message.from_record(record)


def test_lines_that_are_no_messages_are_counted_with_why_not_fatal():
    good = lines([ok(), ok(), ok()])
    reading = parse_lines([good[0], "{not json", "", "[1, 2]", good[1], '{"seq": 1}', good[2]])
    assert [m.seq for m in reading.messages] == [0, 1, 2]
    assert (reading.lines, reading.bad_lines) == (6, 3)
    assert [line for line, _ in reading.bad_examples] == [2, 4, 6]
    assert reading.bad_examples[0][1] == "not JSON"
    assert "JSON object" in reading.bad_examples[1][1]


@pytest.mark.parametrize(
    ("content", "expected"),
    [(None, "no such file"), ("", "is empty"), ("\n\n", "is empty"),
     ("hello\nworld\n", "not one of its 2 lines is a message"), ("dir", "a directory")],
)  # fmt: skip
def test_an_input_that_cannot_be_reported_on_is_one_line_saying_so(tmp_path, content, expected):
    path = tmp_path / "run.jsonl"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ReportInputError, match=expected) as refused:
        read_messages(path)
    assert "\n" not in str(refused.value)


def test_a_binary_file_is_not_json_lines_rather_than_a_decoding_error(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_bytes(b"\xff\xfe\x00garbage\n\x89PNG\r\n")
    with pytest.raises(ReportInputError, match="not one of its"):
        read_messages(path)


def test_a_file_is_cut_into_runs_where_the_sequence_restarts_or_the_run_id_changes():
    two = messages([ok(), ok(), ok()]) + messages([ok(), ok()])
    assert [len(run) for run in split_runs(two)] == [3, 2]
    unnamed = {"runId": None}  # written before messages carried a run id
    old = messages([ok(), ok(), ok()], extra=unnamed) + messages([ok(), ok()], extra=unnamed)
    assert [len(run) for run in split_runs(old)] == [3, 2]
    tagged = messages([ok(), ok()], extra={"runId": "a"}) + messages([ok()], extra={"runId": "b"})
    assert [len(run) for run in split_runs(tagged)] == [2, 1]


def test_one_band_per_availability_interval_from_publication_to_the_next_change():
    data = analyse(messages(GPU_HANG), budget=0.05)
    expected = [  # (state, first message's frame and age, next interval's first's)
        (U, (0, 0.03), (2, 0.03)), (A, (2, 0.03), (6, 0.15)), (U, (6, 0.15), (12, 0.03)),
        (A, (12, 0.03), (15, 0.03)), (D, (15, 0.03), (17, 0.03)), (U, (17, 0.03), (19, 0.03)),
        (A, (19, 0.03), (20, 0.27)), (U, (20, 0.27), (27, 0.03)), (A, (27, 0.03), (28, 0.03)),
    ]  # fmt: skip
    assert [b.availability for b in data.bands] == [state for state, _, _ in expected]
    for band, (_, start, end) in zip(data.bands, expected, strict=True):
        assert band.start == pytest.approx(published(*start))
        assert band.end == pytest.approx(published(*end))
    assert [b.messages for b in data.bands] == [2, 4, 5, 3, 2, 2, 2, 2, 2]


def test_a_band_says_what_it_is_about():
    data = analyse(messages(GPU_HANG), budget=0.05)
    away = [b.cause for b in data.bands if b.availability is not A]
    assert away == ["accelerator", "gpu-queue", "invalid output", "no valid output", "camera"]
    assert data.bands[2].kinds == {"gpu-queue": 1, "model unavailable": 2, "recovering": 2}
    assert all(b.cause == "" for b in data.bands if b.availability is A)


def test_detection_runs_from_the_fault_s_first_invalid_frame_to_the_first_message_away():
    hang, nan_output, _ = analyse(messages(GPU_HANG), budget=0.05).episodes
    assert (hang.number, hang.cause, hang.states) == (1, "gpu-queue", {U})
    assert hang.onset == pytest.approx(sof(6))
    assert hang.detection == pytest.approx(0.15)  # the hung frame's own age
    assert hang.to_unavailable == pytest.approx(0.15)
    assert (nan_output.cause, nan_output.states) == ("invalid output", {D, U})
    assert nan_output.detection == pytest.approx(0.03)
    assert nan_output.to_unavailable == pytest.approx(published(17) - sof(15))


def test_recovery_runs_from_the_first_trustworthy_output_again_to_available():
    hang, nan_output, camera = analyse(messages(GPU_HANG), budget=0.05).episodes
    assert hang.fault_end == pytest.approx(sof(10))  # the first "recovering" frame
    assert hang.recovery == pytest.approx(published(12) - sof(10))
    assert hang.outage == pytest.approx(published(12) - published(6, 0.15))
    assert nan_output.recovery == pytest.approx(published(19) - sof(18))
    assert camera.recovery == pytest.approx(published(27) - sof(26))


def test_a_stall_is_detected_from_when_the_missing_frame_was_due():
    camera = analyse(messages(GPU_HANG), budget=0.05).episodes[2]
    assert camera.onset == pytest.approx(sof(20) + INTERVAL)
    assert camera.detected == pytest.approx(sof(20) + 0.27)  # the newest frame's age
    assert camera.detection == pytest.approx(0.27 - INTERVAL)


def test_an_invalid_frame_still_available_starts_the_fault():
    late = Step("A", "frame budget: late", age=0.06)  # invalid, not yet away from AVAILABLE
    steps = [ok(), ok(), late, Step("D", "frame budget: late", age=0.07),
             Step("D", "recovering: degraded (x)"), ok()]  # fmt: skip
    (episode,) = analyse(messages(steps), budget=0.05).episodes
    assert episode.onset == pytest.approx(sof(2))
    assert episode.detection == pytest.approx(published(3, 0.07) - sof(2))


def test_valid_frames_waiting_out_the_hysteresis_end_the_fault_and_overloaded_ones_do_not():
    """Frames are valid whatever the availability: the closing valid ones of an episode are
    the hysteresis (the fault had ended at the first); valid frames of a service that cannot
    keep up (``overloaded``) are the fault itself."""
    hung, opening, overloaded = "gpu-queue: hung", "accelerator: opening", "overloaded: 15 of 20"
    steps = [ok(), ok(), Step("U", hung, why=hung),
             Step("U", "model unavailable: x", why=hung),
             Step("U", valid=True, why=opening), Step("U", valid=True, why=opening), ok(), ok(),
             Step("D", valid=True, why=overloaded), Step("D", valid=True, why=overloaded),
             Step("D", valid=True, why="accelerator: x"), ok()]  # fmt: skip
    hang, overload = analyse(messages(steps), budget=0.05).episodes
    assert hang.fault_end == pytest.approx(sof(4)) and hang.cause == "gpu-queue"
    assert overload.cause == "overloaded" and overload.fault_end == pytest.approx(sof(10))


def test_older_records_count_late_frames_by_the_budget():
    records_ = records([ok(0.06), ok(0.03), Step("D", "x: y", age=0.07)])
    for record in records_:
        del record["late"]
    data = analyse([Message.from_record(r) for r in records_], budget=0.05)
    assert data.summary.late == 1  # the valid one past the budget


def test_the_start_up_is_not_a_fault_and_an_episode_the_run_ends_in_is_not_recovered():
    steps = [Step("U", "recovering: unavailable (accelerator: opening)"), ok(), ok(),
             Step("U", "usb-transfer: no device"), Step("U", "model unavailable: restarting")]  # fmt: skip
    data = analyse(messages(steps), budget=0.05)
    assert data.startup is not None and data.startup.cause == "accelerator"
    assert data.startup.recovered == pytest.approx(published(1))
    (episode,) = data.episodes
    assert episode.number == 1 and episode.recovered is None
    assert episode.recovery is None and episode.outage is None and episode.fault_end is None
    assert data.summary.first_available == pytest.approx(published(1))


def test_a_run_that_starts_available_has_no_start_up():
    data = analyse(messages([ok(), ok()]), budget=0.05)
    assert data.startup is None and data.episodes == []
    assert data.summary.first_available == 0.0


def test_the_summary_counts_what_the_messages_say():
    steps = GPU_HANG
    data = analyse(messages(steps), budget=0.05)
    summary = data.summary
    valid = sum(1 for s in steps if s.state == "A" and not s.reason)
    assert (summary.messages, summary.frames, summary.status) == (24, 23, 1)
    assert summary.valid == valid and summary.valid_share == pytest.approx(valid / 24)
    assert summary.invalid_by_kind == {
        "recovering": 6, "model unavailable": 2, "invalid output": 2, "gpu-queue": 1,
        "no valid output": 1, "camera": 1,
    }  # fmt: skip
    assert sum(summary.invalid_by_kind.values()) == 24 - valid
    assert summary.missing_frames == sum(s.skip for s in steps)
    assert summary.late == sum(
        1 for s in steps if s.state == "A" and not s.reason and not s.status and s.age > 0.05
    )
    assert sum(summary.time_in.values()) == pytest.approx(summary.duration)
    assert summary.time_in[D] == pytest.approx(published(17) - published(15))


def test_percentiles_are_over_frames_and_the_model_s_over_frames_it_ran_for():
    steps = [ok(0.01), ok(0.02), ok(0.03), Step("U", "model unavailable: x", model=0.0),
             Step("U", "camera: stalled", age=0.5, status=True)]  # fmt: skip
    data = analyse(messages(steps), budget=0.05)
    ages = data.summary.percentiles_ms["frame age"]
    assert ages["max"] == pytest.approx(30.0) and ages["p50"] == pytest.approx(25.0)
    assert data.summary.percentiles_ms["model"]["max"] == pytest.approx(12.0)
    assert math.isnan(data.series.model_ms[3])  # no model ran for it
    assert data.series.status_age_ms == [pytest.approx(500.0)]


def test_the_budget_is_the_messages_own_where_they_carry_one():
    assert analyse(messages([ok()]), budget=0.08).budget == 0.08
    carried = analyse(messages([ok()], extra={"budget": 0.033}), budget=0.08)
    assert (carried.budget, carried.budget_source) == (0.033, "messages")


def test_publication_never_goes_back_and_a_status_before_any_frame_sits_at_the_first():
    steps = [Step("U", "camera: stalled", age=0.0, status=True), ok(0.04), ok(0.01),
             Step("U", "camera: stalled", age=0.005, status=True)]  # fmt: skip
    times = publication_times(messages(steps))
    frame_1 = INTERVAL + 0.01 - 0.04  # the run's 0 is frame 0's publication, 40 ms after it began
    # the status after frame 1: that frame's start plus 5 ms, before frame 1's own publication
    assert times == [0.0, 0.0, pytest.approx(frame_1), pytest.approx(frame_1)]


def test_json_lines_written_by_a_sink_read_back_whole(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(lines(GPU_HANG)) + "\n")
    reading = read_messages(path)
    assert len(reading.messages) == len(GPU_HANG) and reading.bad_lines == 0
    assert json.loads(path.read_text().splitlines()[0])["seq"] == reading.messages[0].seq
