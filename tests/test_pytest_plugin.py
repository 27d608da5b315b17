"""The pytest plugin, seen from a user's project: with pytest-asyncio's ``asyncio_mode = auto``,
a test marked ``@pytest.mark.anyio`` is run by pytest-asyncio, on asyncio whatever its backend;
the plugin warns about each such test, and stays quiet in strict mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

USER_TESTS = """
import pytest
import sniffio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


@pytest.mark.anyio
async def test_on_its_backend(anyio_backend):
    assert sniffio.current_async_library() == anyio_backend


@pytest.mark.asyncio
async def test_on_asyncio():
    assert sniffio.current_async_library() == "asyncio"
"""


def run_user_tests(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    (tmp_path / "pytest.ini").write_text(
        f"[pytest]\nasyncio_mode = {mode}\nasyncio_default_fixture_loop_scope = function\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's plugin
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "test_user.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )


@pytest.mark.timeout(120)
def test_auto_mode_runs_a_trio_test_on_asyncio_and_the_plugin_warns_about_it(tmp_path):
    result = run_user_tests(tmp_path, "auto")
    assert "FAILED test_user.py::test_on_its_backend[trio]" in result.stdout  # on asyncio
    assert "PASSED test_user.py::test_on_asyncio" in result.stdout
    warned = [line for line in result.stdout.splitlines() if "AnyioTestRunOnAsyncio:" in line]
    assert len(warned) == 1 and "asyncio_mode = strict" in warned[0], result.stdout
    # a warning for each of the anyio test's two runs, none for the asyncio test
    assert "1 failed, 2 passed, 2 warnings" in result.stdout


@pytest.mark.timeout(120)
def test_strict_mode_runs_each_test_on_its_backend_and_the_plugin_is_quiet(tmp_path):
    result = run_user_tests(tmp_path, "strict")
    assert result.returncode == 0, result.stdout
    assert "3 passed" in result.stdout
    assert "AnyioTestRunOnAsyncio" not in result.stdout
