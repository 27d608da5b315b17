"""The simulator's fault plan: occurrence and time-window rules, clearing while running."""

from __future__ import annotations

import math

import anyio
import pytest

from aio_runtime.testing import virtual_time
from transports.sim import Fault, FaultPlan, FaultRule

pytestmark = pytest.mark.anyio


async def test_a_rule_fires_on_its_occurrence_and_the_count_after_it():
    plan = FaultPlan([FaultRule(Fault.USB_TIMEOUT, at=3, count=2)])
    fired = [plan.check(Fault.USB_TIMEOUT) is not None for _ in range(6)]
    assert fired == [False, False, True, True, False, False]
    assert [f.occurrence for f in plan.fired] == [3, 4]
    assert plan.occurrences(Fault.USB_TIMEOUT) == 6


async def test_occurrences_are_counted_per_fault():
    plan = FaultPlan([FaultRule(Fault.SMU_ERROR_CODE, at=1, params={"code": 0xFE})])
    assert plan.check(Fault.SMU_NO_RESPONSE) is None
    rule = plan.check(Fault.SMU_ERROR_CODE)
    assert rule is not None and rule.params["code"] == 0xFE
    assert plan.check(Fault.SMU_ERROR_CODE) is None


async def test_a_window_rule_fires_on_every_occurrence_inside_the_window():
    rule = FaultRule(Fault.TLP_RETRY_STORM, window=(1.0, 2.0))
    # from its start, up to its end
    assert [rule.matches(1, t) for t in (0.999, 1.0, 1.999, 2.0)] == [False, True, True, False]
    async with virtual_time():
        plan = FaultPlan([rule])
        results = []
        await anyio.sleep(0.25)  # between the bounds: a sum of sleeps lands on one only roughly
        for _ in range(6):
            results.append(plan.check(Fault.TLP_RETRY_STORM) is not None)
            await anyio.sleep(0.5)
    # checks at 0.25, 0.75, 1.25, 1.75, 2.25, 2.75 s
    assert results == [False, False, True, True, False, False]


async def test_a_fault_cleared_while_running_stops_at_its_next_check_point():
    plan = FaultPlan([FaultRule(Fault.DISCONNECT, at=2, count=math.inf)])
    assert plan.check(Fault.DISCONNECT) is None
    assert all(plan.check(Fault.DISCONNECT) is not None for _ in range(10))
    plan.clear(Fault.DISCONNECT)
    assert plan.check(Fault.DISCONNECT) is None  # the device reappears


async def test_clearing_one_fault_keeps_the_others():
    plan = FaultPlan()
    plan.add(FaultRule(Fault.KERNEL_HANG, at=1, count=math.inf))
    plan.add(FaultRule(Fault.IH_FAULT, at=1, count=math.inf))
    plan.clear(Fault.KERNEL_HANG)
    assert plan.check(Fault.KERNEL_HANG) is None
    assert plan.check(Fault.IH_FAULT) is not None
    plan.clear()
    assert plan.check(Fault.IH_FAULT) is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"at": 1, "window": (0, 1)},
        {"at": 0},
        {"at": 1, "count": 0},
        {"window": (2.0, 1.0)},
        {"window": (-1.0, 1.0)},
    ],
)
def test_a_rule_needs_exactly_one_sensible_trigger(kwargs):
    with pytest.raises(ValueError):
        FaultRule(Fault.USB_TIMEOUT, **kwargs)


def test_rule_params_cannot_be_changed_behind_the_plan():
    rule = FaultRule(Fault.SHORT_TRANSFER, at=1, params={"length": 10})
    with pytest.raises(TypeError):
        rule.params["length"] = 5  # type: ignore[index]


async def test_a_rule_added_mid_run_counts_from_when_it_was_added():
    async with virtual_time():
        plan = FaultPlan()
        for _ in range(5):
            plan.check(Fault.USB_TIMEOUT)
        await anyio.sleep(10.0)
        plan.add(FaultRule(Fault.USB_TIMEOUT, at=2))
        plan.add(FaultRule(Fault.TLP_RETRY_STORM, window=(0.0, 1.0)))
        assert plan.check(Fault.USB_TIMEOUT) is None
        assert plan.check(Fault.USB_TIMEOUT) is not None  # the 2nd since it was added
        assert plan.check(Fault.TLP_RETRY_STORM) is not None  # its window starts now
        await anyio.sleep(1.0)
        assert plan.check(Fault.TLP_RETRY_STORM) is None


async def test_adding_a_rule_leaves_the_rule_as_it_was_so_two_plans_can_share_it():
    rule = FaultRule(Fault.USB_TIMEOUT, at=2)
    before = dict(vars(rule))
    first = FaultPlan()
    first.check(Fault.USB_TIMEOUT)
    first.add(rule)  # counts from the first plan's occurrence 1
    second = FaultPlan()
    second.add(rule)  # and from the second plan's 0
    assert vars(rule) == before
    assert [first.check(Fault.USB_TIMEOUT) is rule for _ in range(3)] == [False, True, False]
    assert [second.check(Fault.USB_TIMEOUT) is rule for _ in range(3)] == [False, True, False]
