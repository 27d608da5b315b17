"""Every fault the simulator can be scripted with is exercised by some test."""

from __future__ import annotations

import re
from pathlib import Path

from transports.sim import Fault


def test_every_fault_kind_is_injected_by_a_test():
    here = Path(__file__).parent
    sources = "".join(
        p.read_text() for p in here.rglob("test_*.py") if p.name != Path(__file__).name
    )
    injected = set(re.findall(r"Fault\.([A-Z_]+)", sources))
    missing = sorted(f.name for f in Fault if f.name not in injected)
    assert not missing, f"faults no test injects: {missing}"
