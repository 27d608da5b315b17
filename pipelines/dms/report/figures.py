"""The report's pictures, drawn from a run's :class:`~pipelines.dms.report.RunData`.

Each function returns a :class:`matplotlib.figure.Figure` on an Agg canvas of its own — no
display, nothing of pyplot's global state — for the caller to inspect or save. What is drawn can
be found on the figure: the availability bands are :class:`~matplotlib.patches.Rectangle`
patches with the gid ``band:<state>``, the budget line a line with the gid ``budget``, the bars
of invalid frames one container labelled ``invalid``, each episode series one container labelled
with its name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator

from aio_runtime import Availability

from ._analysis import STATES, Band, Episode, RunData

__all__ = [
    "COLOURS",
    "FIGURES",
    "episodes_figure",
    "invalid_figure",
    "latency_figure",
    "timeline_figure",
]

COLOURS = {
    Availability.AVAILABLE: "#3a9d5d",
    Availability.DEGRADED: "#e8a33d",
    Availability.UNAVAILABLE: "#d64541",
}
_ROW = {state: row for row, state in enumerate(reversed(STATES))}
"""Each state's row on the timeline: UNAVAILABLE at the bottom, AVAILABLE on top."""
_LEVELS = 3
"""Rows of reason labels above the timeline."""
_WIDTH = 11.0
"""Inches: every picture is as wide as the page shows it."""


def _figure(height: float) -> Figure:
    figure = Figure(figsize=(_WIDTH, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _seconds_axis(ax: Axes, data: RunData) -> None:
    end = max(data.summary.duration, 1e-3)
    ax.set_xlim(-0.01 * end, end * 1.01)
    ax.set_xlabel("seconds since the first message")


def timeline_figure(data: RunData) -> Figure:
    """The availability timeline: one band per availability interval on its state's row, the
    cause of each interval away from AVAILABLE written above it (with how long it lasted; the
    start-up's marked so). A label that would overlap others on every row is left out, its
    tick kept, and the title says how many were (the page's tables have them all)."""
    figure = _figure(3.4)
    labels, ax = figure.subplots(2, 1, sharex=True, height_ratios=(0.75, 1.6))
    for band in data.bands:
        row = _ROW[band.availability]
        ax.add_patch(
            Rectangle(
                (band.start, row - 0.35),
                band.end - band.start,
                0.7,
                facecolor=COLOURS[band.availability],
                edgecolor=COLOURS[band.availability],
                linewidth=1.0,  # an interval of one message still shows
                gid=f"band:{band.availability.value}",
            )
        )
    ax.set_ylim(-0.6, len(STATES) - 0.4)
    ax.set_yticks([_ROW[s] for s in STATES], [s.value.upper() for s in STATES])
    ax.grid(axis="x", alpha=0.3)
    _seconds_axis(ax, data)
    time_in = data.summary.time_in
    title = (
        f"availability: {time_in[Availability.AVAILABLE]:.1f} s available, "
        f"{time_in[Availability.DEGRADED]:.1f} s degraded, "
        f"{time_in[Availability.UNAVAILABLE]:.1f} s unavailable"
    )
    labels.set_title(title, loc="left")
    away = [b for b in data.bands if b.availability is not Availability.AVAILABLE]
    startup = data.bands[0] if data.startup is not None else None
    left_out = _reason_labels(figure, labels, ax, away, startup)
    if left_out:
        labels.set_title(f"{title} ({left_out} left unlabelled: no room)", loc="left")
    return figure


def _reason_labels(
    figure: Figure, labels: Axes, ax: Axes, bands: Sequence[Band], startup: Band | None
) -> int:
    """Each band's cause above it, on the lowest label row where it overlaps no other label —
    the UNAVAILABLE bands first, then the longer ones; how many found no room (left out)."""
    labels.set_ylim(0, 1)
    labels.set_axis_off()
    figure.draw_without_rendering()  # the layout settled before labels are measured
    to_data = labels.transData.inverted()
    end = labels.get_xlim()[1]
    taken: list[list[tuple[float, float]]] = [[] for _ in range(_LEVELS)]
    left_out = 0
    ranked = sorted(
        bands,
        key=lambda b: (b.availability is not Availability.UNAVAILABLE, b.start - b.end),
    )
    for band in ranked:
        colour = COLOURS[band.availability]
        ax.plot(
            [band.start, band.start], [_ROW[band.availability] + 0.35, len(STATES) - 0.4],
            color=colour, linewidth=0.8, linestyle=":",
        )  # fmt: skip
        cause = "start-up" if band is startup else band.cause or band.availability.value
        text = f"{cause} ({_duration(band.end - band.start)})"
        label = labels.text(
            band.start, 0, text, fontsize=8, va="bottom", ha="left", color="#222222", gid="reason"
        )
        label.set_in_layout(False)  # measured against the layout as it is: it must not move
        box = label.get_window_extent()  # on the figure's own (Agg) renderer
        width = float(to_data.transform((box.x1 + 6, 0))[0] - to_data.transform((box.x0, 0))[0])
        left, right = band.start, band.start + width
        if right > end:  # no room on the right: the label ends at its band's start instead
            label.set_horizontalalignment("right")
            left, right = band.start - width, band.start
        level = next(
            (
                at
                for at, spans in enumerate(taken)
                if all(right < x0 or left > x1 for x0, x1 in spans)
            ),
            None,
        )
        if level is None:
            label.remove()
            labels.plot([band.start, band.start], [0, 0.08], color=colour, linewidth=1)
            left_out += 1
            continue
        taken[level].append((left, right))
        y = 0.1 + level * (0.88 / _LEVELS)
        label.set_y(y)
        labels.plot([band.start, band.start], [0, y], color=colour, linewidth=1)
    return left_out


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def latency_figure(data: RunData) -> Figure:
    """Frame age, the model's and the GPU's times over the run (ms; status messages: the newest
    frame's age), the budget as a dashed line, intervals away from AVAILABLE shaded."""
    figure = _figure(4.0)
    ax = figure.subplots()
    series = data.series
    for band in data.bands:
        if band.availability is not Availability.AVAILABLE:
            ax.axvspan(band.start, band.end, color=COLOURS[band.availability], alpha=0.12, lw=0)
    gap = 5 * data.frame_interval
    ax.plot(*_broken(series.time, series.frame_age_ms, gap), color="#1f5fa8", lw=1.0,
            label="frame age")  # fmt: skip
    ax.plot(*_broken(series.time, series.model_ms, gap), color="#8e44ad", lw=0.8, alpha=0.8,
            label="model")  # fmt: skip
    ax.plot(*_broken(series.time, series.gpu_ms, gap), color="#7f8c8d", lw=0.8, alpha=0.8,
            label="GPU")  # fmt: skip
    if series.status_time:
        ax.scatter(
            series.status_time, series.status_age_ms, marker="x", color="#d64541", zorder=3,
            label="no frame: the newest frame's age",
        )  # fmt: skip
    budget_ms = data.budget * 1e3
    ax.axhline(
        budget_ms, color="#d64541", linestyle="--", linewidth=1.2, gid="budget",
        label=f"budget {budget_ms:g} ms ({data.summary.late} valid frames late)",
    )  # fmt: skip
    values = [v for v in (*series.frame_age_ms, *series.status_age_ms) if v > 0]
    if values and max(values) > 4 * budget_ms:  # a few long stalls would flatten the rest
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    else:
        ax.set_ylim(0, max([budget_ms, *values]) * 1.15)
    ax.set_ylabel("ms")
    ax.grid(alpha=0.3)
    _seconds_axis(ax, data)
    figure.legend(loc="outside lower center", fontsize=8, ncols=5, frameon=False)
    p = data.summary.percentiles_ms["frame age"]
    ax.set_title(
        f"frame age and latency: p50 {p['p50']:.1f} ms, p99 {p['p99']:.1f} ms, "
        f"max {p['max']:.1f} ms",
        loc="left",
    )
    return figure


def _broken(
    time: Sequence[float], values: Sequence[float], gap: float
) -> tuple[list[float], list[float]]:
    """The series with a break (NaN) wherever frames are more than ``gap`` seconds apart, so no
    line is drawn across a stretch without frames."""
    xs: list[float] = []
    ys: list[float] = []
    for at, (x, y) in enumerate(zip(time, values, strict=True)):
        if at and gap > 0 and x - time[at - 1] > gap:
            xs.append(x)
            ys.append(math.nan)
        xs.append(x)
        ys.append(y)
    return xs, ys


def invalid_figure(data: RunData) -> Figure:
    """Invalid messages by their reason's kind, most first, each bar's count on it."""
    figure = _figure(3.6)
    ax = figure.subplots()
    counts = data.summary.invalid_by_kind.most_common()
    if not counts:
        ax.text(0.5, 0.5, "no invalid frames", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        kinds = [kind for kind, _ in counts]
        bars = ax.bar(kinds, [n for _, n in counts], 0.6, color="#5d7fa3", label="invalid")
        ax.bar_label(bars, padding=2, fontsize=8)
        pad = (max(len(kinds), 6) - len(kinds)) / 2 + 0.5  # a few bars stay bars, centred
        ax.set_xlim(-pad, len(kinds) - 1 + pad)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("messages")
        ax.margins(y=0.15)
        if len(kinds) > 5 or max(len(kind) for kind in kinds) > 14:
            ax.tick_params(axis="x", labelrotation=25)
            for tick in ax.get_xticklabels():
                tick.set_horizontalalignment("right")
    total = sum(data.summary.invalid_by_kind.values())
    ax.set_title(f"invalid messages by kind: {total} of {data.summary.messages}", loc="left")
    return figure


FIGURES = ("timeline", "latency", "invalid", "episodes")
"""The pictures' names, in the page's order (``NAME.png``)."""


def episodes_figure(data: RunData) -> Figure:
    """For each fault episode: detection (its first invalid frame to the first message away from
    AVAILABLE), to UNAVAILABLE where that came later, and recovery (the first trustworthy output
    again to AVAILABLE), in ms; an episode the run ended in is marked not recovered. With many
    episodes the values are left off the bars and only every few episodes' numbers are shown
    (the page's table has them all)."""
    episodes = data.episodes
    many = len(episodes) > _NAMED_EPISODES
    figure = _figure(3.8)
    ax = figure.subplots()
    if not episodes:
        ax.text(0.5, 0.5, "no fault episodes", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        ax.set_title("detection and recovery per fault episode", loc="left")
        return figure
    columns: list[tuple[str, list[float | None], str]] = [
        ("detection", [e.detection for e in episodes], "#d64541"),
    ]
    if any(_later_unavailable(e) for e in episodes):
        late = [e.to_unavailable if _later_unavailable(e) else None for e in episodes]
        columns.append(("to UNAVAILABLE", late, "#8b1e1b"))
    columns.append(("recovery", [e.recovery for e in episodes], "#3a9d5d"))
    width = 0.8 / len(columns)
    for at, (name, values, colour) in enumerate(columns):
        xs = [i + (at - (len(columns) - 1) / 2) * width for i in range(len(episodes))]
        heights = [v * 1e3 if v is not None else math.nan for v in values]
        bars = ax.bar(xs, heights, width, color=colour, label=name)
        if not many:
            ax.bar_label(bars, labels=[_ms(v) for v in heights], padding=2, fontsize=7)
    recovery_at = (len(columns) - 1) / 2 * width  # the recovery column's offset
    for i, episode in enumerate(episodes):
        if episode.recovered is None and not many:
            ax.annotate("not\nrecovered", (i + recovery_at, 0), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=7,
                        color="#3a9d5d")  # fmt: skip
    if many:
        step = math.ceil(len(episodes) / _NAMED_EPISODES)
        shown = range(0, len(episodes), step)
        ax.set_xticks(shown, [f"#{episodes[i].number}" for i in shown])
        ax.set_xlabel("fault episode")
    elif len(episodes) > 8:  # one line each, slanted
        ax.set_xticks(range(len(episodes)), [f"#{e.number} {e.cause}" for e in episodes])
        for tick in ax.get_xticklabels():
            tick.set(rotation=30, horizontalalignment="right", rotation_mode="anchor", fontsize=7)
    else:
        named = [f"#{e.number} {e.cause}\nat {e.detected:.1f} s" for e in episodes]
        ax.set_xticks(range(len(episodes)), named)
    ax.set_ylabel("ms")
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)
    figure.legend(loc="outside lower center", fontsize=8, ncols=len(columns), frameon=False)
    ax.set_title("detection and recovery per fault episode", loc="left")
    return figure


_NAMED_EPISODES = 16
"""Up to this many episodes, each is named under its bars, its values on them."""


def _later_unavailable(episode: Episode) -> bool:
    return episode.unavailable is not None and episode.unavailable > episode.detected


def _ms(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.0f}"
