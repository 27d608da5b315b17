"""The report's pictures: what each figure draws, read from the figure before it is saved."""

from __future__ import annotations

import math

import pytest
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from report_runs import GPU_HANG, Step, messages, ok

from aio_runtime import Availability
from pipelines.dms.report import analyse
from pipelines.dms.report.figures import (
    episodes_figure,
    invalid_figure,
    latency_figure,
    timeline_figure,
)

DATA = analyse(messages(GPU_HANG), budget=0.05)


def _bands(figure):
    return [
        patch
        for ax in figure.axes
        for patch in ax.patches
        if isinstance(patch, Rectangle) and (patch.get_gid() or "").startswith("band:")
    ]


def _reasons(figure):
    return [text for ax in figure.axes for text in ax.texts if text.get_gid() == "reason"]


def test_the_timeline_draws_one_band_per_availability_interval_over_its_extent():
    patches = _bands(timeline_figure(DATA))
    assert len(patches) == len(DATA.bands) == 9
    rows = {}
    for patch, band in zip(patches, DATA.bands, strict=True):
        assert patch.get_gid() == f"band:{band.availability.value}"
        assert patch.get_x() == pytest.approx(band.start)
        assert patch.get_x() + patch.get_width() == pytest.approx(band.end)
        rows.setdefault(band.availability, set()).add(patch.get_y())
    assert all(len(ys) == 1 for ys in rows.values())  # each state on a row of its own
    ordered = [rows[s].pop() for s in Availability]
    assert ordered == sorted(ordered, reverse=True)  # AVAILABLE on top, UNAVAILABLE below


def test_the_timeline_labels_each_interval_away_from_available_with_its_cause():
    texts = [text.get_text() for text in _reasons(timeline_figure(DATA))]
    assert sorted(t.split(" (")[0] for t in texts) == sorted(
        ["start-up", "gpu-queue", "invalid output", "no valid output", "camera"]
    )


def _overlap(a, b):
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_crowded_reason_labels_never_overlap_and_those_left_out_are_counted():
    faults = [Step("D", "frame budget: late", age=0.06), Step("D", "recovering: degraded (x)")]
    steps = [ok(), *[*faults, ok()] * 40]
    data = analyse(messages(steps), budget=0.05)
    figure = timeline_figure(data)
    renderer = figure.canvas.get_renderer()
    boxes = [text.get_window_extent(renderer) for text in _reasons(figure)]
    assert boxes and len(boxes) < 40
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if _overlap(a, b)]
    assert f"{40 - len(boxes)} left unlabelled" in figure.axes[0].get_title(loc="left")
    assert len(_bands(figure)) == 81


def _budget_line(figure) -> Line2D:
    (line,) = [line for ax in figure.axes for line in ax.lines if line.get_gid() == "budget"]
    return line


@pytest.mark.parametrize("budget", [0.05, 0.033])
def test_the_latency_picture_draws_the_budget_line_at_the_budget(budget):
    line = _budget_line(latency_figure(analyse(messages(GPU_HANG), budget=budget)))
    assert list(line.get_ydata()) == [pytest.approx(budget * 1e3)] * 2


def test_the_budget_line_is_the_messages_own_budget_where_they_carry_one():
    data = analyse(messages(GPU_HANG, extra={"budget": 0.1}), budget=0.05)
    assert list(_budget_line(latency_figure(data)).get_ydata()) == [pytest.approx(100.0)] * 2


def test_the_latency_lines_break_where_no_frame_came():
    figure = latency_figure(DATA)
    (age,) = [line for line in figure.axes[0].lines if line.get_label() == "frame age"]
    ys = list(age.get_ydata())
    assert sum(math.isnan(y) for y in ys) == 1  # the stall: frames 21 to 25 never came
    kept = [y for y in ys if not math.isnan(y)]
    assert kept == pytest.approx(DATA.series.frame_age_ms)


def test_the_invalid_bars_are_the_summary_s_counts_most_first():
    figure = invalid_figure(DATA)
    (bars,) = figure.axes[0].containers
    kinds = [tick.get_text() for tick in figure.axes[0].get_xticklabels()]
    heights = [patch.get_height() for patch in bars.patches]
    assert dict(zip(kinds, heights, strict=True)) == DATA.summary.invalid_by_kind
    assert heights == sorted(heights, reverse=True)


def test_a_run_without_invalid_frames_draws_no_bar_and_says_so():
    data = analyse(messages([ok(), ok()]), budget=0.05)
    figure = invalid_figure(data)
    assert not figure.axes[0].containers
    assert [t.get_text() for t in figure.axes[0].texts] == ["no invalid frames"]
    assert [t.get_text() for t in episodes_figure(data).axes[0].texts] == ["no fault episodes"]


def test_the_episode_bars_are_each_episode_s_detection_and_recovery():
    figure = episodes_figure(DATA)
    series = {bars.get_label(): [p.get_height() for p in bars.patches] for bars in
              figure.axes[0].containers}  # fmt: skip
    assert series["detection"] == pytest.approx([e.detection * 1e3 for e in DATA.episodes])
    assert series["recovery"] == pytest.approx([e.recovery * 1e3 for e in DATA.episodes])
    # only the invalid output went on to UNAVAILABLE later than it was detected
    late = series["to UNAVAILABLE"]
    assert math.isnan(late[0]) and math.isnan(late[2])
    assert late[1] == pytest.approx(DATA.episodes[1].to_unavailable * 1e3)


def test_an_episode_the_run_ended_in_has_no_recovery_bar_and_says_not_recovered():
    data = analyse(messages([ok(), Step("U", "usb-transfer: no device")]), budget=0.05)
    figure = episodes_figure(data)
    series = {bars.get_label(): [p.get_height() for p in bars.patches] for bars in
              figure.axes[0].containers}  # fmt: skip
    assert math.isnan(series["recovery"][0])
    assert "not\nrecovered" in [t.get_text() for t in figure.axes[0].texts]


def test_many_episodes_keep_their_bars_and_name_every_few():
    hang = [Step("U", "gpu-queue: hung", age=0.15), Step("U", "recovering: unavailable (x)")]
    data = analyse(messages([ok(), *[*hang, ok()] * 40]), budget=0.05)
    figure = episodes_figure(data)
    ax = figure.axes[0]
    assert [len(bars.patches) for bars in ax.containers] == [40, 40]
    assert not ax.texts  # no values on the bars
    ticks = [tick.get_text() for tick in ax.get_xticklabels()]
    assert ticks == [f"#{n}" for n in range(1, 41, 3)]
