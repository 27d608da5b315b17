"""``aio-dms report``: the files it writes, the page that shows them, and what it refuses."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from report_runs import GPU_HANG, lines, ok

from pipelines.cli import main
from pipelines.cli.report import CAPTIONS, write_report
from pipelines.dms.report import analyse, read_messages
from pipelines.exit_codes import ExitCode

ROOT = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def run_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(lines(GPU_HANG)) + "\n")
    return path


def _images(html: str) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', html)


def test_the_report_writes_each_picture_and_a_page_that_shows_them(run_file, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", str(run_file), "-o", str(out)]) == ExitCode.OK
    assert capsys.readouterr().out.strip() == str(out / "index.html")
    names = [f"{name}.png" for name in CAPTIONS]
    for name in names:
        assert (out / name).read_bytes().startswith(PNG)
    html = (out / "index.html").read_text()
    assert _images(html) == names
    assert all(caption in html for caption in CAPTIONS.values())


def test_the_page_s_summary_has_the_run_s_figures(run_file, tmp_path):
    data = analyse(read_messages(run_file).messages, budget=0.05)
    (*_, index) = write_report(data, tmp_path / "r", source="run.jsonl")
    html = index.read_text()
    summary = data.summary
    assert f'<td>messages</td><td class="n">{summary.messages}</td>' in html
    assert f"{summary.valid} ({100 * summary.valid_share:.1f} %)" in html
    for kind, count in summary.invalid_by_kind.items():
        assert f'<td>{kind}</td><td class="n">{count}</td>' in html
    for state, seconds in summary.time_in.items():
        assert f'<td>time {state.value}</td><td class="n">{seconds:.2f} s' in html
    p99 = summary.percentiles_ms["frame age"]["p99"]
    assert "<td>frame age</td>" in html and f"{p99:.1f}" in html
    assert html.count("<tr><td>#") == len(data.episodes)


def test_lines_that_are_no_messages_are_reported_and_left_out(run_file, tmp_path, capsys):
    text = run_file.read_text().splitlines()
    run_file.write_text("\n".join([text[0], "{broken", *text[1:], "plain words"]) + "\n")
    out = tmp_path / "report"
    assert main(["report", str(run_file), "-o", str(out)]) == ExitCode.OK
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "2 of 26 lines were not messages" in err[0] and "line 2" in err[0]
    assert "2 of 26 lines were not messages" in (out / "index.html").read_text()


def test_a_file_of_several_runs_reports_the_last_unless_told(run_file, tmp_path, capsys):
    run_file.write_text(run_file.read_text() + "\n".join(lines([ok(), ok()])) + "\n")
    out = tmp_path / "report"
    assert main(["report", str(run_file), "-o", str(out)]) == ExitCode.OK
    assert "this is run 2" in capsys.readouterr().err
    assert '<td>messages</td><td class="n">2</td>' in (out / "index.html").read_text()
    assert main(["report", str(run_file), "-o", str(out), "--run", "1"]) == ExitCode.OK
    assert (
        f'<td>messages</td><td class="n">{len(GPU_HANG)}</td>' in (out / "index.html").read_text()
    )


def test_the_budget_option_is_the_line_drawn_and_the_budget_counted(run_file, tmp_path):
    out = tmp_path / "report"
    assert main(["report", str(run_file), "-o", str(out), "--budget", "0.02"]) == ExitCode.OK
    assert "valid, late: past the budget (20 ms)" in (out / "index.html").read_text()


@pytest.mark.parametrize(
    ("setup", "argv", "expected"),
    [
        ("none", ["{missing}", "-o", "{out}"], "no such file"),
        ("none", ["{dir}", "-o", "{out}"], "a directory"),
        ("empty", ["{run}", "-o", "{out}"], "is empty"),
        ("words", ["{run}", "-o", "{out}"], "not one of its"),
        ("good", ["{run}", "-o", "{run}"], "exists and is not a directory"),
        ("good", ["{run}", "-o", "{run}/sub"], "cannot be made"),
        ("good", ["{run}", "-o", "{out}", "--budget", "0"], "budget must be in"),
        ("good", ["{run}", "-o", "{out}", "--budget", "nan"], "expected a number"),
        ("good", ["{run}", "-o", "{out}", "--budget", "-1"], "budget must be in"),
        ("good", ["{run}", "-o", "{out}", "--budget", "x"], "expected a number"),
        ("good", ["{run}", "-o", "{out}", "--run", "2"], "holds one run"),
        ("good", ["{run}", "-o", "{out}", "--run", "0"], "holds one run"),
        ("good", ["{run}", "-o", "{out}", "--run", "last"], "expected a run number"),
        ("good", ["{run}"], "required: -o"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, setup, argv, expected):
    run = tmp_path / "run.jsonl"
    content = {"empty": "", "words": "hello\nworld\n", "good": "\n".join(lines(GPU_HANG))}
    if setup in content:
        run.write_text(content[setup])
    paths = {"missing": tmp_path / "missing", "dir": tmp_path, "run": run, "out": tmp_path / "o"}
    try:
        code = main(["report", *(arg.format(**paths) for arg in argv)])
    except SystemExit as exc:  # argparse's own refusals exit
        code = exc.code
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert code == ExitCode.REFUSED
    assert len(err) == 1 and err[0].startswith("aio-dms") and expected in err[0], err
    assert not captured.out and not (tmp_path / "o").exists()


def test_a_report_from_a_real_process_and_no_plotting_library_for_other_commands(tmp_path):
    run = tmp_path / "run.jsonl"
    run.write_text("\n".join(lines(GPU_HANG)) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "report", str(run), "-o", str(tmp_path / "r")],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert (tmp_path / "r" / "index.html").is_file()
    probe = (
        "import sys\nfrom pipelines.cli import parse_args\nimport pipelines.dms.report\n"
        "parse_args(['report', 'x', '-o', 'y'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[]", loaded.stderr
