from __future__ import annotations

import pytest
from timeout_kinds import TIMEOUT_KINDS

from aio_runtime import (
    BudgetExhausted,
    DeviceLost,
    FirmwareError,
    HardwareTimeout,
    InvalidOutput,
    Layer,
    RuntimeFault,
    SignalTimeout,
    TransferError,
    UsbTransferTimeout,
    map_exceptions,
)


@pytest.mark.parametrize(("kind", "layer"), TIMEOUT_KINDS)
def test_each_timeout_kind_is_a_hardware_timeout_with_its_layer(kind, layer):
    exc = kind(awaited="thing", timeout=1.0, elapsed=1.001)
    assert isinstance(exc, HardwareTimeout)
    assert isinstance(exc, TimeoutError)
    assert isinstance(exc, RuntimeFault)
    assert exc.layer is layer


def test_budget_exhaustion_is_a_timeout_but_not_a_hardware_timeout():
    exc = BudgetExhausted(budget="frame 7", awaited="x", timeout=0.05, elapsed=0.05)
    assert isinstance(exc, TimeoutError)
    assert not isinstance(exc, HardwareTimeout)
    assert "budget 'frame 7' exhausted" in str(exc)


def test_timeout_message_names_layer_awaited_timing_and_values():
    exc = SignalTimeout(
        awaited="timeline signal 'compute' >= 42",
        timeout=2.0,
        elapsed=2.0004,
        expected=42,
        observed=41,
    )
    text = str(exc)
    assert text.startswith("[gpu-queue] timeline signal 'compute' >= 42: timed out after 2.000 s")
    assert "(timeout 2.000 s)" in text
    assert "expected 42 (0x2a), observed 41 (0x29)" in text
    assert (exc.expected, exc.observed, exc.timeout, exc.elapsed) == (42, 41, 2.0, 2.0004)


def test_layer_can_be_overridden_per_error():
    exc = UsbTransferTimeout(awaited="register read", timeout=1, elapsed=1, layer=Layer.FIRMWARE)
    assert exc.layer is Layer.FIRMWARE


def test_firmware_error_carries_the_response_code():
    exc = FirmwareError("SMU answered 0xff", code=0xFF)
    assert exc.code == 0xFF
    assert exc.layer is Layer.FIRMWARE
    assert str(exc) == "[firmware] SMU answered 0xff"


def test_map_exceptions_translates_and_keeps_the_cause():
    with pytest.raises(DeviceLost) as info:
        with map_exceptions({OSError: DeviceLost}, layer=Layer.USB_TRANSFER, awaited="bulk OUT"):
            raise OSError(19, "No such device")
    assert info.value.layer is Layer.USB_TRANSFER
    assert isinstance(info.value.__cause__, OSError)
    assert "bulk OUT" in str(info.value)


def test_map_exceptions_uses_the_first_matching_entry():
    with pytest.raises(TransferError):
        with map_exceptions({ValueError: TransferError, Exception: InvalidOutput}):
            raise ValueError("short")


def test_map_exceptions_lets_unmatched_and_runtime_faults_through():
    with pytest.raises(KeyError):
        with map_exceptions({OSError: DeviceLost}):
            raise KeyError("x")
    original = TransferError("stall")
    with pytest.raises(TransferError) as info:
        with map_exceptions({Exception: DeviceLost}):
            raise original
    assert info.value is original


def test_map_exceptions_never_turns_a_timeout_into_another_fault():
    with pytest.raises(TimeoutError) as info:
        with map_exceptions({OSError: DeviceLost}):
            raise TimeoutError()
    assert not isinstance(info.value, DeviceLost)


def test_map_exceptions_names_an_exception_that_has_no_message():
    with pytest.raises(TransferError, match=r"bulk IN: OSError"):
        with map_exceptions({OSError: TransferError}, awaited="bulk IN"):
            raise OSError()
