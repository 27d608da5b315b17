"""``aio-dms report DIR -o OUT`` of a fleet: a fleet run directory, a comparison, or both.

``DIR`` is a fleet run directory (it has ``frames/``: :mod:`pipelines.dms.fleet.run_frames`) or a
comparison directory (it has ``comparison.json``: :func:`~pipelines.dms.fleet.compare.
write_comparison`). A run directory's report draws its frames (:mod:`._fleet_data`) and, when
``DIR/comparison`` exists, that comparison too; a comparison directory's, the comparison only.
The pictures (:mod:`.fleet_figures`, :data:`FLEET_CAPTIONS`) and ``index.html`` are written as
a run's report writes its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..fleet.compare import COMPARISON_FILES, FleetComparison, read_comparison
from ..fleet.run_frames import is_run_directory
from ._fleet_data import FleetData, read_fleet
from ._fleet_page import fleet_page
from ._page import write_pictures

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "COMPARISON_DIR",
    "FLEET_CAPTIONS",
    "FleetInputs",
    "draw_fleet",
    "is_fleet_input",
    "read_fleet_inputs",
    "write_fleet_report",
]

COMPARISON_DIR = "comparison"
"""The folder of a run directory whose comparison its report draws too."""
FLEET_CAPTIONS = {
    "valid": "Valid share per recording",
    "away": "Time DEGRADED and UNAVAILABLE by reason kind",
    "model": "Model execution time",
    "differences": "Differences per field (candidate - baseline)",
    "flips": "Decision flips per recording",
}
"""Each picture's caption on the page, by name (``NAME.png``), in the page's order."""


@dataclass(frozen=True)
class FleetInputs:
    """What a fleet report reads: a run's frames, a comparison, or both."""

    fleet: FleetData | None
    comparison: FleetComparison | None


def is_fleet_input(path: Path) -> bool:
    """Whether ``path`` is a directory a fleet report is drawn of (nothing is read)."""
    return is_run_directory(path) or (path / COMPARISON_FILES[-1]).is_file()


def read_fleet_inputs(path: Path) -> FleetInputs:
    """The run's frames and its comparison (``path/comparison``, where it exists), or the
    comparison ``path`` is; :class:`ValueError`, one line, for what cannot be read."""
    if not is_run_directory(path):
        return FleetInputs(None, read_comparison(path))
    fleet = read_fleet(path)
    beside = path / COMPARISON_DIR
    return FleetInputs(fleet, read_comparison(beside) if beside.exists() else None)


def draw_fleet(inputs: FleetInputs) -> dict[str, Figure]:
    """Every picture of the fleet report, by name (:data:`FLEET_CAPTIONS`' names)."""
    from . import fleet_figures as draw

    figures: dict[str, Figure] = {}
    if inputs.fleet is not None:
        figures["valid"] = draw.valid_share_figure(inputs.fleet)
        figures["away"] = draw.time_away_figure(inputs.fleet)
        figures["model"] = draw.model_time_figure(inputs.fleet)
    if inputs.comparison is not None:
        figures["differences"] = draw.differences_figure(inputs.comparison)
        figures["flips"] = draw.flips_figure(inputs.comparison)
    return figures


def write_fleet_report(
    inputs: FleetInputs, directory: Path, *, source: str, notes: Sequence[str] = ()
) -> list[Path]:
    """Draw the pictures and write them (``NAME.png``) and ``index.html`` into ``directory``
    (made if missing); the files written, the page last. :class:`OSError` if a file cannot
    be written."""
    return write_pictures(
        directory,
        draw_fleet(inputs),
        FLEET_CAPTIONS,
        lambda images: fleet_page(
            inputs.fleet, inputs.comparison, images, source=source, notes=notes
        ),
    )
