"""Fleet replays: the DMS service's replay mode over many recordings on a Ray cluster.

``aio-dms fleet INPUTS... --out DIR`` (:mod:`pipelines.cli.fleet`) finds the recordings (:mod:`.inputs`),
plans the run in its directory (:mod:`.plan`, :mod:`.layout`: new, or resumed), has a cluster
(:mod:`.cluster`), and drives its workers (:mod:`.driver`: Ray actors, :mod:`.worker`), each
replaying one recording at a time to its frames file; the summaries are :mod:`.summary`'s.

From Python::

    plan = plan_fleet(find_recordings(["drives/"]), FleetOptions(Path("run")))
    result = run_fleet(plan)          # a local cluster, started and ended here

Ray and pyarrow are the ``fleet`` extra's.
"""

from __future__ import annotations

from .cluster import ClusterError, FleetCluster
from .driver import FleetProgress, run_fleet
from .inputs import Recording, find_recordings
from .layout import RunDirectory
from .outputs import FleetResult
from .plan import FleetOptions, FleetPlan, fleet_config, plan_fleet
from .summary import FleetSummary, RecordingSummary

__all__ = [
    "ClusterError",
    "FleetCluster",
    "FleetOptions",
    "FleetPlan",
    "FleetProgress",
    "FleetResult",
    "FleetSummary",
    "Recording",
    "RecordingSummary",
    "RunDirectory",
    "find_recordings",
    "fleet_config",
    "plan_fleet",
    "run_fleet",
]
