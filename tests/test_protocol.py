"""The bridge's wire protocol, packed by the host and parsed by the simulator with the same code:
what is packed parses back to what was packed, and what cannot be packed is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transports.protocol.bridge import (
    COMPLETION_SIZE,
    TLP_SIZE,
    CompletionStatus,
    PcieCompletion,
    SramArm,
    Tlp,
    TlpType,
    byte_enables,
    completion_name,
    config_address,
    enabled_lanes,
    pack_arm,
    pack_completion,
    pack_tlp,
    parse_config_address,
    unpack_arm,
    unpack_completion,
    unpack_tlp,
)

u8 = st.integers(0, 0xFF)
u32 = st.integers(0, 0xFFFF_FFFF)
u64 = st.integers(0, (1 << 64) - 1)


@given(fmt_type=u8, address=u64, word=u32, enables=u8)
def test_a_tlp_parses_back_from_its_request_value_and_data_stage(fmt_type, address, word, enables):
    value, data = pack_tlp(fmt_type, address, word, enables)
    assert len(data) == TLP_SIZE
    assert 0 <= value <= 0xFFFF
    assert unpack_tlp(value, data) == Tlp(fmt_type, address, word, enables)


@given(fmt_type=u8)
def test_a_tlp_knows_its_type_only_when_the_protocol_has_it(fmt_type):
    kind = Tlp(fmt_type, 0).kind
    assert (kind is not None) == (fmt_type in set(TlpType))
    assert kind is None or kind == fmt_type


@given(address=u64, write=st.booleans())
def test_memory_requests_address_64_bits_only_where_the_address_needs_it(address, write):
    kind = TlpType.memory(address, write=write)
    assert kind.is_memory and kind.posted == write
    assert (kind in (TlpType.MRD64, TlpType.MWR64)) == (address >> 32 != 0)


@given(bus=u8, write=st.booleans())
def test_configuration_requests_are_type_0_on_bus_0_and_type_1_behind_it(bus, write):
    kind = TlpType.config(bus, write=write)
    assert not kind.is_memory and not kind.posted
    assert kind.config_type == (bus > 0)
    assert kind in ((TlpType.CFG_WRITE0, TlpType.CFG_WRITE1) if write else
                    (TlpType.CFG_READ0, TlpType.CFG_READ1))  # fmt: skip


@given(data=u32, status=st.integers(0, 7), bridge_status=u8)
def test_a_completion_parses_back_from_its_eight_bytes(data, status, bridge_status):
    raw = pack_completion(data, status, bridge_status)
    assert len(raw) == COMPLETION_SIZE
    assert unpack_completion(raw) == PcieCompletion(data, status, bridge_status)


def test_completion_statuses_have_names_and_unknown_ones_say_so():
    assert completion_name(CompletionStatus.UNSUPPORTED_REQUEST) == "unsupported request"
    assert completion_name(CompletionStatus.CONFIG_RETRY) == "configuration retry"
    assert completion_name(CompletionStatus.COMPLETER_ABORT) == "completer abort"
    assert completion_name(3) == "unknown status"


@given(read=st.booleans(), slot=u8, slots=u8, sectors=st.integers(0, 0x7FFF))
def test_an_sram_arm_parses_back_from_its_value_and_index(read, slot, slots, sectors):
    value, index = pack_arm(read, slot, slots, sectors)
    assert 0 <= value <= 0xFFFF and 0 <= index <= 0xFFFF
    assert unpack_arm(value, index) == SramArm(read, slot, slots, sectors)


@given(
    bus=u8,
    device=st.integers(0, 31),
    function=st.integers(0, 7),
    register=st.integers(0, 0xFFF),
)
def test_a_configuration_address_parses_back_to_its_dword(bus, device, function, register):
    address = config_address(bus, device, function, register)
    assert address < 1 << 32
    assert parse_config_address(address) == (bus, device, function, register & 0xFFC)


@pytest.mark.parametrize(
    "where", [(256, 0, 0, 0), (0, 32, 0, 0), (0, 0, 8, 0), (0, 0, 0, 0x1000), (-1, 0, 0, 0)]
)
def test_a_configuration_address_out_of_range_is_refused(where):
    with pytest.raises(ValueError, match="no such configuration address"):
        config_address(*where)


@given(address=u64, size=st.sampled_from([1, 2, 4]))
def test_byte_enables_name_the_lanes_a_single_tlp_moves(address, size):
    if (address & 3) + size > 4:
        with pytest.raises(ValueError, match="within a dword"):
            byte_enables(address, size)
    else:
        assert enabled_lanes(byte_enables(address, size)) == (address & 3, size)


def test_no_byte_enables_mean_the_whole_dword():
    assert enabled_lanes(0) == (0, 4)
