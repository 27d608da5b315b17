"""Model metadata within limits: bombs, deep nesting, huge integers and malformed input are each a
MetadataError saying what was expected, refused while the metadata is read; fuzzed input is
either read or refused, never anything else."""

from __future__ import annotations

import base64
import io
import json
import pickle
import pickletools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.dms.model.limits import (
    DEFAULT_LIMITS,
    MetadataError,
    MetadataLimitExceeded,
    MetadataLimits,
    ModelContractError,
    UnsafeMetadata,
    check_extent,
)
from pipelines.dms.model.metadata import (
    MAX_METADATA_BYTES,
    encode_output_slices,
    parse_output_slices,
)
from pipelines.dms.model.reference import REFERENCE_SLICES
from pipelines.dms.model.safe_pickle import safe_unpickle

pytestmark = pytest.mark.timeout(120)

TABLE = dict(REFERENCE_SLICES)
PROTOCOLS = range(pickle.HIGHEST_PROTOCOL + 1)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def walk_size(value: object, sizes: dict[int, int] | None = None) -> int:
    """How many values a walk following every reference meets (for an acyclic value)."""
    sizes = {} if sizes is None else sizes
    if id(value) not in sizes:
        children = (
            [*value.keys(), *value.values()]
            if isinstance(value, dict)
            else list(value)
            if isinstance(value, list | tuple)
            else []
        )
        sizes[id(value)] = 1 + sum(walk_size(child, sizes) for child in children)
    return sizes[id(value)]


class OpcodeCount:
    """Counts the opcodes the reader is handed (what it did before refusing)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = pickletools.genops

        def counted(data):  # type: ignore[no-untyped-def]
            for item in real(data):
                self.count += 1
                yield item

        monkeypatch.setattr(pickletools, "genops", counted)


# -- the limits are documented and the table fits them widely ----------------------------------


def test_the_default_limits_are_those_documented():
    assert DEFAULT_LIMITS == MetadataLimits(
        max_bytes=65536,
        max_depth=32,
        max_objects=10_000,
        max_shared_references=64,
        max_int_bits=31,
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_real_table_needs_no_shared_reference_and_three_levels(protocol):
    tight = MetadataLimits(max_shared_references=0, max_depth=2, max_objects=6 * len(TABLE) + 3)
    assert safe_unpickle(pickle.dumps(TABLE, protocol=protocol), tight) == TABLE
    assert parse_output_slices(encode_output_slices(TABLE, as_json=True), tight) == TABLE


@pytest.mark.parametrize(
    "kwargs", [{"max_depth": -1}, {"max_objects": 1.5}, {"max_bytes": True}, {"max_int_bits": 0}]
)
def test_limits_are_checked_when_made(kwargs):
    with pytest.raises(ValueError, match="must be an int"):
        MetadataLimits(**kwargs)


# -- the self-sharing bomb ----------------------------------------------------------------------


def sharing_bomb(levels: int) -> bytes:
    """{"x": L[levels]} where L[0] = [] and L[i + 1] = [L[i], L[i]]: 8 bytes a level, and twice
    the values to walk each level."""
    parts = [b"\x80\x04", b"}\x94", b"\x8c\x01x\x94", b"]\x94"]  # dict, key, L0: memo 0, 1, 2
    for level in range(levels):
        memo = bytes([2 + level])
        parts.append(b"0(h" + memo + b"h" + memo + b"l\x94")  # POP, MARK, GET, GET, LIST, MEMOIZE
    parts.append(b"s.")
    return b"".join(parts)


BOMB = sharing_bomb(23)
BOMB_OPCODES = len(list(pickletools.genops(BOMB)))


def test_the_bomb_is_196_bytes_standing_for_sixteen_million_values():
    assert len(BOMB) == 196
    pickletools.dis(BOMB, out=io.StringIO())  # well formed
    assert walk_size(pickle.loads(BOMB)) > 16_000_000


def test_the_bomb_is_refused_a_few_dozen_opcodes_in(monkeypatch):
    opcodes = OpcodeCount(monkeypatch)
    with pytest.raises(MetadataLimitExceeded) as info:
        parse_output_slices(b64(BOMB))
    assert info.value.limit == "max_objects"
    assert info.value.allowed == 10_000
    # refused within the first 12 of its 23 levels (2**13 values > 10000), having read 8 bytes
    # and 6 opcodes a level after a 14-byte start
    assert info.value.offset is not None and info.value.offset < 14 + 8 * 12
    assert opcodes.count < 7 + 6 * 12 < BOMB_OPCODES
    assert "metadata pickle exceeds a limit at byte" in str(info.value)
    assert "at most 10000 values" in str(info.value)


def test_a_list_appended_to_itself_again_and_again_is_refused():
    raw = b"\x80\x04]\x94" + b"h\x00a" * 40 + b"."  # L.append(L), forty times
    with pytest.raises(MetadataLimitExceeded) as info:
        safe_unpickle(raw)
    assert info.value.limit == "max_objects"
    assert info.value.offset is not None and info.value.offset < len(raw) // 2


def test_a_sharing_bomb_made_with_dup_is_refused():
    raw = b"\x80\x04]" + b"2\x86" * 40 + b"."  # T = (T, T), forty times, by DUP and TUPLE2
    with pytest.raises(MetadataLimitExceeded) as info:
        safe_unpickle(raw)
    assert info.value.limit == "max_objects"
    assert info.value.offset is not None and info.value.offset < len(raw) // 2


def test_shared_references_are_counted():
    name = "".join(["sha", "red"])
    raw = pickle.dumps([name] * 66, protocol=4)  # one string, then 65 memo reads of it
    with pytest.raises(MetadataLimitExceeded) as info:
        safe_unpickle(raw)
    assert info.value.limit == "max_shared_references"
    assert "at most 64 shared references" in str(info.value)
    assert safe_unpickle(pickle.dumps([name] * 65, protocol=4)) == [name] * 65


def test_a_shared_list_grown_after_it_was_shared_is_measured_once_more():
    # A = [], B = [A, A], then A grows by 5000: charged while read as about 5000 values, but a
    # walk of B meets 10003
    raw = (
        b"\x80\x04]\x94(h\x00h\x00l\x94"  # A (memo 0), B = [A, A] (memo 1)
        + b"0("  # POP B; A is on top
        + b"".join(b"M" + n.to_bytes(2, "little") for n in range(5000))
        + b"e0h\x01."  # APPENDS to A; POP A; B
    )
    with pytest.raises(MetadataLimitExceeded) as info:
        safe_unpickle(raw)
    assert info.value.limit == "max_objects"
    assert info.value.offset is None  # found by the measure of the finished value
    loose = MetadataLimits(max_objects=20_000)
    assert walk_size(safe_unpickle(raw, loose)) == 10_003


def test_the_measure_of_a_value_visits_each_container_once():
    level: list[object] = []
    for _ in range(200):
        level = [level, level]
    with pytest.raises(MetadataLimitExceeded, match="at most 10000 values"):
        check_extent(level, DEFAULT_LIMITS, where="value")
    cycle: list[object] = [1]
    cycle.append(cycle)
    check_extent({"k": cycle}, MetadataLimits(max_objects=5, max_depth=2), where="value")
    with pytest.raises(MetadataLimitExceeded):
        check_extent({"k": cycle}, MetadataLimits(max_objects=4), where="value")


# -- deep nesting --------------------------------------------------------------------------------

DEEP = 200_000


def deep_pickle(depth: int) -> bytes:
    return b"\x80\x04}\x8c\x01x" + b"]" * depth + b"a" * (depth - 1) + b"s."


def deep_json(depth: int) -> str:
    return '{"x": ' + "[" * depth + "]" * depth + "}"


def test_metadata_nested_200000_deep_is_refused_for_its_length_or_its_depth():
    roomy = MetadataLimits(max_bytes=10**6, max_objects=10**6)
    with pytest.raises(MetadataLimitExceeded) as info:
        parse_output_slices(deep_json(DEEP))
    assert info.value.limit == "max_bytes"
    with pytest.raises(MetadataLimitExceeded) as info:
        parse_output_slices(deep_json(DEEP), roomy)
    assert info.value.limit == "max_depth"
    with pytest.raises(MetadataLimitExceeded) as info:
        safe_unpickle(deep_pickle(DEEP), roomy)
    assert info.value.limit == "max_depth"
    assert "at most 32 levels of nesting" in str(info.value)


@pytest.mark.parametrize("depth", [32, 33])
def test_nesting_is_refused_past_the_limit_exactly(depth):
    raw = b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."
    text = '{"x": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"
    if depth <= DEFAULT_LIMITS.max_depth:
        assert check_depth(safe_unpickle(raw)) == depth
        with pytest.raises(MetadataError, match="expected slice") as info:
            parse_output_slices(text)  # read, then refused as a table
        assert not isinstance(info.value, MetadataLimitExceeded)
    else:
        for read, data in ((safe_unpickle, raw), (parse_output_slices, text)):
            with pytest.raises(MetadataLimitExceeded, match="levels of nesting"):
                read(data)


def check_depth(value: object) -> int:
    depth = 0
    while isinstance(value, list):
        depth += 1
        value = value[0] if value else None
    return depth


@pytest.mark.timeout(10)  # the scan is linear: ~2 ms here; a scan retrying from each quote, ~13 s
def test_json_nesting_is_counted_outside_strings_only():
    text = json.dumps({"x": [0, 12], "note": "[" * 1000})
    with pytest.raises(MetadataError, match=r"output slice 'note' is '\[\[\[\["):
        parse_output_slices(text)
    unclosed = '{"' + '\\"' * (MAX_METADATA_BYTES // 2 - 2)  # a string that never ends
    with pytest.raises(MetadataError, match="not valid JSON"):
        parse_output_slices(unclosed)


# -- huge integers -------------------------------------------------------------------------------


HUGE = [  # (value, its decimal text): str() refuses past 4300 digits
    (10**5000, "1" + "0" * 5000),
    (-(10**5000), "-1" + "0" * 5000),
    (2**31, "2147483648"),
    (-(2**31), "-2147483648"),
    (2**64, "18446744073709551616"),
]


@pytest.mark.parametrize(("value", "decimal"), HUGE, ids=[d[:12] for _, d in HUGE])
def test_a_huge_integer_is_refused_as_read_in_pickle_and_json(value, decimal):
    texts = [
        b64(pickle.dumps({"x": slice(0, value)}, protocol=2)),
        b64(pickle.dumps({"x": slice(0, value)}, protocol=4)),
        '{"x": [0, ' + decimal + "]}",
    ]
    if len(decimal) < 100:
        texts.append(b64(pickle.dumps({"x": slice(0, value)}, protocol=0)))
    for text in texts:
        with pytest.raises(MetadataLimitExceeded) as info:
            parse_output_slices(text)
        assert info.value.limit == "max_int_bits"
        assert "at most 31 bits in an integer" in str(info.value)
        assert len(str(info.value)) < 300


def test_a_huge_integer_in_pickle_text_is_a_metadata_error_too():
    raw = b"(dV x\nL0L\nL" + b"9" * 5000 + b"L\n\x86s."
    with pytest.raises(MetadataError, match=r"not a readable pickle.*digits"):
        parse_output_slices(b64(raw))


def test_integers_up_to_31_bits_are_read():
    top = 2**31 - 1
    assert parse_output_slices(json.dumps({"x": [top - 1, top]})) == {"x": slice(top - 1, top)}
    assert safe_unpickle(pickle.dumps([-top, top], protocol=2)) == [-top, top]


# -- malformed input: one clear error each -------------------------------------------------------

PLAIN_TABLE = b64(pickle.dumps(TABLE, protocol=4))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not a readable pickle"),
        ("   ", "not a readable pickle"),
        ("QUJD", "not a readable pickle"),  # "ABC"
        ("not base64!", "neither JSON nor base64"),
        ("QUJ", "neither JSON nor base64"),  # bad padding
        ('{"x": [0, 1]', "not valid JSON"),
        ('{"x": [0, 1]}}', "not valid JSON"),
        (b'{"x": "\xff"}', "not UTF-8"),
        ('{"x": [0, 1], "y": [5, 2]}', "expected integers 0 <= start < stop"),
        ('{"x": [-1, 2]}', "expected integers 0 <= start < stop"),
        ('{"x": [1, 2.5]}', "expected integers"),
        ('{"x": [true, 2]}', "expected integers"),
        ('{"x": {"start": 0}}', "expected slice(start, stop) or [start, stop]"),
        ('{"x": null}', "expected slice(start, stop) or [start, stop]"),
        (b64(pickle.dumps({"x": 3})), "expected slice(start, stop) or [start, stop]"),
        (b64(pickle.dumps({"x": slice(4, 2)})), "0 <= start < stop"),
        (b64(pickle.dumps({"x": slice(0, None)})), "expected integers"),
        (b64(pickle.dumps({"x": slice(0, "9")})), "expected integers"),
        (b64(pickle.dumps({"x": slice(0, 3, -1)})), "no step"),
        (b64(pickle.dumps({("a",): slice(0, 1)})), "name ('a',) is not a string"),
        (b64(pickle.dumps(["x"])), "output_slices is a list"),
        (b64(pickle.dumps({"x": slice([0], 3)})), "makes a slice of ([0], 3, None)"),
        (b64(b"\x80\x04K\x01K\x02."), "output_slices is a int"),
        (b64(b"\x80\x09N."), "unknown protocol 9"),
        (b64(b"."), "runs out of stack"),
        (b64(b"\x80\x04a."), "runs out of stack"),
        (b64(b"\x80\x04Ne."), "no MARK"),
        (b64(b"\x80\x04h\x05."), "reads memo entry 5, never stored"),
        (b64(b"\x80\x04}]]s."), "unhashable"),
        (b64(b"\x80\x04}(K\x01u."), "a key without a value"),
        (b64(b"\x80\x04K\x01K\x02a."), "appends to a int"),
        (b64(b"\x80\x04]K\x01K\x02s."), "sets an item of a list"),
        (b64(b"\x80\x04K\x01K\x02\x93."), "names a global by a non-string"),
        (b64(b"\x80\x04K\x01)R."), "calls a int"),
        (b64(b"\x80\x04}}b."), "uses BUILD"),
        (b64(b"\x80\x04cbuiltins\nslice\n."), "holds builtins.slice itself"),
        (b64(b"\x80\x04]cbuiltins\nslice\na."), "holds builtins.slice itself"),
        (b64(b"\x80\x04\x8c\x01x\x94U\x01\xe9."), "non-ASCII STRING"),
        (b64(b"\x80\x04\x82\x7f."), "extension code 127, not registered"),
        (PLAIN_TABLE[: len(PLAIN_TABLE) // 8 * 4], "not a readable pickle"),
    ],
)
def test_malformed_metadata_is_one_metadata_error_saying_what_was_expected(text, message):
    with pytest.raises(MetadataError) as info:
        parse_output_slices(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


def test_every_truncation_of_a_table_is_refused():
    for protocol in PROTOCOLS:
        raw = pickle.dumps(TABLE, protocol=protocol)
        for end in range(len(raw)):
            with pytest.raises(MetadataError):
                safe_unpickle(raw[:end])


def test_a_slice_is_built_by_any_opcode_that_names_it():
    for raw in (
        b"(I0\nI4\nibuiltins\nslice\n.",  # INST
        b"(cbuiltins\nslice\nI0\nI4\no.",  # OBJ
        b"\x80\x02cbuiltins\nslice\nK\x00K\x04\x86\x81.",  # NEWOBJ
        b"\x80\x04cbuiltins\nslice\nK\x00K\x04\x86}\x92.",  # NEWOBJ_EX, no keywords
    ):
        assert safe_unpickle(raw) == slice(0, 4)
    with pytest.raises(MetadataError, match="makes a slice of"):
        safe_unpickle(b"\x80\x04cbuiltins\nslice\nK\x00K\x04\x86}\x8c\x01aK\x01s\x92.")


def test_unsafe_content_is_refused_by_what_it_is():
    for raw, what in (
        (b"\x80\x04\x8f\x94(K\x01\x90.", "contains a set"),
        (b"\x80\x04(K\x01\x91.", "contains a frozenset"),
        (b"\x80\x04C\x01x.", "contains bytes"),
        (b"\x80\x05\x97.", "out-of-band buffer"),
        (b"Pid\n.", "persistent id"),
    ):
        with pytest.raises(UnsafeMetadata, match=what):
            safe_unpickle(raw)


# -- round trips and fuzzing --------------------------------------------------------------------

SMALL_INTS = st.integers(min_value=-(2**31) + 1, max_value=2**31 - 1)
ATOMS = st.none() | st.booleans() | SMALL_INTS | st.floats(allow_nan=False) | st.text(max_size=8)
PLAIN = st.recursive(
    ATOMS | st.builds(slice, SMALL_INTS, SMALL_INTS | st.none()),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=4) | SMALL_INTS, inner, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(value=PLAIN, protocol=st.sampled_from(PROTOCOLS))
def test_plain_data_reads_back_as_pickle_wrote_it(value, protocol):
    assert safe_unpickle(pickle.dumps(value, protocol=protocol)) == value


def reads_or_refuses(read, text) -> None:  # type: ignore[no-untyped-def]
    try:
        read(text)
    except ModelContractError as exc:
        assert str(exc) and "\n" not in str(exc)


SEEDS = [pickle.dumps(TABLE, protocol=p) for p in PROTOCOLS] + [
    BOMB,
    deep_pickle(40),
    pickle.dumps({"x": slice(0, 2**40)}, protocol=2),
    pickle.dumps({"x": [slice(1, 2), ("a", 1.5, None, True)], "y": {"z": [0, 3]}}, protocol=0),
]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        at = draw(st.integers(min_value=0, max_value=max(len(data) - 1, 0)))
        match draw(st.sampled_from(["replace", "insert", "delete", "truncate"])):
            case "replace" if data:
                data[at] = draw(st.integers(0, 255))
            case "insert":
                data[at:at] = draw(st.binary(min_size=1, max_size=4))
            case "delete" if data:
                del data[at]
            case "truncate":
                del data[at:]
    return bytes(data)


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(raw=st.binary(max_size=300))
def test_random_bytes_are_read_or_refused(raw):
    reads_or_refuses(safe_unpickle, raw)
    reads_or_refuses(parse_output_slices, b64(raw))
    reads_or_refuses(parse_output_slices, raw)


@FUZZ
@given(raw=mutated())
def test_mutated_pickles_are_read_or_refused(raw):
    reads_or_refuses(safe_unpickle, raw)
    reads_or_refuses(parse_output_slices, b64(raw))


@FUZZ
@given(
    text=st.text(alphabet=st.sampled_from('{}[]",:0123456789.-eE truefalsn\\x'), max_size=80)
    | st.text(max_size=40)
)
def test_random_json_is_read_or_refused(text):
    reads_or_refuses(parse_output_slices, "{" + text)
    reads_or_refuses(parse_output_slices, text)
