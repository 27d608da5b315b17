"""Fleet replays on the session's Ray cluster: the dataset, resuming, and faults at fleet scale."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pyarrow.parquet as pq
import pytest

from pipelines.dms.config.kinds import CameraFile, DeviceKind, Mode
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.fleet import (
    ClusterError,
    FleetCluster,
    FleetOptions,
    FleetResult,
    RunDirectory,
    find_recordings,
    fleet_config,
    plan_fleet,
    run_fleet,
)
from pipelines.dms.fleet.processes import Process, alive, descendants, kill
from pipelines.dms.model.reference import build_reference_model, build_shifted_model, write_model
from pipelines.dms.openpilot.policy import WHEEL_ON_RIGHT_THRESHOLD
from pipelines.dms.service import DmsService
from pipelines.dms.sinks.parquet import DRIVER_COLUMNS, partial_path

pytestmark = pytest.mark.timeout(180)

CONFIG = fleet_config()
COMPARED = ["frameId", "valid", "eventValid", "availability", "reasonKind", *DRIVER_COLUMNS]
"""The columns that are the same however fast a replay ran (not its times and latencies)."""


def fleet(cluster: FleetCluster, inputs: list[Path], out: Path, **options: Any) -> FleetResult:
    plan = plan_fleet(find_recordings(inputs), FleetOptions(out, CONFIG, **options))
    return run_fleet(plan, cluster=cluster)


def rows(out: Path, recording: str) -> dict[str, list[Any]]:
    table = pq.read_table(RunDirectory(out).frames(recording)).sort_by("seq")
    return table.select(COMPARED).to_pydict()


def replayed_alone(recording: Path, out: Path) -> dict[str, list[Any]]:
    """The rows of ``recording`` replayed in this process, as ``aio-dms replay --parquet``."""
    config = ServiceConfig(
        camera=CameraFile(recording), parquet=out, mode=Mode.REPLAY, device=DeviceKind.CPU,
        no_budget=True, health_port=None,
    )  # fmt: skip

    async def replay() -> None:
        async with DmsService(config) as service:
            await service.finished()

    anyio.run(replay)
    return pq.read_table(out).sort_by("seq").select(COMPARED).to_pydict()


@pytest.fixture(scope="session")
def alone(
    recordings: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], dict[str, list[Any]]]:
    """Each recording's rows replayed alone, in this process (made once, when first asked)."""
    made: dict[str, dict[str, list[Any]]] = {}
    folder = tmp_path_factory.mktemp("alone")

    def of(name: str) -> dict[str, list[Any]]:
        if name not in made:
            made[name] = replayed_alone(recordings[name], folder / f"{name}.parquet")
        return made[name]

    return of


def when(predicate: Callable[[], bool], done: threading.Event, what: str) -> bool:
    """Wait until ``predicate`` holds (True) or the fleet ended first (False), within 60 s."""
    for _ in range(1200):
        if predicate():
            return True
        if done.wait(0.05):
            return predicate()
    raise AssertionError(f"{what} did not happen within 60 s")


def in_thread(
    run: Callable[[], FleetResult],
) -> tuple[threading.Thread, list[FleetResult], threading.Event]:
    results: list[FleetResult] = []
    done = threading.Event()

    def target() -> None:
        try:
            results.append(run())
        finally:
            done.set()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, results, done


def has_rows(path: Path) -> bool:
    """The partial frames file of ``path`` holds a row group (beyond its 4 magic bytes)."""
    partial = partial_path(path)
    return partial.exists() and partial.stat().st_size > 1024


def replay_workers() -> list[int]:
    return [p.pid for p in descendants() if p.command.startswith("ray::ReplayWorker")]


def test_every_recording_is_replayed_once_into_one_dataset(
    ray_cluster, recordings, alone, tmp_path
):
    inputs = [recordings[name] for name in ("a", "b", "c")]
    result = fleet(ray_cluster, inputs, tmp_path / "run", workers=2)
    assert not result.interrupted
    assert [s["status"] for s in result.recordings] == ["complete"] * 3
    assert [s["recording"] for s in result.recordings] == ["a.dmsrec", "b.dmsrec", "c.dmsrec"]
    dataset = pq.read_table(tmp_path / "run" / "frames")
    keys = list(zip(dataset["recording"].to_pylist(), dataset["frameId"].to_pylist(), strict=True))
    assert len(keys) == len(set(keys)) == 24 + 30 + 36
    assert rows(tmp_path / "run", "a.dmsrec") == alone("a")
    for summary in result.recordings:
        table = pq.read_table(RunDirectory(tmp_path / "run").frames(summary["recording"]))
        assert summary["frames"] == table.num_rows
        assert summary["valid"] == sum(table["valid"].to_pylist())
        assert summary["attempts"] == 1
    document = json.loads((tmp_path / "run" / "fleet.json").read_text())
    assert document["state"] == "complete"
    assert document["fleet"]["frames"] == 90
    assert document["fleet"]["validShare"] == pytest.approx(
        sum(s["valid"] for s in result.recordings) / 90
    )
    table = pq.read_table(tmp_path / "run" / "recordings.parquet")
    assert table["recording"].to_pylist() == ["a.dmsrec", "b.dmsrec", "c.dmsrec"]
    assert len({s["worker"] for s in result.recordings}) <= 2


def test_a_run_resumed_replays_only_the_recordings_not_done(ray_cluster, recordings, tmp_path):
    out = tmp_path / "run"
    first = fleet(ray_cluster, [recordings["a"], recordings["b"]], out, workers=2)
    assert first.summary["complete"] == 2
    done = {name: RunDirectory(out).frames(name).stat() for name in ("a.dmsrec", "b.dmsrec")}
    again = fleet(ray_cluster, [recordings[n] for n in ("a", "b", "c")], out, workers=2)
    assert again.summary["resumed"] == 2
    assert again.summary["complete"] == 3
    assert again.summary["frames"] == 24 + 30 + 36
    for name, stat in done.items():
        assert RunDirectory(out).frames(name).stat().st_mtime_ns == stat.st_mtime_ns
    assert [s["replaySeconds"] is None for s in again.recordings] == [False, False, False]


def test_a_recording_that_cannot_be_read_fails_alone(ray_cluster, recordings, tmp_path):
    garbage = tmp_path / "in" / "garbage.dmsrec"
    garbage.parent.mkdir()
    garbage.write_bytes(b"DMSNV12\0" + os.urandom(300))
    cut = tmp_path / "in" / "cut.dmsrec"
    cut.write_bytes(recordings["b"].read_bytes()[: recordings["b"].stat().st_size // 2])
    result = fleet(ray_cluster, [garbage, recordings["a"], cut], tmp_path / "run", workers=2)
    by_name = {s["recording"]: s for s in result.recordings}
    assert by_name["a.dmsrec"]["status"] == "complete"
    for name in ("garbage.dmsrec", "cut.dmsrec"):
        assert by_name[name]["status"] == "failed"
        assert by_name[name]["reason"]
        assert by_name[name]["attempts"] == 1  # a recording's failure is not retried
        assert not RunDirectory(tmp_path / "run").done(name)
    assert result.summary["failed"] == 2
    assert set(result.summary["failures"]) == {"garbage.dmsrec", "cut.dmsrec"}


def test_a_worker_killed_after_writing_rows_is_replaced_and_its_recording_replayed_once(
    ray_cluster, recordings, alone, tmp_path
):
    out = tmp_path / "run"
    frames_file = RunDirectory(out).frames("long.dmsrec")
    plan = plan_fleet(
        find_recordings([recordings["long"]]), FleetOptions(out, CONFIG, workers=1, row_group=16)
    )
    thread, results, done = in_thread(lambda: run_fleet(plan, cluster=ray_cluster))
    killed = when(lambda: has_rows(frames_file), done, "rows written")
    assert killed, "the replay ended before its worker could be killed"
    (pid,) = replay_workers()
    os.kill(pid, signal.SIGKILL)
    thread.join(120)
    (result,) = results
    (summary,) = result.recordings
    assert summary["status"] == "complete", summary["reason"]
    assert summary["attempts"] == 2
    assert rows(out, "long.dmsrec") == alone("long")  # each frame once, as replayed alone
    assert pid not in replay_workers()


def test_a_hung_worker_is_killed_at_its_recordings_bound(ray_cluster, recordings, tmp_path):
    out = tmp_path / "run"
    frames_file = RunDirectory(out).frames("long.dmsrec")
    # 20 s to start (a worker on a busy machine writes its first rows well within it, so it is
    # stopped before its bound), and 0.01 s a frame once the worker has said it holds 400
    plan = plan_fleet(
        find_recordings([recordings["long"]]),
        FleetOptions(out, CONFIG, workers=1, row_group=16, start_timeout=20, frame_timeout=0.01),
    )
    thread, results, done = in_thread(lambda: run_fleet(plan, cluster=ray_cluster))
    stopped: list[Process] = []
    try:
        if when(lambda: has_rows(frames_file), done, "rows written"):
            (worker,) = [p for p in descendants() if p.command.startswith("ray::ReplayWorker")]
            os.kill(worker.pid, signal.SIGSTOP)  # hung: not one more step of its loop
            stopped.append(worker)
        thread.join(120)
        (summary,) = results[0].recordings
        assert summary["status"] == "failed"
        # (a worker stopped before the driver heard how long the recording is: 20 s)
        assert re.search(r"exceeded the recording's bound of (24|20)\.0 s", summary["reason"] or "")
        assert not frames_file.exists()
        for worker in stopped:  # killed: the CPU it held is the cluster's again
            when(lambda: not alive(worker), threading.Event(), "the hung worker's end")  # noqa: B023
    finally:
        kill(set(stopped))


def test_a_stopped_fleet_marks_what_it_did_not_complete(ray_cluster, recordings, tmp_path):
    out = tmp_path / "run"
    frames_file = RunDirectory(out).frames("long.dmsrec")
    plan = plan_fleet(
        find_recordings([recordings[n] for n in ("long", "a")]),
        FleetOptions(out, CONFIG, workers=1, row_group=16),
    )
    stop = threading.Event()
    thread, results, done = in_thread(lambda: run_fleet(plan, cluster=ray_cluster, stop=stop))
    assert when(lambda: has_rows(frames_file), done, "rows written")
    stop.set()
    thread.join(60)
    (result,) = results
    assert result.interrupted
    assert [(s["status"], s["reason"]) for s in result.recordings] == [
        ("interrupted", "stopped"),
        ("interrupted", "not started"),
    ]
    assert not frames_file.exists()
    assert pq.read_table(partial_path(frames_file)).num_rows >= 16  # its rows kept, readable
    assert json.loads((out / "fleet.json").read_text())["state"] == "interrupted"


def test_more_workers_than_the_cluster_has_cpus_are_refused(ray_cluster, recordings, tmp_path):
    plan = plan_fleet(
        find_recordings([recordings["a"]]), FleetOptions(tmp_path / "run", CONFIG, workers=3)
    )
    with pytest.raises(ClusterError, match="--workers 3: the cluster has 2 CPUs"):
        run_fleet(plan, cluster=ray_cluster)
    assert not (tmp_path / "run").exists()


def test_a_baseline_model_is_replayed_beside_and_the_flips_of_a_shifted_head_are_counted(
    ray_cluster, recordings, tmp_path
):
    """The model under test is the reference model with its left-hand phone head's bias moved
    by -20: exactly the frames where openpilot monitors the left side and the reference model's
    phone probability is above 0.5 flip the phone decision; nothing else moves."""
    reference = write_model(build_reference_model(), tmp_path / "reference.onnx")
    shifted = write_model(build_shifted_model("using_phone_prob_lhd", -20.0), tmp_path / "s.onnx")
    out = tmp_path / "run"
    plan = plan_fleet(
        find_recordings([recordings["a"], recordings["b"]]),
        FleetOptions(out, fleet_config(model=shifted), baseline_model=reference, workers=2),
    )
    result = run_fleet(plan, cluster=ray_cluster)
    assert [(s["recording"], s["model"], s["status"]) for s in result.recordings] == [
        ("a.dmsrec", "model", "complete"), ("a.dmsrec", "baseline", "complete"),
        ("b.dmsrec", "model", "complete"), ("b.dmsrec", "baseline", "complete"),
    ]  # fmt: skip
    assert result.summary["frames"] == result.baseline["frames"] == 24 + 30
    baseline = pq.read_table(out / "baseline" / "frames")
    left = baseline["wheelOnRightProb"].to_numpy() <= WHEEL_ON_RIGHT_THRESHOLD
    phone = baseline["left.phoneProb"].to_numpy().astype(np.float64)
    logits = np.log(phone) - np.log1p(-phone)
    flipped = left & ((logits > 0) != (logits - 20.0 > 0))
    assert flipped.any()
    comparison = result.comparison
    assert comparison is not None
    assert comparison.flip_shares["phone"] == pytest.approx(flipped.sum() / len(flipped))
    assert {name: share for name, share in comparison.flip_shares.items() if name != "phone"} == {
        "faceDetected": 0.0, "eyesClosed": 0.0, "distractedPose": 0.0,
    }  # fmt: skip
    assert {f.field for f in comparison.fields if f.max_abs > 0} == {"left.phoneProb"}
    written = pq.read_table(out / "comparison" / "recordings.parquet").to_pydict()
    names = baseline["recording"].to_numpy(zero_copy_only=False)
    by_recording = dict(zip(written["recording"], written["flips.phone"], strict=True))
    assert by_recording == {
        name: int(flipped[names == name].sum()) for name in ("a.dmsrec", "b.dmsrec")
    }


def test_a_baseline_run_with_nothing_to_compare_says_why(ray_cluster, tmp_path):
    garbage = tmp_path / "garbage.dmsrec"
    garbage.write_bytes(b"not a recording")
    reference = write_model(build_reference_model(), tmp_path / "reference.onnx")
    plan = plan_fleet(
        find_recordings([garbage]), FleetOptions(tmp_path / "run", CONFIG, baseline_model=reference)
    )
    result = run_fleet(plan, cluster=ray_cluster)
    assert [s["status"] for s in result.recordings] == ["failed", "failed"]
    assert result.comparison is None
    assert result.not_compared
    assert not (tmp_path / "run" / "comparison").exists()
