"""A fleet's inputs, its plan in its run directory, and its summaries — everything before and
after Ray, without a cluster."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import pyarrow as pa
import pytest
from openpilot_segments import build_segment

from pipelines.dms.fleet import (
    FleetOptions,
    RunDirectory,
    find_recordings,
    fleet_config,
    plan_fleet,
    run_fleet,
)
from pipelines.dms.fleet.layout import recording_directory, replay_settings
from pipelines.dms.fleet.summary import percentiles, recording_summary
from pipelines.dms.frames.recording import FILE_MAGIC
from pipelines.dms.model.reference import build_reference_model, write_model
from pipelines.dms.sinks.parquet import parquet_schema

CONFIG = fleet_config()


def ours(path: Path) -> Path:
    """A file that a walk takes for a recording of ours (its first bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(FILE_MAGIC + b"\0" * 8)
    return path


def names(inputs: list[str | Path]) -> list[str]:
    return [recording.name for recording in find_recordings(inputs)]


def test_a_directory_gives_its_recordings_videos_and_segments_in_name_order(tmp_path):
    ours(tmp_path / "b" / "drive.dmsrec")
    ours(tmp_path / "a.bin")  # ours, whatever its name
    (tmp_path / "c.mp4").write_bytes(b"")  # a video, by its name
    (tmp_path / "notes.json").write_text("{}")  # neither: passed over
    ours(tmp_path / ".hidden" / "x.dmsrec")
    ours(tmp_path / ".y.dmsrec")
    build_segment(tmp_path / "route--3", frames=2)
    assert names([tmp_path]) == ["a.bin", "b/drive.dmsrec", "c.mp4", "route--3"]


def test_a_segment_directory_or_a_file_given_is_one_recording_by_its_name(tmp_path):
    build_segment(tmp_path / "route--0", frames=2)
    (tmp_path / "odd.txt.bin").write_bytes(b"")
    assert names([tmp_path / "route--0", tmp_path / "odd.txt.bin"]) == ["route--0", "odd.txt.bin"]


def test_a_list_names_inputs_relative_to_itself(tmp_path):
    ours(tmp_path / "drives" / "one.dmsrec")
    ours(tmp_path / "drives" / "two.dmsrec")
    listing = tmp_path / "fleet.txt"
    listing.write_text("# the fleet\n\ndrives/one.dmsrec\n  drives/two.dmsrec  \n")
    assert names([listing]) == ["one.dmsrec", "two.dmsrec"]


@pytest.mark.parametrize(
    ("lines", "complaint"),
    [
        ("missing.dmsrec\n", r"no such file or directory \(listed in"),
        ("inner.txt\n", "a list in a list"),
    ],
)
def test_a_list_that_names_what_cannot_be_taken_is_refused(tmp_path, lines, complaint):
    (tmp_path / "inner.txt").write_text("")
    listing = tmp_path / "fleet.txt"
    listing.write_text(lines)
    with pytest.raises(ValueError, match=complaint):
        find_recordings([listing])


def test_two_recordings_of_one_name_are_refused_and_one_named_twice_is_taken_once(tmp_path):
    one = ours(tmp_path / "x" / "drive.dmsrec")
    ours(tmp_path / "y" / "drive.dmsrec")
    assert names([one, one, str(one)]) == ["drive.dmsrec"]
    with pytest.raises(ValueError, match=r"two recordings are named 'drive\.dmsrec'"):
        find_recordings([one, tmp_path / "y" / "drive.dmsrec"])


@pytest.mark.parametrize("given", ["missing", "", "empty"])
def test_inputs_that_name_nothing_are_refused(tmp_path, given):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError):
        find_recordings([str(tmp_path / given) if given else ""])


def test_a_plan_hands_out_every_recording_for_each_model(tmp_path):
    recordings = find_recordings([ours(tmp_path / "in" / "a.dmsrec"), ours(tmp_path / "b.dmsrec")])
    baseline = write_model(build_reference_model(seed=7), tmp_path / "baseline.onnx")
    plan = plan_fleet(recordings, FleetOptions(tmp_path / "run", CONFIG, baseline_model=baseline))
    assert [(t.recording, t.model) for t in plan.tasks] == [
        ("a.dmsrec", "model"), ("a.dmsrec", "baseline"), ("b.dmsrec", "model"),
        ("b.dmsrec", "baseline"),
    ]  # fmt: skip
    assert plan.tasks[1].output == str(
        RunDirectory(tmp_path / "run" / "baseline").frames("a.dmsrec")
    )
    assert plan.tasks[1].config.model == baseline
    assert plan.settings["model"]["modelSha256"] != plan.settings["baseline"]["modelSha256"]


def test_a_run_directory_of_other_settings_or_other_files_is_refused(tmp_path):
    recordings = find_recordings([ours(tmp_path / "a.dmsrec")])
    out = tmp_path / "run"
    RunDirectory(out).write_run({"settings": replay_settings(CONFIG)})
    assert plan_fleet(recordings, FleetOptions(out, CONFIG)).tasks  # the same: resumed
    other = fleet_config(budget=0.1)
    with pytest.raises(ValueError, match=r"other settings \(budget\)"):
        plan_fleet(recordings, FleetOptions(out, other))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ValueError, match=r"holds files but no fleet\.json"):
        plan_fleet(recordings, FleetOptions(tmp_path / "full", CONFIG))
    with pytest.raises(ValueError, match="expected a directory, got a file"):
        plan_fleet(recordings, FleetOptions(tmp_path / "a.dmsrec", CONFIG))


def test_a_resumed_recording_keeps_the_summary_its_run_wrote(tmp_path):
    recordings = find_recordings([ours(tmp_path / "a.dmsrec")])
    out = RunDirectory(tmp_path / "run")
    out.frames("a.dmsrec").parent.mkdir(parents=True)
    out.frames("a.dmsrec").write_bytes(b"")
    earlier = {"recording": "a.dmsrec", "model": "model", "status": "complete", "frames": 7}
    out.write_run({"settings": replay_settings(CONFIG), "recordings": [earlier]})
    plan = plan_fleet(recordings, FleetOptions(out.root, CONFIG))
    assert plan.tasks == []
    assert plan.resumed == [earlier]


def test_the_settings_compared_on_resuming_leave_out_what_each_replay_sets():
    settings = replay_settings(CONFIG)
    assert {"camera", "parquet", "run_id", "health_port", "jsonl"}.isdisjoint(settings)
    assert settings["device"] == "cpu" and settings["budget"] == 0.05
    json.dumps(settings)  # JSON values only


def frames_table(states: list[tuple[str, str | None, bool]], interval_ns: int) -> pa.Table:
    schema = parquet_schema()
    count = len(states)
    columns = {name: [None] * count for name in schema.names}
    columns.update(
        recording=["r"] * count, runId=["x"] * count, seq=list(range(count)),
        frameId=list(range(count)), valid=[v for _, _, v in states], late=[False] * count,
        eventValid=[True] * count,
        availability=[s for s, _, _ in states], reason=[""] * count,
        reasonKind=[k for _, k, _ in states], availabilityReason=[""] * count,
        availabilityReasonKind=[k for _, k, _ in states],
        timestampSof=[0] * count, timestampEof=[0] * count,
        recordedTimestampSof=[k * interval_ns for k in range(count)],
        frameAge=[0.01] * count, modelExecutionTime=[0.002 * (k + 1) for k in range(count)],
        gpuExecutionTime=[0.001] * count,
    )  # fmt: skip
    for name in schema.names:
        if name.startswith("readiness."):
            columns[name] = [True] * count
    return pa.table(columns, schema=schema)


def test_a_recordings_summary_counts_the_drives_time_by_state_and_reason_kind():
    states = [
        ("available", None, True),
        ("degraded", "frame budget", False),
        ("unavailable", "gpu-queue", False),
        ("unavailable", "gpu-queue", False),
        ("unavailable", "camera", False),
        ("available", None, True),
    ]
    summary = recording_summary(frames_table(states, 50_000_000), recording="r", path="p")
    assert summary["frames"] == 6 and summary["valid"] == 2
    assert summary["validShare"] == pytest.approx(2 / 6)
    assert summary["recordedSeconds"] == pytest.approx(0.30)  # the last frame: the median interval
    assert summary["unavailableSeconds"] == pytest.approx({"camera": 0.05, "gpu-queue": 0.10})
    assert summary["degradedSeconds"] == pytest.approx({"frame budget": 0.05})
    assert summary["modelExecutionMs"]["max"] == pytest.approx(12.0)
    assert summary["modelExecutionMs"]["p50"] == pytest.approx(7.0)


def test_percentiles_of_nothing_are_null():
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None, "max": None}
    assert percentiles([float("nan"), 1.0])["max"] == 1.0


def test_a_run_with_every_recording_done_already_starts_no_cluster(tmp_path):
    import pyarrow.parquet as pq

    recordings = find_recordings([ours(tmp_path / "a.dmsrec")])
    out = RunDirectory(tmp_path / "run")
    out.frames("a.dmsrec").parent.mkdir(parents=True)
    pq.write_table(
        frames_table([("available", None, True)] * 4, 50_000_000), out.frames("a.dmsrec")
    )
    out.write_run({"settings": replay_settings(CONFIG)})
    result = run_fleet(plan_fleet(recordings, FleetOptions(out.root, CONFIG)))
    assert result.summary["resumed"] == result.summary["complete"] == 1
    assert result.summary["frames"] == 4 and result.summary["clusterStartSeconds"] is None
    assert json.loads(out.run_file.read_text())["state"] == "complete"
    assert pq.read_table(out.recordings_table)["frames"].to_pylist() == [4]


def test_a_recordings_directory_is_its_name_quoted_never_hidden():
    assert recording_directory("route-1/drive.dmsrec") == "route-1%2Fdrive.dmsrec"
    assert recording_directory(".x") == "%2Ex"
    assert recording_directory("_drafts/a b") == "%5Fdrafts%2Fa%20b"
    assert urllib.parse.unquote(recording_directory("_drafts/a b")) == "_drafts/a b"


def test_recordings_and_the_run_are_named_by_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ours(tmp_path / "a.dmsrec")
    plan = plan_fleet(find_recordings(["a.dmsrec"]), FleetOptions(Path("run"), CONFIG))
    (task,) = plan.tasks
    assert Path(task.path).is_absolute() and Path(task.output).is_absolute()
