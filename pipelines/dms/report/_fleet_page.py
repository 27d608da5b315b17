"""The fleet report's page: the pictures beside the fleet's and the comparison's tables, in the
style of a run's page (:mod:`._page`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from aio_runtime import Availability

from ..fleet.compare import FleetComparison
from ..openpilot.policy import DECISIONS
from ._fleet_data import FleetData
from ._page import _STYLE, _rows

__all__ = ["TABLE_RECORDINGS", "fleet_page"]

TABLE_RECORDINGS = 20
"""Recordings each of the page's per-recording tables lists at most (the files have them all)."""


def _share(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{100 * value:.2f} %"


def _number(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.4g}"


def _fleet(data: FleetData) -> list[str]:
    share = data.valid / data.frames if data.frames else math.nan
    rows = [
        ["recordings", f"{len(data.recordings)}"],
        ["frames", f"{data.frames}"],
        ["valid", f"{data.valid} ({_share(share)})"],
        ["time (recorded)", f"{data.seconds:.1f} s"],
    ]
    for state in (Availability.DEGRADED, Availability.UNAVAILABLE):
        rows.append([f"time {state.value}", f"{sum(data.away[state].values()):.2f} s"])
    model = data.model_percentiles()
    rows.append(
        [
            "model time p50 / p99 / max",
            " / ".join(
                "—" if math.isnan(model[q]) else f"{model[q]:.1f}" for q in ("p50", "p99", "max")
            )
            + " ms",
        ]
    )
    kinds = [
        [kind, state.value, f"{seconds:.2f} s"]
        for state in (Availability.DEGRADED, Availability.UNAVAILABLE)
        for kind, seconds in data.away[state].items()
    ]
    worst = [
        [r.recording, f"{r.frames}", _share(r.valid_share)]
        for r in data.recordings[:TABLE_RECORDINGS]
    ]
    return [
        "<h2>Fleet</h2>",
        _rows(rows),
        "<h2>Time away from AVAILABLE by reason kind</h2>",
        _rows(kinds, ["kind", "state", "time"]) if kinds else "<p>None.</p>",
        "<h2>Recordings with the lowest valid share</h2>",
        _rows(worst, ["recording", "frames", "valid"]),
    ]


def _comparison(comparison: FleetComparison) -> list[str]:
    totals = [
        ["baseline (A)", str(comparison.baseline)],
        ["candidate (B)", str(comparison.candidate)],
        ["rows A / B", f"{comparison.rows_baseline} / {comparison.rows_candidate}"],
        ["frames compared", f"{comparison.compared}"],
        *([f"flip share {name}", _share(share)] for name, share in comparison.flip_shares.items()),
    ]
    fields = [
        [f.field, *(_number(v) for v in (f.mean, f.mean_abs, f.p50_abs, f.p99_abs, f.max_abs))]
        for f in comparison.fields_by_change()[:TABLE_RECORDINGS]
    ]
    recordings = [
        [
            r.recording,
            f"{r.compared}",
            *(_share(r.flip_shares[n]) for n in DECISIONS),
            _number(r.mean_abs),
        ]
        for r in comparison.recordings[:TABLE_RECORDINGS]
    ]
    return [
        "<h2>Comparison</h2>",
        _rows(totals),
        "<h2>Fields that moved most (B - A)</h2>",
        _rows(fields, ["field", "mean d", "mean |d|", "p50 |d|", "p99 |d|", "max |d|"]),
        "<h2>Recordings with the largest flip share</h2>",
        _rows(recordings, ["recording", "compared", *DECISIONS, "mean |d|"]),
        '<p class="note">A frame is compared when both runs have driver data for it. A decision '
        "flips when openpilot's rule (face detected, eyes closed, phone, distracted pose) "
        "decides differently on the two runs' values, on the side the baseline's "
        "wheelOnRightProb has openpilot monitor. fields.parquet and recordings.parquet hold "
        "every field and recording.</p>",
    ]


def fleet_page(
    fleet: FleetData | None,
    comparison: FleetComparison | None,
    images: Sequence[tuple[str, str]],
    *,
    source: str,
    notes: Sequence[str] = (),
) -> str:
    """The page: a title naming ``source``, ``notes``, each of ``images`` (file name, caption),
    then the fleet's tables (when ``fleet`` is given) and the comparison's (when
    ``comparison`` is)."""
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>DMS fleet report: {escape(source)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>DMS fleet report: {escape(source)}</h1>",
        *(f'<p class="note">{escape(note)}</p>' for note in notes),
    ]
    for name, caption in images:
        parts += [
            f"<h2>{escape(caption)}</h2>",
            f'<img src="{escape(name)}" alt="{escape(caption)}">',
        ]
    if fleet is not None:
        parts += _fleet(fleet)
    if comparison is not None:
        parts += _comparison(comparison)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
