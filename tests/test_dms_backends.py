"""The model's backends as the service opens them: an accelerator session's open, from taking
its transport to the booted session, is bounded by ``device_open_timeout``. In virtual time, in
which the model's loading (on a thread) takes none."""

from __future__ import annotations

import anyio
import pytest

from aio_runtime import (
    BudgetExhausted,
    Ledger,
    Readiness,
    UsbTransferTimeout,
    now,
    use_ledger,
    wait_until,
)
from aio_runtime.testing import threads_busy, virtual_time
from pipelines.dms.backends.base import open_device
from pipelines.dms.config.settings import ServiceConfig

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

GRACE = 0.005
"""Real seconds the loop waits before each jump (see test_dms_service_virtual_time.py)."""
OPEN = 0.5


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # hold= is for asyncio's loop


async def test_opening_the_accelerators_transport_counts_against_the_open_timeout():
    """A bridge that never enumerates: its opener waits, bounded by its own minute and by the
    enclosing deadline, as a real one is. The session's open fails at ``device_open_timeout``,
    naming its budget."""
    config = ServiceConfig(device="sim", health_port=None, device_open_timeout=OPEN)

    async def enumerating():
        await wait_until(
            lambda: False,
            bool,
            awaited="the bridge to enumerate",
            error=UsbTransferTimeout,
            timeout=60,
        )

    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=GRACE, hold=threads_busy(ledger)):
            with anyio.fail_after(5):  # virtual seconds
                async with open_device(config, transport=enumerating) as device:
                    start = now()
                    with pytest.raises(BudgetExhausted, match="accelerator open") as raised:
                        async with device.open_session(Readiness()):
                            pass
                    took = now() - start
    assert raised.value.budget == "accelerator open"
    assert took == pytest.approx(OPEN, abs=1e-3)
