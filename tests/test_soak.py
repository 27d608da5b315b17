"""The soak's core, for a few hundred frames: every frame accounted for, no hang, nothing leaked,
and faults of every accelerator kind struck and measured. (The soak itself, benchmarks/soak.py,
runs thousands of frames.)"""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.soak import DEVICE_KINDS, failures, report, run_soak

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

FRAMES = 600


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # virtual time's hold= is for asyncio's loop


async def test_a_short_soak_accounts_for_every_frame_and_recovers_from_every_fault(capsys):
    result = await run_soak(FRAMES, seed=3)
    assert result.received > 0.9 * FRAMES  # camera stalls deliver nothing in place of some
    assert result.published == result.valid + result.invalid  # the subscriber saw each one
    assert result.received == result.published + result.dropped
    assert result.unaccounted == 0
    assert result.hangs == 0
    assert result.leaked == 0
    lat = result.latencies
    assert sum(lat.struck[kind] for kind in DEVICE_KINDS) >= 10
    assert sum(lat.during_reopen.values()) >= 1
    recoveries = [v for values in lat.available.values() for v in values]
    assert recoveries and max(recoveries) <= 1.5 + 1e-6
    assert not sum(lat.over_target.values())
    assert len(result.samples) >= 90  # every 1 % of the run
    summary = report(result)
    # (growth is judged over a long run, from 10 % of it on: a short one is still warming up)
    assert not [f for f in failures(summary) if "grew" not in f and "growth" not in f]
    assert summary["frames"] == FRAMES and summary["unaccounted"] == 0
    assert "unaccounted 0" in capsys.readouterr().out


def test_the_soak_fails_on_lost_frames_hangs_leaks_and_growth():
    passing = {
        "unaccounted": 0,
        "hangs": 0,
        "leaked": 0,
        "rss_growth_mb": 4.9,
        "fds_growth": 0,
        "threads_growth": -1,
    }
    assert failures(passing) == []
    for key, bad in [
        ("unaccounted", 1),
        ("hangs", 2),
        ("leaked", 1),
        ("rss_growth_mb", 5.1),
        ("fds_growth", 1),
        ("threads_growth", 1),
    ]:
        found = failures({**passing, key: bad})
        assert len(found) == 1 and key.split("_")[0] in found[0].lower(), found


def test_unaccounted_is_received_less_published_less_dropped():
    from benchmarks.soak import Latencies, SoakResult

    result = SoakResult(
        frames=10, received=10, valid=5, invalid=3, dropped=1, published=8, hangs=0, leaked=0,
        samples=[(1, 100.0, 4, 10), (10, 103.0, 5, 10)], latencies=Latencies(),
        virtual_s=0.5, real_s=0.1,
    )  # fmt: skip
    assert result.unaccounted == 1
    assert result.growth(1) == pytest.approx(3.0) and result.growth(2) == 1
    assert dataclasses.replace(result, published=9).unaccounted == 0
