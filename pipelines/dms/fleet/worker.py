"""A fleet's worker: the DMS service's replay mode, one recording at a time, on its event loop.

:class:`ReplayWorker` is the class of the fleet's Ray actors (the driver makes it one with
``ray.remote``): an async actor, so each :meth:`~ReplayWorker.replay` runs on the event loop Ray
gives it, as the service runs in a car — the same stages, the same bounded waits, the replay's
backpressure and its typed failures —, with the health endpoint off and no CPUs of its own
(the model's thread is not placed: two workers on one machine would share the CPUs placed).

A replay writes its rows to the recording's frames file (:mod:`~..sinks.parquet`: whole or none)
and returns its summary (:mod:`.summary`): ``complete``, or ``failed`` with the reason — the
service refused to start on it (a recording that is not one, a segment without its log), the
camera failed as it was read (a damaged frame), or its rows could not all be written. Only this
module of the fleet runs on the workers; it imports no Ray.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from ..config.kinds import CameraFile, Mode
from ..config.settings import ServiceConfig
from ..service import DmsService, StartupError
from ..sinks.parquet import ROW_GROUP
from .summary import RecordingSummary, failed_summary, recording_summary

__all__ = ["ReplayTask", "ReplayWorker", "WorkerProgress"]


@dataclass(frozen=True)
class ReplayTask:
    """One recording to replay: its name and path, the frames file to write, the settings of
    the replay (the fleet's; camera, output and mode are set here) and which model it is
    (``model`` or ``baseline``); ``attempt``: 1 the first time, counted up by the driver."""

    recording: str
    path: str
    output: str
    config: ServiceConfig
    model: str = "model"
    attempt: int = 1
    row_group: int = ROW_GROUP


@dataclass(frozen=True)
class WorkerProgress:
    """What a worker is doing: the recording (None: nothing), its frames published so far,
    and how many it holds (None: not known yet)."""

    recording: str | None
    frames: int
    length: int | None


class ReplayWorker:
    """Replays recordings, one at a time (see the module's description)."""

    def __init__(self) -> None:
        self._task: ReplayTask | None = None
        self._service: DmsService | None = None

    async def where(self) -> str:
        """``NODE_ID:PID`` of this worker (the node's id as Ray names it)."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        return f"{node}:{os.getpid()}"

    async def progress(self) -> WorkerProgress:
        service, task = self._service, self._task
        if task is None:
            return WorkerProgress(None, 0, None)
        if service is None:
            return WorkerProgress(task.recording, 0, None)
        frames = service.summary.frames
        return WorkerProgress(task.recording, frames.received, service.source_length)

    async def replay(self, task: ReplayTask) -> RecordingSummary:
        """Replay ``task``'s recording to its frames file; its summary."""
        facts: dict[str, Any] = {
            "recording": task.recording,
            "path": task.path,
            "model": task.model,
            "attempts": task.attempt,
            "worker": await self.where(),
        }
        output = Path(task.output)
        if task.attempt > 1 and await anyio.Path(output).is_file():
            import pyarrow.parquet as pq  # an earlier attempt wrote it whole, then its worker died

            return recording_summary(pq.read_table(output), **facts)
        config = dataclasses.replace(
            task.config,
            camera=CameraFile(Path(task.path)),
            parquet=output,
            mode=Mode.REPLAY,
            health_port=None,
            model_cpus=None,
        )
        self._task = task
        started, cpu = time.monotonic(), time.process_time()
        try:
            await anyio.Path(output.parent).mkdir(parents=True, exist_ok=True)
            service = DmsService(config, recording=task.recording, row_group=task.row_group)
            self._service = service
            async with service:
                facts["startSeconds"] = time.monotonic() - started  # opened, model loaded
                await service.finished()
        except StartupError as exc:
            return failed_summary(**facts, reason=str(exc))
        except OSError as exc:
            return failed_summary(**facts, reason=f"its frames file: {exc}")
        finally:
            self._task = self._service = None
        summary = service.summary
        if summary.camera_error is not None:
            return failed_summary(**facts, reason=f"the camera failed: {summary.camera_error}")
        if summary.sink_error is not None:
            return failed_summary(**facts, reason=f"its rows: {summary.sink_error}")
        if not await anyio.Path(output).is_file():
            return failed_summary(**facts, reason="its rows were not all written")
        import pyarrow.parquet as pq

        return recording_summary(
            pq.read_table(output),
            **facts,
            replaySeconds=time.monotonic() - started,
            cpuSeconds=time.process_time() - cpu,
        )
