"""A wait takes one of two bounds — its own (``error=``, ``timeout=``) or a shared one
(``within=``) — and says so twice: to a type checker through its overloads, and when it is
called with neither or both, in one ``TypeError`` that names the two forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from aio_runtime import (
    Completion,
    MemoryRegisters,
    ModelTimeout,
    SignalTimeout,
    WaitBound,
    run_in_thread,
    wait_complete,
    wait_register,
    wait_until,
)

ROOT = Path(__file__).resolve().parent.parent
BOTH_FORMS = r"takes either a bound of its own, error=.* or one shared with other steps, within="


@pytest.mark.timeout(180)
def test_a_type_checker_refuses_a_wait_with_neither_bound_or_both(tmp_path):
    api = pytest.importorskip("mypy.api")
    # Each wrong call in the file carries `# type: ignore[call-overload]`; with
    # --warn-unused-ignores, a wrong call the overloads let through is an error, as is any
    # error in a right call.
    stdout, stderr, status = api.run(
        [
            "--strict",
            "--warn-unused-ignores",
            "--no-error-summary",
            "--cache-dir",
            str(tmp_path / "mypy"),
            str(ROOT / "tests" / "typed_calls" / "wait_bounds.py"),
        ]
    )
    assert (status, stdout, stderr) == (0, "", "")


def the_waits(bounding: dict) -> dict:
    registers = MemoryRegisters(4)
    return {
        "wait_until": lambda: wait_until(lambda: 1, bool, **bounding),
        "wait_complete": lambda: wait_complete(Completion(), **bounding),
        "run_in_thread": lambda: run_in_thread(lambda: 1, **bounding),
        "wait_register": lambda: wait_register(registers, 0, value=1, **bounding),
    }


@pytest.mark.anyio
@pytest.mark.parametrize("waiter", ["wait_until", "wait_complete", "run_in_thread"])
async def test_a_wait_with_neither_error_nor_within_names_both_forms(waiter):
    call = the_waits({"awaited": "x", "timeout": 1.0})[waiter]
    with pytest.raises(TypeError, match=rf"^{waiter}\(\) {BOTH_FORMS}.*: got neither"):
        await call()


@pytest.mark.anyio
async def test_wait_register_has_a_default_error_so_a_timeout_alone_bounds_it():
    registers = MemoryRegisters(4)
    registers.words[0] = 1
    assert await wait_register(registers, 0, value=1, awaited="ready", timeout=1.0) == 1


@pytest.mark.anyio
@pytest.mark.parametrize(
    "waiter", ["wait_until", "wait_complete", "run_in_thread", "wait_register"]
)
@pytest.mark.parametrize("extra", [{"timeout": 1.0}, {"error": SignalTimeout}, {"layer": "x"}])
async def test_a_wait_with_both_forms_is_refused_naming_the_keyword_that_mixes_them(waiter, extra):
    bound = WaitBound(awaited="a sequence", error=ModelTimeout, timeout=1.0)
    call = the_waits({"awaited": "x", "within": bound, **extra})[waiter]
    (keyword,) = extra
    with pytest.raises(TypeError, match=rf"^{waiter}\(\) {BOTH_FORMS}.*got within= and {keyword}="):
        await call()


@pytest.mark.anyio
async def test_a_refused_call_starts_no_thread(ledger):
    with pytest.raises(TypeError):
        await run_in_thread(pytest.fail, awaited="never run", timeout=1.0)  # no error=
    # the `ledger` fixture fails the test if a worker thread entry was opened


@pytest.mark.anyio
async def test_the_right_forms_still_run():
    bound = WaitBound(awaited="a sequence", error=SignalTimeout, timeout=1.0)
    done: Completion[str] = Completion()
    done.set_result("ok")
    assert await wait_complete(done, awaited="c", within=bound) == "ok"
    assert await wait_complete(done, awaited="c", error=SignalTimeout, timeout=1.0) == "ok"
    assert await wait_until(lambda: 3, bool, awaited="w", within=bound) == 3
    assert await run_in_thread(lambda: 4, awaited="t", error=ModelTimeout, timeout=5.0) == 4
