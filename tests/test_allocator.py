from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from aio_runtime import Layer, Ledger, OutOfMemory, Range, RangeAllocator


def test_allocations_are_aligned_and_do_not_overlap():
    alloc = RangeAllocator(0x10000, base=0x1000, ledger=Ledger())
    a = alloc.alloc(0x10)
    b = alloc.alloc(0x100, align=0x1000)
    c = alloc.alloc(1)
    assert a == Range(0x1000, 0x10)
    assert b.offset % 0x1000 == 0 and b.offset >= a.end
    assert c.offset == a.end  # first fit uses the gap the alignment left
    assert alloc.statistics().used == 0x10 + 0x100 + 1


def test_exhaustion_raises_out_of_memory_with_the_request_and_largest_free_range():
    alloc = RangeAllocator(0x1000, name="bridge SRAM", layer=Layer.USB_TRANSFER, ledger=Ledger())
    alloc.alloc(0x800)
    with pytest.raises(OutOfMemory) as info:
        alloc.alloc(0x900)
    exc = info.value
    assert isinstance(exc, MemoryError)
    assert (exc.requested, exc.alignment, exc.largest_free) == (0x900, 1, 0x800)
    assert exc.layer is Layer.USB_TRANSFER
    assert "bridge SRAM" in str(exc) and "largest free range 0x800" in str(exc)
    assert alloc.statistics().failures == 1


def test_freeing_merges_with_both_neighbours():
    alloc = RangeAllocator(0x300, ledger=Ledger())
    a, b, c = alloc.alloc(0x100), alloc.alloc(0x100), alloc.alloc(0x100)
    alloc.free(a)
    alloc.free(c)
    assert alloc.free_ranges() == [Range(0, 0x100), Range(0x200, 0x100)]
    alloc.free(b)
    assert alloc.free_ranges() == [Range(0, 0x300)]
    assert alloc.alloc(0x300) == Range(0, 0x300)


def test_double_free_and_foreign_ranges_are_rejected():
    alloc = RangeAllocator(0x100, ledger=Ledger())
    a = alloc.alloc(0x10)
    alloc.free(a)
    with pytest.raises(ValueError, match="not a live allocation"):
        alloc.free(a)
    b = alloc.alloc(0x10)
    with pytest.raises(ValueError):
        alloc.free(Range(b.offset, 0x20))


@pytest.mark.parametrize(
    ("size", "align", "error"),
    [
        (0, 1, ValueError),
        (-4, 1, ValueError),
        (4, 3, ValueError),
        (4, 0, ValueError),
        (1.5, 1, TypeError),
    ],
)
def test_bad_requests_are_rejected(size, align, error):
    with pytest.raises(error):
        RangeAllocator(0x100, ledger=Ledger()).alloc(size, align=align)


def test_statistics_track_peak_and_counts():
    alloc = RangeAllocator(0x1000, ledger=Ledger())
    a = alloc.alloc(0x400)
    b = alloc.alloc(0x400)
    alloc.free(a)
    stats = alloc.statistics()
    assert (stats.used, stats.free, stats.peak_used) == (0x400, 0xC00, 0x800)
    assert (stats.allocations, stats.frees, stats.live_allocations) == (2, 1, 1)
    assert stats.free_ranges == 2 and stats.largest_free == 0x800
    alloc.free(b)


def test_live_allocations_are_in_the_ledger():
    ledger = Ledger()
    alloc = RangeAllocator(0x1000, name="vram", ledger=ledger)
    a = alloc.alloc(0x10)
    assert [str(e) for e in ledger.live()] == ["vram: 0x0+0x10"]
    with pytest.raises(AssertionError, match="1 resource"):
        ledger.assert_empty()
    alloc.free(a)
    ledger.assert_empty()


class AllocatorMachine(RuleBasedStateMachine):
    """Random alloc/free sequences: no overlap, exact accounting, full coalescing."""

    def __init__(self):
        super().__init__()
        self.ledger = Ledger()
        self.alloc = RangeAllocator(1 << 16, base=0x4000, ledger=self.ledger)
        self.live: list[Range] = []

    @rule(size=st.integers(1, 1 << 13), align_log=st.integers(0, 12))
    def allocate(self, size, align_log):
        align = 1 << align_log
        try:
            r = self.alloc.alloc(size, align=align)
        except OutOfMemory as exc:
            # refusing is only allowed when no free range can hold it
            assert all(
                ((f.offset + align - 1) & ~(align - 1)) + size > f.end
                for f in self.alloc.free_ranges()
            ), exc
            return
        assert r.offset % align == 0 and r.size == size
        assert 0x4000 <= r.offset and r.end <= 0x4000 + (1 << 16)
        self.live.append(r)

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 10**6))
    def free(self, index):
        self.alloc.free(self.live.pop(index % len(self.live)))

    @invariant()
    def no_overlap_and_exact_accounting(self):
        spans = sorted(self.live + self.alloc.free_ranges())
        for a, b in itertools.pairwise(spans):
            assert a.end <= b.offset, (a, b)
        assert sum(r.size for r in self.live) == self.alloc.statistics().used
        assert len(self.ledger.live()) == len(self.live)
        free = self.alloc.free_ranges()
        for a, b in itertools.pairwise(free):
            assert a.end < b.offset, "adjacent free ranges were not merged"

    def teardown(self):
        for r in self.live:
            self.alloc.free(r)
        assert self.alloc.free_ranges() == [Range(0x4000, 1 << 16)]
        self.ledger.assert_empty()


TestAllocatorProperties = AllocatorMachine.TestCase
TestAllocatorProperties.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@given(st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8)), max_size=60))
def test_freeing_everything_coalesces_back_to_one_range(requests):
    alloc = RangeAllocator(1 << 20, ledger=Ledger())
    ranges = [alloc.alloc(size, align=1 << a) for size, a in requests]
    for r in ranges[::2] + ranges[1::2]:
        alloc.free(r)
    assert alloc.free_ranges() == [Range(0, 1 << 20)]
