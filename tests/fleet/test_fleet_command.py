"""``aio-dms fleet`` as a user runs it: joining the session's cluster (``--address``), its exit
codes and output; and a cluster of two nodes made with Ray's own test utility."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import cluster_address

from pipelines.dms.fleet import RunDirectory
from pipelines.dms.fleet.processes import alive, descendants
from pipelines.dms.sinks.parquet import partial_path

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]


def fleet_command(*words: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.cli", "fleet", *words, "--device", "cpu"]


def run(*words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        fleet_command(*words), cwd=ROOT, capture_output=True, text=True, timeout=180
    )


def until_replaying(process: subprocess.Popen[str], frames_file: Path) -> None:
    """Until the command's worker has begun replaying into ``frames_file`` (its partial file is
    there) or the command has ended: 60 s at most."""
    for _ in range(1200):
        if partial_path(frames_file).exists() or process.poll() is not None:
            return
        try:
            process.wait(0.05)
        except subprocess.TimeoutExpired:
            pass
    raise AssertionError(f"no replay into {frames_file} within 60 s")


def test_a_fleet_with_a_failed_recording_exits_4_with_its_reason(ray_cluster, recordings, tmp_path):
    garbage = tmp_path / "garbage.dmsrec"
    garbage.write_bytes(b"not a recording")
    out = tmp_path / "run"
    done = run(
        str(recordings["a"]), str(garbage), "--out", str(out),
        "--address", cluster_address(ray_cluster), "--workers", "2",
    )  # fmt: skip
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr
    assert "fleet summary" in done.stdout
    assert "not complete: garbage.dmsrec: " in done.stdout
    document = json.loads((out / "fleet.json").read_text())
    assert document["fleet"]["failed"] == 1
    assert document["fleet"]["complete"] == 1
    assert RunDirectory(out).done("a.dmsrec")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_fleet_with_exit_130_and_its_outputs_marked(
    ray_cluster, recordings, tmp_path, signum
):
    """SIGTERM too: Ray's own handler for it, installed as a driver connects, would abort."""
    out = tmp_path / "run"
    frames_file = RunDirectory(out).frames("long.dmsrec")
    process = subprocess.Popen(
        fleet_command(
            str(recordings["long"]), "--out", str(out), "--address", cluster_address(ray_cluster)
        ),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        until_replaying(process, frames_file)
        assert process.poll() is None, process.communicate()
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "not complete: long.dmsrec: stopped" in stdout
    assert json.loads((out / "fleet.json").read_text())["state"] == "interrupted"
    assert not frames_file.exists()


def test_more_workers_than_the_clusters_cpus_exit_2_in_one_line(ray_cluster, recordings, tmp_path):
    done = run(
        str(recordings["a"]), "--out", str(tmp_path / "run"),
        "--address", cluster_address(ray_cluster), "--workers", "3",
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "aio-dms fleet: --workers 3: the cluster has 2 CPUs"
    ]


TWO_NODES = textwrap.dedent(
    """
    import sys
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    print(cluster.address, flush=True)
    sys.stdin.read()  # until the test closes it
    cluster.shutdown()
    """
)


def test_a_fleet_spreads_over_two_nodes(ray_cluster, recordings, tmp_path):
    """Two nodes of one CPU each (Ray's multi-node test utility, on 127.0.0.1): two workers,
    one on each, replay the recordings into one dataset."""
    del ray_cluster  # the session's cluster runs beside this one
    nodes = subprocess.Popen(
        [sys.executable, "-c", TWO_NODES],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    try:
        assert nodes.stdout is not None
        address = nodes.stdout.readline().strip()
        assert address.startswith("127.0.0.1:"), nodes.stderr.read() if nodes.stderr else ""
        out = tmp_path / "run"
        inputs = [str(recordings[name]) for name in ("a", "b", "c")]
        done = subprocess.run(
            fleet_command(*inputs, "--out", str(out), "--address", address, "--workers", "2"),
            cwd=ROOT, capture_output=True, text=True, timeout=180,
            env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    finally:
        nodes.communicate(input="", timeout=60)
    recordings_table = pq.read_table(out / "recordings.parquet").to_pydict()
    assert recordings_table["status"] == ["complete"] * 3
    nodes_used = {worker.partition(":")[0] for worker in recordings_table["worker"]}
    assert len(nodes_used) == 2  # one worker a node: the cluster's one CPU each
    assert pq.read_table(out / "frames").num_rows == 24 + 30 + 36


def docs_fleet_example() -> str:
    """The fleet's python example as docs/fleets.md shows it."""
    page = (ROOT / "docs" / "fleets.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    (block,) = [block for block in blocks if "run_fleet(plan)" in block]
    return block


def test_the_docs_fleet_example_runs_on_a_local_cluster_of_its_own(recordings, tmp_path):
    (tmp_path / "drives").mkdir()
    for name in ("a", "b"):
        (tmp_path / "drives" / f"{name}.dmsrec").write_bytes(recordings[name].read_bytes())
    (tmp_path / "example.py").write_text(docs_fleet_example())
    done = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True,
        timeout=180, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    share, statuses = done.stdout.strip().rsplit(" ", 1)[0], done.stdout.strip()
    assert statuses.endswith("['complete', 'complete']")
    assert 0 < float(share.split()[0]) <= 1
    assert pq.read_table(tmp_path / "runs" / "v2" / "frames").num_rows == 24 + 30


def test_a_second_signal_ends_the_fleet_at_once_and_its_local_clusters_processes_with_it(
    recordings, tmp_path
):
    out = tmp_path / "run"
    process = subprocess.Popen(
        fleet_command(str(recordings["long"]), "--out", str(out), "--workers", "1"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        frames_file = RunDirectory(out).frames("long.dmsrec")
        until_replaying(process, frames_file)
        started = descendants(process.pid)
        assert any(p.command.startswith("ray::ReplayWorker") for p in started), started
        process.send_signal(signal.SIGINT)
        try:
            process.wait(0.3)  # longer than a signal's echo: the next one is a second signal
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    ends = time.monotonic() + 10  # each is killed, then reaped by whichever is its parent
    while any(alive(p) for p in started) and time.monotonic() < ends:
        time.sleep(0.05)
    assert not [p for p in started if alive(p)], sorted(p.command[:30] for p in started)
