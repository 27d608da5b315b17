"""What a fleet run leaves as it ends, however it ends: each run directory's ``fleet.json`` and
``recordings.parquet`` (:mod:`.layout`), the comparison of the two models where there is a
baseline, and the run's result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..summary import utc_now
from .compare import FleetComparison, compare_runs, write_comparison
from .layout import LAYOUT_VERSION
from .plan import FleetPlan
from .summary import FleetSummary, RecordingSummary, fleet_summary, summary_table

__all__ = ["FleetResult", "Replayed", "run_document", "write_outputs"]


@dataclass
class Replayed:
    """What this run replayed: the recordings' summaries, their frames, and when the first
    recording was handed out and the last result came back (``time.monotonic()``)."""

    results: list[RecordingSummary] = field(default_factory=list)
    frames: int = 0
    first: float | None = None
    last: float | None = None


@dataclass
class FleetResult:
    """A run's end: every recording's summary (both models' with a baseline), the fleet's
    summary of the model's recordings and of the baseline's, and the comparison."""

    recordings: list[RecordingSummary]
    summary: FleetSummary
    interrupted: bool
    baseline: FleetSummary | None = None
    comparison: FleetComparison | None = None
    """With a baseline model, and the run complete: the two models compared (written to
    ``comparison/``)."""
    not_compared: str | None = None
    """Why the two models could not be compared (a side without one complete recording)."""
    first_handed_out: float | None = None
    last_row_written: float | None = None
    """``time.monotonic()`` when the first recording was handed out, and when the last result
    came back (its rows written)."""


def write_outputs(
    plan: FleetPlan,
    driver: Replayed,
    state: str,
    started_at: str,
    cluster_seconds: float | None,
) -> FleetResult:
    """Write each run directory's ``fleet.json`` and ``recordings.parquet`` as the run ends in
    ``state`` (``complete``, ``interrupted``, ``failed``), and with a baseline complete, the
    comparison; the run's result."""
    import pyarrow.parquet as pq

    order = {recording.name: at for at, recording in enumerate(plan.recordings)}
    recordings = sorted(
        plan.resumed + driver.results, key=lambda s: (order[s["recording"]], s["model"] != "model")
    )
    seconds = driver.last - driver.first if driver.first and driver.last else None
    summaries: dict[str, FleetSummary] = {}
    for kind, run in plan.runs.items():
        own = [s for s in recordings if s["model"] == kind]
        complete = [run.frames(s["recording"]) for s in own if s["status"] == "complete"]
        summaries[kind] = fleet_summary(
            own,
            complete,
            resumed=sum(1 for s in plan.resumed if s["model"] == kind),
            replay_seconds=seconds,
            replayed_frames=driver.frames,
            cluster_start_seconds=cluster_seconds,
        )
        partial = run.root / f".{run.recordings_table.name}.partial"
        pq.write_table(summary_table(own), partial)
        partial.replace(run.recordings_table)
        run.write_run(run_document(plan, kind, state, started_at, own, summaries[kind]))
    comparison, not_compared = None, None
    if "baseline" in plan.runs and state == "complete":
        try:
            comparison = compare_runs(plan.runs["baseline"].root, plan.runs["model"].root)
        except ValueError as exc:  # a side without one complete recording: nothing to compare
            not_compared = str(exc)
        else:
            write_comparison(comparison, plan.runs["model"].comparison_dir)
    return FleetResult(
        recordings,
        summaries["model"],
        state == "interrupted",
        summaries.get("baseline"),
        comparison,
        not_compared,
        driver.first,
        driver.last,
    )


def run_document(
    plan: FleetPlan,
    kind: str,
    state: str,
    started_at: str,
    recordings: list[RecordingSummary],
    fleet: FleetSummary | None,
) -> dict[str, Any]:
    """A run directory's ``fleet.json``: the run of ``kind``'s model in ``state``."""
    return {
        "version": LAYOUT_VERSION,
        "state": state,
        "startedAt": started_at,
        "endedAt": None if state == "running" else utc_now(),
        "settings": plan.settings[kind],
        "inputs": len(plan.recordings),
        "recordings": recordings,
        "fleet": fleet,
    }
