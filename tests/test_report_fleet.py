"""``aio-dms report`` of a fleet: a run directory's frames, its comparison of two models, the
pictures drawn of them and the page that shows them."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest
from fleet_runs import frames, write_run

from aio_runtime import Availability
from pipelines.cli import main
from pipelines.dms.fleet.compare import compare_runs, write_comparison
from pipelines.dms.openpilot.policy import DECISIONS
from pipelines.dms.report import fleet_figures
from pipelines.dms.report._fleet_data import NO_KIND, fleet_data
from pipelines.dms.report.fleet import FLEET_CAPTIONS
from pipelines.exit_codes import ExitCode

pytestmark = pytest.mark.timeout(120)

PNG = b"\x89PNG\r\n\x1a\n"
FLEET = ["valid", "away", "model"]
COMPARISON = ["differences", "flips"]


def _fleet_table() -> pa.Table:
    """Three recordings, rows out of order: r1 five frames 50 ms apart (available, degraded
    twice, unavailable, available); r2 frames 0, 2, 3 (a 100 ms gap; unavailable twice); r3 one
    degraded frame without a reason's kind."""
    r1 = frames(
        "r1",
        range(5),
        availability=["available", "degraded", "degraded", "unavailable", "available"],
        reason_kinds=[None, "camera", "calibration", "model", None],
        model_s=[0.01, 0.02, 0.0, 0.0, 0.03],
    )
    r2 = frames(
        "r2",
        [0, 2, 3],
        availability=["unavailable", "unavailable", "available"],
        reason_kinds=["camera", "camera", None],
        model_s=[0.0, 0.0, 0.04],
    )
    r3 = frames("r3", [7], availability=["degraded"], model_s=[0.05])
    table = pa.concat_tables([r2, r1, r3])
    return table.take([4, 0, 6, 1, 3, 8, 2, 5, 7])


def test_the_fleet_s_figures_add_up_each_frame_s_time_to_the_next():
    data = fleet_data(_fleet_table())
    found = [(r.recording, r.frames, r.valid) for r in data.recordings]
    assert found == [("r3", 1, 0), ("r2", 3, 1), ("r1", 5, 2)]  # the lowest valid share first
    assert [r.seconds for r in data.recordings] == pytest.approx([0.0, 0.2, 0.25])
    # r2's first frame lasts to frame 2 (0.1 s); each recording's last, the interval before it
    assert data.away[Availability.UNAVAILABLE] == pytest.approx({"camera": 0.15, "model": 0.05})
    assert list(data.away[Availability.UNAVAILABLE]) == ["camera", "model"]  # most first
    assert data.away[Availability.DEGRADED] == pytest.approx(
        {"calibration": 0.05, "camera": 0.05, NO_KIND: 0.0}
    )
    assert sorted(data.model_ms.tolist()) == pytest.approx([10, 20, 30, 40, 50])
    assert (data.frames, data.valid) == (9, 3)
    assert data.model_percentiles()["p50"] == pytest.approx(30)


@pytest.fixture
def fleet_run(tmp_path: Path) -> Path:
    """A candidate run of 35 recordings of eight frames and its comparison with a baseline: in
    recording i, the face the baseline detects on every frame is no longer detected on the first
    i % 9 frames, and the first i % 3 frames are UNAVAILABLE for the camera."""
    names = [f"drive-{i:02d}" for i in range(35)]
    seen = {"left.faceProb": [0.75] * 8}
    baseline = write_run(tmp_path / "baseline", [frames(n, range(8), seen) for n in names])
    moved = []
    for i, name in enumerate(names):
        lost, away = i % 9, i % 3
        moved.append(
            frames(
                name,
                range(8),
                {"left.faceProb": [0.5] * lost + [0.75] * (8 - lost)},
                availability=["unavailable"] * away + ["available"] * (8 - away),
                reason_kinds=["camera"] * away + [None] * (8 - away),
            )
        )
    run = write_run(tmp_path / "run", moved)
    write_comparison(compare_runs(baseline, run), run / "comparison")
    return run


def _images(html: str) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', html)


def _report(source: Path, out: Path, capsys) -> str:
    assert main(["report", str(source), "-o", str(out)]) == ExitCode.OK
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out / "index.html") and not captured.err
    return (out / "index.html").read_text()


@pytest.mark.parametrize(
    ("what", "names"),
    [("run", FLEET + COMPARISON), ("run without comparison", FLEET), ("comparison", COMPARISON)],
)
def test_the_report_draws_each_picture_of_what_it_is_given_and_a_page(
    fleet_run, tmp_path, capsys, what, names
):
    source = fleet_run / "comparison" if what == "comparison" else fleet_run
    if what == "run without comparison":
        (fleet_run / "comparison").rename(tmp_path / "put away")
    html = _report(source, tmp_path / "out", capsys)
    files = [f"{name}.png" for name in names]
    assert _images(html) == files
    for name in files:
        data = (tmp_path / "out" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 1000
    assert all(FLEET_CAPTIONS[name] in html for name in names)
    assert ("<h2>Fleet</h2>" in html) == ("valid" in names)
    assert ("<h2>Comparison</h2>" in html) == ("flips" in names)


def test_the_page_lists_the_fleet_s_and_the_comparison_s_figures(fleet_run, tmp_path, capsys):
    html = _report(fleet_run, tmp_path / "out", capsys)
    assert '<td>recordings</td><td class="n">35</td>' in html
    assert '<td>frames</td><td class="n">280</td>' in html
    assert "<td>camera</td><td>unavailable</td>" in html
    assert '<td>frames compared</td><td class="n">280</td>' in html
    # drive-08 lost its face on all eight frames: the top of the recordings' table
    first = html.index("<h2>Recordings with the largest flip share</h2>")
    assert html.index("<td>drive-08</td>", first) < html.index("<td>drive-07</td>", first)
    assert '<td>drive-08</td><td class="n">8</td><td class="n">100.00 %</td>' in html


def test_the_pictures_show_what_the_data_holds(fleet_run):
    from pipelines.dms.fleet.compare import read_comparison
    from pipelines.dms.report._fleet_data import read_fleet

    data, comparison = read_fleet(fleet_run), read_comparison(fleet_run / "comparison")
    ax = fleet_figures.valid_share_figure(data).axes[0]
    (bars,) = [c for c in ax.containers if c.get_label() == "valid share"]
    assert len(bars) == fleet_figures.SHOWN_RECORDINGS
    assert [b.get_width() for b in bars] == [r.valid_share for r in data.recordings[:30]]
    assert "30 of 35 shown" in ax.get_title(loc="left")
    ax = fleet_figures.time_away_figure(data).axes[0]
    by_state = {c.get_label(): [b.get_height() for b in c] for c in ax.containers}
    camera = 0.05 * sum(i % 3 for i in range(35))  # recording i: i % 3 frames of 50 ms
    assert by_state == {"degraded": [0.0], "unavailable": [pytest.approx(camera)]}
    ax = fleet_figures.model_time_figure(data).axes[0]
    lines = {line.get_gid(): line.get_xdata()[0] for line in ax.lines}
    assert lines["p50"] == pytest.approx(data.model_percentiles()["p50"])
    assert lines["p99"] == pytest.approx(data.model_percentiles()["p99"])
    ax = fleet_figures.flips_figure(comparison).axes[0]
    flipped = [r for r in comparison.recordings if r.max_flip_share]
    by_label = {c.get_label(): c for c in ax.containers}
    assert set(by_label) == set(DECISIONS)
    shares = [b.get_width() for b in by_label["faceDetected"]]
    assert shares == [r.flip_shares["faceDetected"] for r in flipped[:30]]
    figure = fleet_figures.differences_figure(comparison)
    titles = [a.get_title(loc="left") for a in figure.axes if a.get_title(loc="left")]
    assert titles and titles[0].startswith("left.faceProb:") and len(titles) == 1


@pytest.mark.parametrize(
    ("setup", "argv", "expected"),
    [
        ("empty frames", ["{run}", "-o", "{out}"], "holds no Parquet file"),
        ("good", ["{run}", "-o", "{out}", "--run", "1"], "--run is for JSON lines"),
        ("good", ["{run}", "-o", "{out}", "--budget", "0.05"], "--budget is for JSON lines"),
        ("good", ["{run}", "-o", "{file}"], "exists and is not a directory"),
        ("broken comparison", ["{run}", "-o", "{out}"], "is not a fleet comparison"),
        ("broken comparison", ["{run}/comparison", "-o", "{out}"], "is not a fleet comparison"),
    ],
)
def test_a_fleet_directory_that_cannot_be_reported_is_one_line_and_exit_2(
    fleet_run, tmp_path, capsys, setup, argv, expected
):
    if setup == "empty frames":
        for file in (fleet_run / "frames").rglob("*.parquet"):
            file.unlink()
    if setup == "broken comparison":
        (fleet_run / "comparison" / "comparison.json").write_text("{not json")
    (tmp_path / "file").write_text("a file")
    paths = {"run": fleet_run, "out": tmp_path / "out", "file": tmp_path / "file"}
    code = main(["report", *(arg.format(**paths) for arg in argv)])
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == ExitCode.REFUSED
    assert len(lines) == 1 and lines[0].startswith("aio-dms report: ") and expected in lines[0]
    assert not captured.out and not (tmp_path / "out").exists()
