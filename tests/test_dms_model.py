"""The DMS model: its contract read from ONNX metadata (safely), the reference model, and the
onnxruntime runner under a bound.

Runner tests run in real time (threads are involved) with short durations and outer bounds.
"""

from __future__ import annotations

import base64
import copyreg
import hashlib
import io
import json
import math
import os
import pickle
import pickletools
import re
import threading
import time
from pathlib import Path

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aio_runtime import (
    BudgetExhausted,
    InvalidOutput,
    Ledger,
    ModelTimeout,
    UnboundedWaitError,
    deadline_scope,
    use_ledger,
    wait_until,
)
from pipelines.dms.backends.cpu import ModelInputError, ModelRunFailed, OnnxRunner, RunSuperseded
from pipelines.dms.model.contract import (
    EXPECTED_INPUTS,
    ContractMismatch,
    check_real_output,
    load_contract,
    read_contract,
)
from pipelines.dms.model.decode import REQUIRED_HEADS, decode
from pipelines.dms.model.limits import MetadataError, ModelContractError, UnsafeMetadata
from pipelines.dms.model.metadata import encode_output_slices, parse_output_slices
from pipelines.dms.model.reference import (
    CACHE_ENV,
    REFERENCE_CHECKPOINT,
    REFERENCE_SLICES,
    build_reference_model,
    build_shifted_model,
    build_stalling_model,
    default_cache_dir,
    reference_model_macs,
    reference_model_path,
    write_model,
)
from pipelines.dms.model.safe_pickle import safe_unpickle

pytestmark = pytest.mark.anyio

OPENPILOT_SLICES = {"face_descs_lhd": slice(0, 12), "wheel_on_right": slice(40, 41)}


def b64pickle(value: object, protocol: int = pickle.DEFAULT_PROTOCOL) -> str:
    return base64.b64encode(pickle.dumps(value, protocol=protocol)).decode()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


# -- output_slices: openpilot's base64 pickle, and JSON ------------------------------------------


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_openpilots_base64_pickle_of_slices_is_read_in_every_protocol(protocol):
    assert parse_output_slices(b64pickle(OPENPILOT_SLICES, protocol)) == OPENPILOT_SLICES


def test_json_slices_are_read_as_start_stop_pairs():
    text = json.dumps({"face_descs_lhd": [0, 12], "wheel_on_right": [40, 41]})
    assert parse_output_slices(text) == OPENPILOT_SLICES
    assert parse_output_slices(text.encode()) == OPENPILOT_SLICES


def test_slices_encode_and_parse_back_in_both_formats():
    for as_json in (False, True):
        text = encode_output_slices(REFERENCE_SLICES, as_json=as_json)
        assert parse_output_slices(text) == dict(REFERENCE_SLICES)
    assert parse_output_slices(b64pickle({"x": slice(None, 3)})) == {"x": slice(0, 3)}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not base64 at all!", "neither JSON nor base64"),
        ('{"face": [0, 12]', "not valid JSON"),
        ("{}", "expected a non-empty dict"),
        (b64pickle([slice(0, 1)]), "output_slices is a list"),
        (b64pickle({1: slice(0, 1)}), "name 1 is not a string"),
        (b64pickle({"x": slice(0, 10, 2)}), "no step"),
        (b64pickle({"x": slice(-3, 10)}), "0 <= start < stop"),
        (b64pickle({"x": slice(5, 5)}), "0 <= start < stop"),
        (b64pickle({"x": slice(0.5, 3)}), "expected integers"),
        (b64pickle({"x": slice(True, 3)}), "expected integers"),
        (b64pickle({"x": "0:12"}), "expected slice(start, stop) or [start, stop]"),
        ('{"x": [0, 1, 2]}', "expected slice(start, stop) or [start, stop]"),
        (b64(b"\x80\x04\x95"), "not a readable pickle"),
        (b64(pickle.dumps(OPENPILOT_SLICES)[:-5]), "not a readable pickle"),
    ],
)
def test_malformed_slices_are_refused_with_what_was_expected(text, message):
    with pytest.raises(MetadataError, match=re.escape(message)):
        parse_output_slices(text)


def test_oversized_metadata_is_refused_before_it_is_read():
    with pytest.raises(MetadataError, match="at most"):
        parse_output_slices("A" * (2 << 20))
    with pytest.raises(MetadataError, match="at most"):
        safe_unpickle(b"\x80\x04" + b"N" * (2 << 20))


# -- malicious pickles: refused, and nothing runs ------------------------------------------------

EXECUTED: list[object] = []


def record(*args: object) -> None:
    """Stands for any callable an attacker names: if the unpickler calls it, the test sees it."""
    EXECUTED.append(args)


class CallsOsSystem:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class CallsRecord:
    def __reduce__(self):
        return (record, ("pwned",))


@pytest.fixture(autouse=True)
def nothing_executed():
    EXECUTED.clear()
    yield
    assert EXECUTED == [], "a malicious pickle ran code"


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_reduce_that_calls_os_system_is_refused_without_running(tmp_path, protocol):
    marker = tmp_path / "pwned"
    payload = b64pickle({"x": CallsOsSystem(marker)}, protocol)
    with pytest.raises(UnsafeMetadata, match=r"refers to posix\.system; only plain data"):
        parse_output_slices(payload)
    assert not marker.exists()


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_reduce_naming_any_other_callable_is_refused_without_calling_it(protocol):
    with pytest.raises(UnsafeMetadata, match=r"test_dms_model\.record"):
        safe_unpickle(pickle.dumps(CallsRecord(), protocol=protocol))


@pytest.mark.parametrize(
    "raw",
    [
        b'cbuiltins\neval\n(S\'__import__("os").system("false")\'\ntR.',  # GLOBAL + REDUCE
        b"cos\nsystem\n(S'false'\ntR.",  # GLOBAL of another module
        b"(S'false'\nios\nsystem\n.",  # INST: find + call in one opcode
        b"\x80\x04\x8c\x08builtins\x8c\x07getattr\x93.",  # STACK_GLOBAL
        b"\x80\x04\x8c\nsubprocess\x8c\x05Popen\x93\x8c\x05false\x85R.",  # STACK_GLOBAL + REDUCE
        b"(cbuiltins\nslice\n(I0\nI1\ntRccopyreg\n_reconstructor\nt.",  # slice, then another
        b"(cbuiltins\nexec\nS'import os'\no.",  # OBJ
    ],
)
def test_hand_made_opcodes_for_other_globals_are_refused(raw):
    pickletools.dis(raw, out=io.StringIO())  # a well-formed pickle: refused for its content
    with pytest.raises(UnsafeMetadata, match="only plain data"):
        parse_output_slices(b64(raw))


def test_a_refused_name_is_shown_short_and_printable():
    raw = b"\x80\x04\x8c\x02os\x8c\xc8" + b"\n" * 200 + b"\x93."
    with pytest.raises(UnsafeMetadata) as info:
        safe_unpickle(raw)
    assert "\n" not in str(info.value)
    assert len(str(info.value)) < 250


def test_a_numpy_object_is_refused():
    with pytest.raises(UnsafeMetadata, match="numpy"):
        parse_output_slices(b64pickle({"x": np.arange(2)}))


def test_an_extension_code_resolving_to_a_global_is_refused():
    copyreg.add_extension(record.__module__, "record", 0xF1)
    try:
        raw = b"\x80\x02\x82\xf1(S'x'\ntR."  # EXT1 0xf1 -> record('x')
        with pytest.raises(UnsafeMetadata, match=r"test_dms_model\.record"):
            safe_unpickle(raw)
    finally:
        copyreg.remove_extension(record.__module__, "record", 0xF1)


def test_a_persistent_id_is_refused():
    with pytest.raises(UnsafeMetadata, match="persistent id"):
        safe_unpickle(b"\x80\x04\x8c\x04evil\x94Q.")  # BINPERSID


@pytest.mark.parametrize(
    "value", [{1, 2}, frozenset({1}), b"bytes", bytearray(b"x"), {"x": [slice(0, 1), {3}]}]
)
def test_data_that_is_not_plain_is_refused_even_without_a_global(value):
    with pytest.raises(UnsafeMetadata, match="only plain data"):
        safe_unpickle(pickle.dumps(value, protocol=5))


def test_plain_data_and_slices_are_admitted_even_self_referencing():
    cycle: list[object] = [1, 2.5, "s", None, True, (slice(1, 2),)]
    cycle.append(cycle)
    value = safe_unpickle(pickle.dumps({"k": cycle}))
    assert value["k"][:6] == cycle[:6]
    assert value["k"][6] is value["k"]


# -- the contract read from an ONNX file ---------------------------------------------------------


def tiny_model(
    tmp_path: Path,
    *,
    img: tuple[list[int | str], int] = ([1, 1382400], TensorProto.UINT8),
    calib: tuple[list[int | str], int] | None = ([1, 3], TensorProto.FLOAT),
    output_shape: list[int | str] | None = None,
    output_type: int = TensorProto.FLOAT,
    produced: int = 553,
    slices: str | None = None,
    extra_input: bool = False,
    two_outputs: bool = False,
    fail_at_run: bool = False,
) -> Path:
    """A small runnable model: its output is calib's sum repeated ``produced`` times (or, with
    ``fail_at_run``, a reshape that fails at run time)."""
    inputs = [helper.make_tensor_value_info("input_img", img[1], img[0])]
    if calib is not None:
        inputs.append(helper.make_tensor_value_info("calib", calib[1], calib[0]))
    if extra_input:
        inputs.append(helper.make_tensor_value_info("desire", TensorProto.FLOAT, [1, 8]))
    source = "calib" if calib is not None else "input_img"
    nodes = [
        helper.make_node("Cast", [source], ["f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["f"], ["s"], keepdims=1),
        helper.make_node("Reshape", ["s", "row"], ["r"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([1, 1], dtype=np.int64), "row"),
        numpy_helper.from_array(np.array([1, produced], dtype=np.int64), "tiles"),
        numpy_helper.from_array(np.array([7, 7], dtype=np.int64), "impossible"),
    ]
    if fail_at_run:
        nodes.append(helper.make_node("Reshape", ["r", "impossible"], ["t"]))
    else:
        nodes.append(helper.make_node("Tile", ["r", "tiles"], ["t"]))
    nodes.append(helper.make_node("Cast", ["t"], ["outputs"], to=output_type))
    outputs = [helper.make_tensor_value_info("outputs", output_type, output_shape or [1, produced])]
    if two_outputs:
        nodes.append(helper.make_node("Identity", ["s"], ["extra"]))
        outputs.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, [1, 1]))
    graph = helper.make_graph(nodes, "tiny", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if slices is None:
        slices = encode_output_slices(REFERENCE_SLICES)
    if slices:
        entry = model.metadata_props.add()
        entry.key, entry.value = "output_slices", slices
    return write_model(
        model, tmp_path / f"tiny-{hashlib.sha1(model.SerializeToString()).hexdigest()[:8]}.onnx"
    )


@pytest.fixture(scope="session")
def reference_path(tmp_path_factory) -> Path:
    return reference_model_path(tmp_path_factory.mktemp("model-cache"))


@pytest.fixture(scope="session")
def stalling_path(tmp_path_factory) -> Path:
    """About 0.3-0.6 s per run on one thread unless terminated."""
    return write_model(
        build_stalling_model(matmuls=300), tmp_path_factory.mktemp("m") / "stall.onnx"
    )


def test_the_reference_model_has_openpilots_contract(reference_path):
    contract = load_contract(reference_path)
    assert [str(spec) for spec in contract.inputs] == [
        "'input_img' (1, 1382400) uint8",
        "'calib' (1, 3) float32",
    ]
    assert str(contract.output) == "'outputs' (1, 553) float32"
    assert contract.output_length == 553
    assert dict(contract.output_slices) == dict(REFERENCE_SLICES)
    assert set(REQUIRED_HEADS) <= set(contract.output_slices)
    assert contract.output_slices["features"] == slice(41, 553)
    assert contract.model_checkpoint == REFERENCE_CHECKPOINT
    assert "UNTRAINED" in contract.metadata["description"]
    assert json.loads(json.dumps(contract.to_json()))["output_slices"]["wheel_on_right"] == [40, 41]


def test_a_model_with_json_slices_and_symbolic_dimensions_loads(tmp_path):
    path = tiny_model(
        tmp_path,
        img=(["batch", 1382400], TensorProto.UINT8),
        output_shape=["batch", "n"],
        slices=encode_output_slices(REFERENCE_SLICES, as_json=True),
    )
    contract = load_contract(path)
    assert contract.input("input_img").shape == (0, 1382400)
    assert contract.declared_output_length is None
    assert contract.output_length == 553  # what the slices need


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"calib": None}, r"missing \['calib'\]"),
        ({"extra_input": True}, r"unexpected \['desire'\]"),
        (
            {"img": ([1, 1000], TensorProto.UINT8)},
            r"'input_img' \(1, 1000\) uint8; expected 'input_img' \(1, 1382400\) uint8",
        ),
        ({"img": ([1, 1382400], TensorProto.FLOAT)}, r"input_img.* float32; expected .* uint8"),
        ({"img": ([1382400], TensorProto.UINT8)}, r"\(1382400,\) uint8; expected"),
        (
            {"calib": ([1, 4], TensorProto.FLOAT)},
            r"'calib' \(1, 4\) float32; expected 'calib' \(1, 3\)",
        ),
        ({"calib": ([1, 3], TensorProto.DOUBLE)}, r"'calib' \(1, 3\) float64; expected"),
        ({"two_outputs": True}, r"2 outputs \['outputs', 'extra'\]; expected one float32 output"),
        ({"output_type": TensorProto.FLOAT16}, r"float16; expected a float32 output"),
        (
            {"produced": 100},
            r"'features' is \[41, 553\), past the end of output 'outputs' \(1, 100\)",
        ),
    ],
)
def test_a_graph_that_does_not_match_is_refused_at_load_naming_what_was_expected(
    tmp_path, kwargs, message
):
    with pytest.raises(ContractMismatch, match=message):
        load_contract(tiny_model(tmp_path, **kwargs))


@pytest.mark.parametrize("head", ["sleep_prob_rhd", "face_descs_lhd", "wheel_on_right"])
def test_a_head_the_decoder_needs_missing_from_the_slices_is_refused(tmp_path, head):
    slices = {h: s for h, s in REFERENCE_SLICES.items() if h != head}
    path = tiny_model(tmp_path, slices=encode_output_slices(slices))
    with pytest.raises(ContractMismatch, match=f"no head '{head}'"):
        load_contract(path)


def test_face_descriptors_narrower_than_the_decoder_needs_are_refused(tmp_path):
    slices = dict(REFERENCE_SLICES) | {"face_descs_rhd": slice(20, 30)}
    path = tiny_model(tmp_path, slices=encode_output_slices(slices))
    with pytest.raises(ContractMismatch, match=r"'face_descs_rhd' has 10 value.*at least 11"):
        load_contract(path)


def test_a_feature_slice_past_the_output_is_refused(tmp_path):
    slices = dict(REFERENCE_SLICES) | {"features": slice(41, 600)}
    path = tiny_model(tmp_path, slices=encode_output_slices(slices))
    with pytest.raises(ContractMismatch, match=r"'features' is \[41, 600\), past the end"):
        load_contract(path)


# -- the contract checked by a run on zero inputs -------------------------------------------------


def test_loading_runs_the_model_once_and_records_its_real_output_length(tmp_path):
    path = tiny_model(tmp_path, output_shape=["batch", "n"], produced=600)
    assert read_contract(path).measured_output_length is None
    contract = load_contract(path)
    assert contract.measured_output_length == 600
    assert contract.output_length == 600  # what the model gives, not what the slices need (553)


def test_slices_past_the_real_output_are_refused_at_load_naming_slice_stop_and_length(tmp_path):
    path = tiny_model(tmp_path, output_shape=["n"], produced=100)
    assert read_contract(path).output_length == 553  # nothing in the file says otherwise
    with pytest.raises(ContractMismatch) as info:
        load_contract(path)
    found = re.search(
        r"output slice '(\w+)' is \[(\d+), (\d+)\): it stops at (\d+), past the model's real "
        r"output length (\d+)",
        str(info.value),
    )
    assert found is not None, str(info.value)
    head, stop = found.group(1), int(found.group(3))
    assert stop == int(found.group(4)) == REFERENCE_SLICES[head].stop > 100
    assert int(found.group(5)) == 100
    with pytest.raises(ContractMismatch, match="past the model's real output length 100"):
        OnnxRunner(path)  # the runner checks with its own session


def test_a_model_giving_other_than_its_declared_length_is_refused_at_load(tmp_path):
    path = tiny_model(tmp_path, output_shape=[1, 553], produced=600)
    with pytest.raises(
        ContractMismatch, match=r"declares 553 values, but a run on zero inputs gave 600"
    ):
        load_contract(path)


def test_a_model_that_fails_on_zero_inputs_is_refused_at_load(tmp_path):
    path = tiny_model(tmp_path, output_shape=["n"], fail_at_run=True)
    with pytest.raises(ModelContractError, match="fails when run on zero inputs"):
        load_contract(path)


class CountingSession:
    """A session that records its runs' feeds and answers with ``length`` zeros."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.feeds: list[dict[str, np.ndarray]] = []

    def run(self, names, feeds, options=None):
        self.feeds.append(feeds)
        return [np.zeros((1, self.length), dtype=np.float32)]


def test_the_check_runs_a_given_session_once_on_zeros(tmp_path):
    contract = read_contract(tiny_model(tmp_path))
    session = CountingSession(553)
    assert check_real_output(contract, session).measured_output_length == 553
    (feeds,) = session.feeds
    assert feeds["input_img"].shape == (1, 1382400) and not feeds["input_img"].any()
    assert feeds["calib"].dtype == np.float32 and not feeds["calib"].any()
    with pytest.raises(ContractMismatch, match="gave 552"):
        check_real_output(contract, CountingSession(552))


def test_the_runner_checks_with_its_own_session_unless_given_a_contract(reference_path):
    assert OnnxRunner(reference_path).contract.measured_output_length == 553
    trusted = read_contract(reference_path)
    assert OnnxRunner(reference_path, contract=trusted).contract is trusted


def test_model_info_reports_slices_past_the_real_output(tmp_path, capsys):
    from pipelines.cli import main

    path = tiny_model(tmp_path, output_shape=["n"], produced=100)
    assert main(["model-info", "--model", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "aio-dms model-info: output slice " in captured.err
    assert "past the model's real output length 100" in captured.err
    assert main(["model-info", "--model", str(tiny_model(tmp_path, produced=553))]) == 0
    assert json.loads(capsys.readouterr().out)["output"]["length"] == 553


def test_metadata_without_output_slices_is_refused(tmp_path):
    with pytest.raises(MetadataError, match="no 'output_slices' entry"):
        load_contract(tiny_model(tmp_path, slices=""))


def test_a_model_with_a_malicious_pickle_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    path = tiny_model(tmp_path, slices=b64pickle({"x": CallsOsSystem(marker)}))
    with pytest.raises(UnsafeMetadata, match=r"posix\.system"):
        load_contract(path)
    with pytest.raises(UnsafeMetadata):
        OnnxRunner(path)
    assert not marker.exists()


def test_a_file_that_is_not_onnx_is_a_clear_error(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\xff not a protobuf" * 10)
    with pytest.raises(ModelContractError, match="not a readable ONNX model"):
        load_contract(junk)
    with pytest.raises(FileNotFoundError):
        load_contract(tmp_path / "missing.onnx")


def test_every_contract_error_is_a_value_error():
    for error in (ContractMismatch, MetadataError, UnsafeMetadata, ModelContractError):
        assert issubclass(error, ValueError)
    assert set(EXPECTED_INPUTS) == {"input_img", "calib"}


# -- the reference model -------------------------------------------------------------------------


def test_the_reference_model_is_built_deterministically_and_cached_by_content(tmp_path):
    first = build_reference_model().SerializeToString(deterministic=True)
    assert build_reference_model().SerializeToString(deterministic=True) == first
    path = reference_model_path(tmp_path)
    assert path.parent == tmp_path
    assert path.name == f"dms-reference-{hashlib.sha256(first).hexdigest()[:16]}.onnx"
    assert path.read_bytes() == first
    stamp = path.stat().st_mtime_ns
    assert reference_model_path(tmp_path) == path
    assert path.stat().st_mtime_ns == stamp  # not rebuilt
    path.write_bytes(b"damaged")
    assert reference_model_path(tmp_path).read_bytes() == first  # rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary files left


def test_the_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "here"))
    assert default_cache_dir() == tmp_path / "here"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "aio-dms"


def test_the_reference_model_costs_about_half_a_billion_multiply_adds():
    assert 0.3e9 < reference_model_macs() < 0.6e9


def test_another_seed_gives_other_weights_under_the_same_contract(tmp_path):
    other = write_model(build_reference_model(seed=7), tmp_path / "seed7.onnx")
    contract = load_contract(other)
    assert dict(contract.output_slices) == dict(REFERENCE_SLICES)
    assert "seed 7" in contract.model_checkpoint


# -- the onnxruntime runner ----------------------------------------------------------------------

IMAGE = np.random.default_rng(3).integers(0, 256, (960, 1440), dtype=np.uint8)
CALIB = np.array([0.01, -0.02, 0.03], dtype=np.float32)


async def test_the_reference_model_runs_within_its_bound_and_decodes(reference_path):
    runner = OnnxRunner(reference_path)
    with anyio.fail_after(10):
        out = await runner.run(IMAGE, CALIB, timeout=5.0)
    assert out.shape == (553,)
    assert out.dtype == np.float32
    assert np.isfinite(out).all()
    assert decode(out, runner.contract.output_slices).valid
    stats = runner.statistics()
    assert (stats.runs, stats.completed, stats.timed_out, stats.in_flight) == (1, 1, 0, False)
    assert runner.intra_op_threads == 1


async def test_the_output_is_deterministic_for_a_fixed_input(reference_path):
    runner = OnnxRunner(reference_path)
    with anyio.fail_after(10):
        first = await runner.run(IMAGE, CALIB, timeout=5.0)
        again = await runner.run(IMAGE.reshape(1, -1), CALIB.reshape(1, 3), timeout=5.0)
        other = await OnnxRunner(reference_path).run(IMAGE, CALIB, timeout=5.0)
        two_threads = await OnnxRunner(reference_path, intra_op_threads=2).run(
            IMAGE, CALIB, timeout=5.0
        )
        changed = await runner.run(IMAGE, [0.5, 0.0, 0.0], timeout=5.0)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, other)
    np.testing.assert_allclose(first, two_threads, rtol=1e-5, atol=1e-5)
    assert not np.array_equal(first, changed)  # calib reaches the output


async def test_the_output_belongs_to_the_caller_and_the_inputs_may_be_reused(reference_path):
    runner = OnnxRunner(reference_path)
    image = IMAGE.copy()
    with anyio.fail_after(10):
        first = await runner.run(image, CALIB, timeout=5.0)
        kept = first.copy()
        image[:] = 0  # the caller reuses its buffer at once
        second = await runner.run(image, CALIB, timeout=5.0)
    np.testing.assert_array_equal(first, kept)  # the next run did not write into it
    assert not np.shares_memory(first, second)


async def test_opening_a_runner_is_bounded_too(reference_path):
    with anyio.fail_after(10):
        runner = await OnnxRunner.open(reference_path, timeout=5.0, intra_op_threads=2)
    assert runner.intra_op_threads == 2
    assert runner.contract.output_length == 553


@pytest.mark.parametrize(
    ("img", "calib", "message"),
    [
        (IMAGE.astype(np.float32), CALIB, "input_img is float32 .*; expected uint8"),
        (IMAGE[:10], CALIB, r"input_img is uint8 \(10, 1440\); expected uint8 with 1382400"),
        (IMAGE, [0.0, 0.0], r"calib has shape \(2,\); expected 3 values"),
        (IMAGE, [0.0, float("nan"), 0.0], "expected finite"),
        (IMAGE, ["a", "b", "c"], "calib is not numeric"),
    ],
)
async def test_bad_inputs_are_refused_before_anything_runs(reference_path, img, calib, message):
    runner = OnnxRunner(reference_path)
    with pytest.raises(ModelInputError, match=message):
        await runner.run(img, calib, timeout=5.0)
    assert runner.statistics().runs == 0


async def test_a_run_without_a_bound_is_refused(reference_path):
    runner = OnnxRunner(reference_path)
    with pytest.raises(UnboundedWaitError):
        await runner.run(IMAGE, CALIB)
    assert runner.statistics().runs == 0


def test_the_thread_count_is_checked(reference_path):
    with pytest.raises(ValueError, match="at least 1"):
        OnnxRunner(reference_path, intra_op_threads=0)
    with pytest.raises(TypeError):
        OnnxRunner(reference_path, intra_op_threads=1.5)


async def wait_for_empty(ledger: Ledger) -> None:
    """The worker thread closes its ledger entry just after handing its outcome to the loop."""
    await wait_until(
        lambda: not ledger.live(),
        bool,
        awaited="worker ledger entry",
        error=ModelTimeout,
        timeout=2,
    )


async def test_an_overrun_is_a_model_timeout_after_the_run_was_terminated_and_drained(
    stalling_path,
):
    runner = OnnxRunner(stalling_path)
    ledger = Ledger()
    with use_ledger(ledger), anyio.fail_after(10):
        started = time.perf_counter()
        with pytest.raises(ModelTimeout) as info:
            await runner.run(IMAGE, CALIB, timeout=0.03)
        took = time.perf_counter() - started
        stats = runner.statistics()  # read at once: the run had returned before the error came
        await wait_for_empty(ledger)
    assert info.value.in_flight is False
    assert info.value.timeout == 0.03
    assert "model run (stall.onnx)" in str(info.value)
    assert stats.terminated == 1 and stats.timed_out == 1 and not stats.in_flight
    assert took < 0.25  # terminated, not run to its end
    ledger.assert_empty()
    with anyio.fail_after(10):  # the runner is fine afterwards: terminate does not stick
        out = await runner.run(IMAGE, CALIB, timeout=8.0)
    assert out[0] == pytest.approx(float(CALIB.sum()))


async def test_a_frame_budget_bounds_the_run(stalling_path):
    runner = OnnxRunner(stalling_path)
    with anyio.fail_after(10), deadline_scope(0.03, name="frame 9"):
        with pytest.raises(BudgetExhausted) as info:
            await runner.run(IMAGE, CALIB, timeout=5.0)
    assert info.value.budget == "frame 9"
    assert runner.statistics().terminated == 1


async def test_cancelling_the_caller_terminates_and_drains_the_run(stalling_path):
    runner = OnnxRunner(stalling_path)
    ledger = Ledger()
    scope = anyio.CancelScope()

    async def caller() -> None:
        with scope:
            await runner.run(IMAGE, CALIB, timeout=5.0)

    with use_ledger(ledger), anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller)
            await wait_until(  # cancelled once the run is inside onnxruntime, however busy
                lambda: runner.statistics().running,
                lambda running: running == 1,
                awaited="the stalling model's run to start",
                error=ModelTimeout,
                timeout=5.0,
            )
            scope.cancel()
        assert scope.cancelled_caught
        assert runner.statistics().terminated == 1
        assert not runner.statistics().in_flight
        await wait_for_empty(ledger)


class ConcurrencyProbe:
    """Wraps an onnxruntime session and records how many runs were inside it at once."""

    def __init__(self, session) -> None:
        self._session = session
        self._lock = threading.Lock()
        self.inside = 0
        self.most = 0
        self.calls = 0

    def run(self, *args):
        with self._lock:
            self.inside += 1
            self.calls += 1
            self.most = max(self.most, self.inside)
        try:
            time.sleep(0.005)  # widen the window an overlap would need
            return self._session.run(*args)
        finally:
            with self._lock:
                self.inside -= 1


async def test_concurrent_runs_never_overlap(reference_path, monkeypatch):
    runner = OnnxRunner(reference_path, intra_op_threads=2)
    probe = ConcurrencyProbe(runner._session)
    monkeypatch.setattr(runner, "_session", probe)
    results: dict[int, np.ndarray] = {}

    async def one(i: int) -> None:
        results[i] = await runner.run(IMAGE, [0.1 * i, 0.0, 0.0], timeout=5.0)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(one, i)
    assert probe.calls == 4 and probe.most == 1
    assert len({r.tobytes() for r in results.values()}) == 4  # each run read its own inputs


async def test_waiting_for_the_runner_counts_against_the_waiting_runs_bound(stalling_path):
    runner = OnnxRunner(stalling_path)
    errors: dict[str, BaseException] = {}

    async def run(name: str, timeout: float) -> None:
        try:
            await runner.run(IMAGE, CALIB, timeout=timeout)
        except ModelTimeout as exc:
            errors[name] = exc

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "first", 0.15)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(run, "second", 0.03)
    assert "never started: still queued behind an earlier call" in str(errors["second"].__notes__)
    assert "model run (stall.onnx)" in str(errors["first"])
    assert runner.statistics().runs == 1  # the second never started a run


class Gated:
    """A session whose runs wait for a gate, recording the calibration each run was given."""

    def __init__(self, session) -> None:
        self._session = session
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.seen: list[float] = []

    def run(self, names, feeds, options):
        self.seen.append(float(feeds["calib"][0, 0]))
        self.entered.set()
        self.gate.wait(10.0)
        return self._session.run(names, feeds, options)


async def test_a_waiting_run_is_replaced_by_a_newer_one_and_never_runs(reference_path, monkeypatch):
    runner = OnnxRunner(reference_path)
    gated = Gated(runner._session)
    monkeypatch.setattr(runner, "_session", gated)
    outcomes: dict[int, object] = {}
    replaced = anyio.Event()

    async def one(i: int) -> None:
        try:
            outcomes[i] = await runner.run(
                IMAGE, [float(i), 0.0, 0.0], timeout=5.0, replace_waiting=True
            )
        except RunSuperseded as exc:
            outcomes[i] = exc
            replaced.set()

    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 1)
                # the first run is in progress on the runner's thread
                await anyio.to_thread.run_sync(gated.entered.wait, 5.0)
                tg.start_soon(one, 2)
                await anyio.wait_all_tasks_blocked()
                tg.start_soon(one, 3)
                with anyio.fail_after(1):  # replaced at once, not when the first run ends
                    await replaced.wait()
                assert 2 in outcomes and 1 not in outcomes
                gated.gate.set()
    finally:
        gated.gate.set()
    assert gated.seen == [1.0, 3.0]  # the replaced run never reached onnxruntime
    assert isinstance(outcomes[2], RunSuperseded)
    assert all(isinstance(outcomes[i], np.ndarray) for i in (1, 3))
    stats = runner.statistics()
    assert (stats.runs, stats.completed, stats.superseded) == (2, 2, 1)


class IgnoresTerminate:
    """A session whose run ignores the terminate flag until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def run(self, names, feeds, options):
        self.entered.set()
        self.release.wait(10.0)
        return [np.zeros((1, 553), dtype=np.float32)]


async def test_a_run_that_will_not_stop_is_in_flight_and_the_next_run_waits_for_it(
    reference_path, monkeypatch
):
    runner = OnnxRunner(reference_path, drain_timeout=0.02)
    stuck = IgnoresTerminate()
    monkeypatch.setattr(runner, "_session", stuck)
    try:
        with anyio.fail_after(10):
            timed_out: list[ModelTimeout] = []

            async def first() -> None:
                with pytest.raises(ModelTimeout) as info:
                    await runner.run(IMAGE, CALIB, timeout=0.02)
                timed_out.append(info.value)

            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                # until the run is handed to the runner's thread (no event says so: a field)
                while runner._waiting is None or runner._waiting.call is None:
                    await anyio.lowlevel.checkpoint()
                # The loop held until the run is inside onnxruntime, however slow the host: its
                # bound then runs out with the run in flight, never before it has started.
                assert stuck.entered.wait(5.0)
            assert timed_out[0].in_flight is True
            assert runner.statistics().in_flight
            with pytest.raises(ModelTimeout) as waited:
                await runner.run(IMAGE, CALIB, timeout=0.03)
            assert "never started: still queued behind" in str(waited.value.__notes__)
            assert runner.statistics().in_flight  # the stuck run, not the withdrawn one
            stuck.release.set()
            out = await runner.run(IMAGE, CALIB, timeout=5.0)
        assert out.shape == (553,)
        assert not runner.statistics().in_flight
    finally:
        stuck.release.set()


async def test_an_output_of_the_wrong_length_is_invalid_output(tmp_path):
    path = tiny_model(tmp_path, output_shape=["n"], produced=100)
    # the contract as read, not checked by a run (which refuses this model at load): the runner
    # still checks every output
    runner = OnnxRunner(path, contract=read_contract(path))
    with (
        anyio.fail_after(10),
        pytest.raises(InvalidOutput, match="has 100 values; expected at least 553"),
    ):
        await runner.run(IMAGE, CALIB, timeout=5.0)
    assert runner.statistics().invalid_output == 1


async def test_an_onnxruntime_error_is_a_typed_model_fault(tmp_path):
    path = tiny_model(tmp_path, output_shape=["n"], fail_at_run=True)
    runner = OnnxRunner(path, contract=read_contract(path))  # not run at load: it would fail there
    with anyio.fail_after(10), pytest.raises(ModelRunFailed, match=r"\[model\] onnxruntime: "):
        await runner.run(IMAGE, CALIB, timeout=5.0)
    assert runner.statistics().failed == 1


def test_a_shifted_model_moves_only_its_head_and_names_it():
    reference, shifted = build_reference_model(), build_shifted_model("face_prob_lhd", 0.5)
    biases = [
        next(t for t in m.graph.initializer if t.name == "fc2.bias") for m in (reference, shifted)
    ]
    before, after = (np.frombuffer(b.raw_data, np.float32) for b in biases)
    head = REFERENCE_SLICES["face_prob_lhd"]
    assert np.all(after[head] == before[head] + np.float32(0.5))
    assert np.array_equal(np.delete(after, head), np.delete(before, head))
    checkpoint = {e.key: e.value for e in shifted.metadata_props}["model_checkpoint"]
    assert "face_prob_lhd shifted by +0.5" in checkpoint


@pytest.mark.parametrize(
    ("head", "shift"),
    [
        ("features", 1.0),
        ("nose_prob", 1.0),
        ("face_prob_lhd", math.nan),
        ("face_prob_lhd", math.inf),
        ("face_prob_lhd", True),
    ],
)
def test_a_shifted_model_of_an_unknown_head_or_shift_is_refused(head, shift):
    with pytest.raises(ValueError, match=r"^(head|shift): expected"):
        build_shifted_model(head, shift)
