"""The fleet report's pictures: a fleet run's frames (:class:`~._fleet_data.FleetData`) and a
comparison of two runs (:class:`~pipelines.dms.fleet.compare.FleetComparison`).

Each function returns a :class:`matplotlib.figure.Figure` on an Agg canvas of its own, as
:mod:`.figures` does. What is drawn can be found on the figure: the bars of each picture are
containers labelled with what they count (``valid share``, each state, each decision), each
field's histogram an axes whose title begins with the field's name, the model time's
percentiles lines with the gids ``p50`` and ``p99``.
"""

from __future__ import annotations

import math

from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from aio_runtime import Availability

from ..fleet.compare import FleetComparison
from ..openpilot.policy import DECISIONS
from ._fleet_data import FleetData
from .figures import COLOURS, _figure

__all__ = [
    "SHOWN_FIELDS",
    "SHOWN_RECORDINGS",
    "differences_figure",
    "flips_figure",
    "model_time_figure",
    "time_away_figure",
    "valid_share_figure",
]

SHOWN_RECORDINGS = 30
"""Recordings a per-recording picture shows at most (the lowest valid share, the most flips)."""
SHOWN_FIELDS = 6
"""Fields the differences picture shows at most (the largest mean |d|)."""
_DECISION_COLOURS = dict(zip(DECISIONS, ("#1f5fa8", "#8e44ad", "#e8a33d", "#3a9d5d"), strict=True))


def _bar_height(count: int) -> float:
    """Inches for ``count`` horizontal bars (a title and an axis around them)."""
    return 1.4 + 0.22 * max(count, 3)


def _nothing(figure: Figure, text: str, title: str) -> Figure:
    ax = figure.subplots()
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    ax.set_title(title, loc="left")
    return figure


def _shown(total: int, shown: int, what: str) -> str:
    return f"{what}, {shown} of {total} shown" if shown < total else what


def valid_share_figure(data: FleetData) -> Figure:
    """Each recording's share of valid frames, the lowest first (at most
    :data:`SHOWN_RECORDINGS`), the fleet's share as a dashed line."""
    recordings = data.recordings[:SHOWN_RECORDINGS]
    figure = _figure(_bar_height(len(recordings)))
    share = data.valid / data.frames if data.frames else 0.0
    title = f"valid share per recording: {share:.1%} of {data.frames} frames"
    if not recordings:
        return _nothing(figure, "no frames", title)
    ax = figure.subplots()
    names = [r.recording for r in recordings]
    bars = ax.barh(
        range(len(names)),
        [r.valid_share for r in recordings],
        0.7,
        color=COLOURS[Availability.AVAILABLE],
        label="valid share",
    )
    ax.bar_label(bars, labels=[f"{r.valid_share:.1%}" for r in recordings], padding=2, fontsize=7)
    ax.axvline(share, color="#222222", linestyle="--", linewidth=1, gid="fleet")
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.08)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(axis="x", alpha=0.3)
    total = len(data.recordings)
    ax.set_title(_shown(total, len(recordings), f"{title}, {total} recordings"), loc="left")
    return figure


def time_away_figure(data: FleetData) -> Figure:
    """Seconds DEGRADED and UNAVAILABLE across the fleet, by the reason's kind (the kinds with
    the most time first), each bar's seconds on it."""
    figure = _figure(3.8)
    states = (Availability.DEGRADED, Availability.UNAVAILABLE)
    totals: dict[str, float] = {}
    for state in states:
        for kind, seconds in data.away[state].items():
            totals[kind] = totals.get(kind, 0.0) + seconds
    kinds = sorted(totals, key=lambda k: (-totals[k], k))
    away = sum(totals.values())
    title = (
        f"time away from AVAILABLE: {away:.1f} s of {data.seconds:.1f} s "
        f"({away / data.seconds if data.seconds else 0.0:.1%}), by reason kind"
    )
    if not kinds:
        return _nothing(figure, "no frame away from AVAILABLE", title)
    ax = figure.subplots()
    width = 0.38
    for at, state in enumerate(states):
        xs = [i + (at - 0.5) * width for i in range(len(kinds))]
        heights = [data.away[state].get(kind, 0.0) for kind in kinds]
        bars = ax.bar(xs, heights, width, color=COLOURS[state], label=state.value)
        ax.bar_label(bars, labels=[f"{h:.1f}" if h else "" for h in heights], padding=2, fontsize=7)
    pad = (max(len(kinds), 6) - len(kinds)) / 2 + 0.5  # a few bars stay bars, centred
    ax.set_xlim(-pad, len(kinds) - 1 + pad)
    ax.set_xticks(range(len(kinds)), kinds)
    if len(kinds) > 5 or max(len(kind) for kind in kinds) > 14:
        for tick in ax.get_xticklabels():
            tick.set(rotation=25, horizontalalignment="right", rotation_mode="anchor")
    ax.set_ylabel("seconds")
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)
    figure.legend(loc="outside lower center", fontsize=8, ncols=2, frameon=False)
    ax.set_title(title, loc="left")
    return figure


def model_time_figure(data: FleetData) -> Figure:
    """The distribution of the model's execution time over the frames it ran for (ms), its
    50th and 99th percentiles marked."""
    figure = _figure(3.4)
    found = data.model_percentiles()
    title = f"model execution time: {data.model_ms.size} frames"
    if not data.model_ms.size:
        return _nothing(figure, "no frame the model ran for", title)
    ax = figure.subplots()
    ax.hist(data.model_ms, bins=60, color="#8e44ad", alpha=0.85, label="frames")
    for name, style in (("p50", "-"), ("p99", "--")):
        ax.axvline(
            found[name],
            color="#222222",
            linestyle=style,
            linewidth=1,
            gid=name,
            label=f"{name} {found[name]:.1f} ms",
        )
    ax.set_xlabel("ms")
    ax.set_ylabel("frames")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    ax.set_title(
        f"{title}, p50 {found['p50']:.1f} ms, p99 {found['p99']:.1f} ms, max {found['max']:.1f} ms",
        loc="left",
    )
    return figure


def differences_figure(comparison: FleetComparison) -> Figure:
    """The distribution of the differences B - A of the fields that moved most (the largest
    mean |d|, at most :data:`SHOWN_FIELDS`; fields that did not move are not shown), one
    histogram each, frames on a log scale."""
    moved = [f for f in comparison.fields_by_change() if f.mean_abs > 0 and f.counts]
    shown = moved[:SHOWN_FIELDS]
    columns = min(len(shown), 3) or 1
    rows = math.ceil(len(shown) / columns) or 1
    figure = _figure(1.0 + 2.4 * rows)
    title = _shown(len(moved), len(shown), f"differences B - A: {len(moved)} fields moved")
    if not shown:
        return _nothing(figure, "no field moved", title)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, field in zip(axes, shown, strict=False):
        lefts, widths = (
            field.edges[:-1],
            [b - a for a, b in zip(field.edges, field.edges[1:], strict=False)],
        )
        ax.bar(lefts, field.counts, widths, align="edge", color="#5d7fa3", label=field.field)
        ax.set_yscale("log")
        ax.set_title(
            f"{field.field}: mean |d| {field.mean_abs:.3g}, max {field.max_abs:.3g}",
            loc="left",
            fontsize=8,
        )
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[len(shown) :]:
        ax.set_axis_off()
    figure.suptitle(title, x=0.01, ha="left", fontsize=10)
    return figure


def flips_figure(comparison: FleetComparison) -> Figure:
    """For the recordings with the largest flip share (at most :data:`SHOWN_RECORDINGS`, in the
    comparison's order), the share of compared frames where each decision flips."""
    flipped = [r for r in comparison.recordings if r.max_flip_share]
    shown = flipped[:SHOWN_RECORDINGS]
    figure = _figure(_bar_height(len(shown) * 2))
    title = _shown(
        len(flipped),
        len(shown),
        f"decision flips: {len(flipped)} of {len(comparison.recordings)} recordings",
    )
    if not shown:
        return _nothing(figure, "no decision flipped", title)
    ax = figure.subplots()
    height = 0.8 / len(DECISIONS)
    for at, decision in enumerate(DECISIONS):
        ys = [i + (at - (len(DECISIONS) - 1) / 2) * height for i in range(len(shown))]
        shares = [r.flip_shares[decision] or 0.0 for r in shown]
        ax.barh(ys, shares, height, color=_DECISION_COLOURS[decision], label=decision)
    ax.set_yticks(range(len(shown)), [r.recording for r in shown], fontsize=7)
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("share of the recording's compared frames")
    ax.grid(axis="x", alpha=0.3)
    figure.legend(loc="outside lower center", fontsize=8, ncols=len(DECISIONS), frameon=False)
    ax.set_title(title, loc="left")
    return figure
