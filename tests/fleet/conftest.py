"""The fleet tests' setup: one local Ray cluster for the whole session, and the recordings.

These tests run as their own pytest step (``make test``'s second): they need Ray, and share one
cluster (its start costs seconds). The processes the session starts are recorded (all of this
process's descendants, Ray's included) and, at the end, the ones still alive are ended — those
only: never a machine-wide ``ray stop``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_recordings import write_recording

from pipelines.dms.fleet.cluster import FleetCluster, ray_environment
from pipelines.dms.fleet.processes import Process, alive, descendants, kill

CLUSTER_CPUS = 2


def end(processes: set[Process], grace: float = 5.0) -> list[Process]:
    """End ``processes`` that are still alive: SIGTERM, then SIGKILL after ``grace`` seconds;
    the ones that had to be ended."""
    left = [p for p in processes if alive(p)]
    for process in left:
        with contextlib.suppress(OSError):
            os.kill(process.pid, signal.SIGCONT)  # a stopped one handles its SIGTERM
            os.kill(process.pid, signal.SIGTERM)
    ends = time.monotonic() + grace
    for process in left:
        while alive(process) and time.monotonic() < ends:
            time.sleep(0.05)  # a bounded wait for it to end by itself
    kill(set(left))
    return left


@pytest.fixture(scope="session")
def started_processes() -> Iterator[set[Process]]:
    """Every process the session starts, recorded as the tests go (:func:`record_processes`), ended at
    the session's end if still alive."""
    recorded: set[Process] = set()
    yield recorded
    recorded |= descendants()
    end(recorded)


@pytest.fixture(scope="session")
def ray_cluster(
    started_processes: set[Process], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FleetCluster]:
    """The session's local Ray cluster: 2 CPUs, on 127.0.0.1, started once (its logs and
    sockets in the session's temporary directory)."""
    ray_environment(local=True)
    with FleetCluster(None, CLUSTER_CPUS, tmp_path_factory.mktemp("ray")) as cluster:
        started_processes |= descendants()
        yield cluster
        started_processes |= descendants()


@pytest.fixture(autouse=True)
def record_processes(started_processes: set[Process]) -> Iterator[None]:
    """After each test, the processes it left running are recorded too."""
    yield
    started_processes |= descendants()


@pytest.fixture(scope="session")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Recordings made once: ``short-N`` of N frames, ``long`` of 400."""
    folder = tmp_path_factory.mktemp("recordings")
    made = {}
    for name, frames in (("a", 24), ("b", 30), ("c", 36), ("long", 400)):
        made[name] = write_recording(folder / f"{name}.dmsrec", frames, seed=len(made))
    return made


def cluster_address(cluster: FleetCluster) -> str:
    """The session cluster's GCS address, for a command line's ``--address``."""
    import ray

    del cluster
    return str(ray.get_runtime_context().gcs_address)


def command_environment() -> dict[str, str]:
    """The environment of a command joining the session's cluster: its token included."""
    return dict(os.environ)
