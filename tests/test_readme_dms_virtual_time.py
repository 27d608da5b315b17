"""The documentation's test of the DMS service under virtual time, as docs/testing.md shows it, run.

Everything from the first import to the end of the first test is that page's code block, word for
word (``test_the_docs_show_this_test_as_it_is`` checks it).
"""

import pytest

from aio_runtime import Availability
from aio_runtime.testing import TransitionRecorder, threads_busy, virtual_time
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.service import DmsService


@pytest.mark.asyncio
async def test_a_gpu_hang_makes_the_service_unavailable_until_it_clears():
    config = ServiceConfig(
        device="sim", health_port=None, calib=(0.0, 0.0, 0.0), frames=60, faults="gpu-hang@20+6"
    )
    service = DmsService(config)
    with TransitionRecorder(service.availability) as recorder:
        # the clock stands still while the service's threads work (warp, model, start-up)
        async with virtual_time(autojump_threshold=0.005, hold=threads_busy()) as clock:
            start = clock.now()
            async with service:
                await service.finished()
            assert clock.now() - start == pytest.approx(60 * 0.05, abs=0.05)  # 60 frames at 20 Hz
    states = recorder.states()
    assert any(
        s.availability is Availability.UNAVAILABLE and s.reason.kind == "gpu-queue" for s in states
    )
    assert states[-1].availability is Availability.AVAILABLE
    assert service.summary.frames.received == 60


def test_the_docs_show_this_test_as_it_is():
    from pathlib import Path

    here = Path(__file__).read_text()
    shown = here[here.index("import pytest") : here.index("\n\ndef test_the_docs_show")]
    page = (Path(__file__).parent.parent / "docs" / "testing.md").read_text()
    # a plain fence: the docs' ```python blocks are programs that tests run (tests/test_cli.py)
    assert f"```\n{shown.strip()}\n```" in page


@pytest.mark.asyncio
async def test_a_plain_virtual_time_around_the_service_fails_naming_the_recipe():
    from pipelines.dms.service import StartupError

    config = ServiceConfig(device="sim", health_port=None, frames=5)
    with pytest.raises(StartupError) as info:
        async with virtual_time():
            async with DmsService(config):
                pass
    # the model's 10 s load bound ran out at once while its thread was loading it
    assert isinstance(info.value.__cause__, TimeoutError)
    notes = [n for n in getattr(info.value, "__notes__", []) if "hold=threads_busy()" in n]
    assert len(notes) == 1
