from __future__ import annotations

import math

import anyio
import pytest

from aio_runtime import current_deadline, deadline_scope, now, validate_timeout

pytestmark = pytest.mark.anyio


async def test_deadline_scope_is_visible_inside_and_restored_after():
    assert current_deadline() is None
    with deadline_scope(2.0, name="frame 1") as scope:
        assert current_deadline() is scope
        assert scope.name == "frame 1"
        assert scope.budget == pytest.approx(2.0)
        assert 0 < scope.remaining() <= 2.0
    assert current_deadline() is None


async def test_nested_scope_never_extends_the_outer_one():
    with deadline_scope(1.0, name="outer") as outer:
        with deadline_scope(5.0, name="inner") as inner:
            assert inner is outer
            assert current_deadline().name == "outer"
        assert current_deadline() is outer


async def test_tighter_inner_scope_wins_and_outer_returns_after():
    with deadline_scope(5.0, name="outer") as outer:
        with deadline_scope(1.0, name="inner") as inner:
            assert inner.name == "inner"
            assert inner.at < outer.at
        assert current_deadline() is outer


async def test_absolute_deadline_scope():
    at = now() + 3.0
    with deadline_scope(at=at, name="abs") as scope:
        assert scope.at == at


async def test_detached_scope_ignores_enclosing_deadline():
    with deadline_scope(0.5, name="frame"):
        with deadline_scope(5.0, name="cleanup", detached=True) as scope:
            assert scope.name == "cleanup"
            assert scope.budget == pytest.approx(5.0)


async def test_deadline_propagates_into_child_tasks():
    seen = []

    async def child():
        seen.append(current_deadline())

    with deadline_scope(1.0, name="frame 9") as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(child)
    assert seen == [scope]


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, -math.inf])
async def test_bad_timeouts_are_rejected_with_value_error(bad):
    with pytest.raises(ValueError, match="finite, non-negative"):
        validate_timeout(bad)
    with pytest.raises(ValueError):
        with deadline_scope(bad):
            pass


@pytest.mark.parametrize("bad", ["1", True, None])
async def test_non_numeric_timeouts_are_rejected_with_type_error(bad):
    if bad is None:
        assert validate_timeout(None) is None
        return
    with pytest.raises(TypeError):
        validate_timeout(bad)


async def test_deadline_scope_needs_exactly_one_of_timeout_or_at():
    with pytest.raises(TypeError):
        with deadline_scope():
            pass
    with pytest.raises(TypeError):
        with deadline_scope(1.0, at=now() + 1):
            pass
    with pytest.raises(ValueError):
        with deadline_scope(at=math.nan):
            pass


async def test_a_budget_that_began_before_the_block_reports_the_whole_budget():
    from aio_runtime import BudgetExhausted, Completion, SignalTimeout, wait_complete

    sof = now() - 0.03  # the frame started 30 ms ago; its budget is 50 ms
    with pytest.raises(BudgetExhausted) as info:
        with deadline_scope(at=sof + 0.05, started=sof, name="frame 7") as scope:
            assert scope.budget == pytest.approx(0.05)
            await wait_complete(Completion(), awaited="a kernel", error=SignalTimeout, timeout=1)
    assert "budget 0.050 s" in str(info.value)
    assert info.value.elapsed >= 0.05
