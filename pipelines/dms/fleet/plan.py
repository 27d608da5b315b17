"""A fleet run's plan: its options, and what it will do, checked before any work.

:func:`plan_fleet` finds, for each recording and each model (the one under test and, with
``--baseline-model``, the baseline), whether an earlier run in ``--out`` replayed it whole
(resumed: its summary taken from that run's ``fleet.json``, or made again from its frames file)
or it is to be replayed (a :class:`~.worker.ReplayTask`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.kinds import DeviceKind, Mode
from ..config.settings import ServiceConfig
from ..sinks.parquet import ROW_GROUP
from .inputs import Recording
from .layout import RunDirectory, replay_settings
from .summary import RecordingSummary, recording_summary
from .worker import ReplayTask

__all__ = ["FleetOptions", "FleetPlan", "fleet_config", "plan_fleet"]


def fleet_config(**settings: Any) -> ServiceConfig:
    """A fleet's replay settings, as ``aio-dms fleet`` makes them: replay mode, the model on
    onnxruntime on the CPU, no frame budget; ``settings`` the others (checked)."""
    given: dict[str, Any] = {"device": DeviceKind.CPU, "no_budget": True, **settings}
    return ServiceConfig(mode=Mode.REPLAY, **given)


@dataclass(frozen=True)
class FleetOptions:
    """How to run a fleet: ``out`` (the run's directory), ``config`` (the replays' settings:
    :func:`fleet_config`'s by default),
    ``baseline_model`` (a second model replayed over every recording too, and compared),
    ``workers`` (None: one a CPU of the cluster), ``address`` (None: a local cluster), the
    per-recording bound (``start_timeout`` seconds plus ``frame_timeout`` a frame), the
    ``attempts`` a recording gets when its worker dies, the frames files' ``row_group``."""

    out: Path
    config: ServiceConfig = field(default_factory=lambda: fleet_config())
    baseline_model: Path | None = None
    workers: int | None = None
    address: str | None = None
    frame_timeout: float = 0.25
    start_timeout: float = 60.0
    attempts: int = 3
    row_group: int = ROW_GROUP


@dataclass(frozen=True)
class FleetPlan:
    """What a run will do, checked before any work: the tasks to hand out, the summaries of
    the recordings an earlier run completed (resumed), and the directories written."""

    options: FleetOptions
    recordings: list[Recording]
    tasks: list[ReplayTask]
    resumed: list[RecordingSummary]
    runs: dict[str, RunDirectory]
    """``model`` (and ``baseline``) → its run directory."""
    settings: dict[str, dict[str, Any]]


def plan_fleet(recordings: list[Recording], options: FleetOptions) -> FleetPlan:
    """The plan of a run; :class:`ValueError` (one line) for an ``--out`` that cannot be used
    (see :meth:`~.layout.RunDirectory.check`)."""
    main = RunDirectory(options.out.absolute())  # as a worker on another node sees it
    models: dict[str, ServiceConfig] = {"model": options.config}
    runs = {"model": main}
    if options.baseline_model is not None:
        models["baseline"] = dataclasses.replace(options.config, model=options.baseline_model)
        runs["baseline"] = main.baseline
    settings = {kind: replay_settings(config) for kind, config in models.items()}
    resumed: list[RecordingSummary] = []
    tasks: list[ReplayTask] = []
    earlier: dict[tuple[str, str], RecordingSummary] = {}
    for kind, run in runs.items():  # each run directory's fleet.json holds its own model's
        if run.check(settings[kind]):
            earlier.update(_earlier_summaries(run))
    for recording in recordings:
        for kind, config in models.items():
            run = runs[kind]
            if run.done(recording.name):
                resumed.append(_resumed(earlier, recording, kind, run))
                continue
            tasks.append(
                ReplayTask(
                    recording.name,
                    str(recording.path),
                    str(run.frames(recording.name)),
                    config,
                    model=kind,
                    row_group=options.row_group,
                )
            )
    return FleetPlan(options, recordings, tasks, resumed, runs, settings)


def _earlier_summaries(run: RunDirectory) -> dict[tuple[str, str], RecordingSummary]:
    try:
        document = json.loads(run.run_file.read_text(encoding="utf-8"))
        listed = document.get("recordings", [])
        return {(s["recording"], s["model"]): s for s in listed if s["status"] == "complete"}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _resumed(
    earlier: dict[tuple[str, str], RecordingSummary],
    recording: Recording,
    kind: str,
    run: RunDirectory,
) -> RecordingSummary:
    summary = earlier.get((recording.name, kind))
    if summary is not None:
        return summary
    import pyarrow.parquet as pq

    table = pq.read_table(run.frames(recording.name))
    return recording_summary(table, recording=recording.name, path=str(recording.path), model=kind)
