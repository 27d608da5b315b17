"""The model contract: what a DMS model takes and gives, read from its ONNX file.

openpilot's driver-monitoring model (spec/dms-contract.md §1.2, §1.6, §4) takes two inputs,
``input_img`` (1, 1382400) uint8 — the warped 1440x960 luma, row-major — and ``calib`` (1, 3)
float32 — (roll, pitch, yaw) — and returns one flat float32 vector. Which values mean what lives in
the ONNX metadata: the entry ``output_slices`` maps head names to ``slice(start, stop)`` over that
vector, as base64 text of a Python pickle. This module reads and checks all of that when a model is
loaded, so a model that does not fit is refused with a message naming what was expected, not
discovered frame by frame: :func:`load_contract` reads the graph and the metadata
(:func:`read_contract`), then runs the model once on zero inputs (:func:`check_real_output`) to
check that every output slice lies within the output it really produces.

The pickle is never unpickled (design C8): :func:`safe_unpickle`
(:mod:`pipelines.dms.model.metadata`, re-exported here) plays its opcodes itself and admits plain
data (dict, list, tuple, str, int, float, bool, None) and ``builtins.slice``, within
:class:`MetadataLimits`; any other global, a persistent id or an extension code is refused before
anything is called. ``output_slices`` may also be JSON, ``{"name": [start, stop], ...}``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx

from .decode import REQUIRED_HEADS
from .limits import (
    DEFAULT_LIMITS,
    MetadataError,
    MetadataLimitExceeded,
    MetadataLimits,
    ModelContractError,
    UnsafeMetadata,
)
from .metadata import MAX_METADATA_BYTES, encode_output_slices, parse_output_slices
from .safe_pickle import safe_unpickle

__all__ = [
    "CALIB",
    "CALIB_SHAPE",
    "DEFAULT_LIMITS",
    "EXPECTED_INPUTS",
    "INPUT_IMG",
    "INPUT_IMG_SHAPE",
    "MAX_METADATA_BYTES",
    "MODEL_FRAME",
    "ContractMismatch",
    "MetadataError",
    "MetadataLimitExceeded",
    "MetadataLimits",
    "ModelContract",
    "ModelContractError",
    "TensorSpec",
    "UnsafeMetadata",
    "check_real_output",
    "contract_from_onnx",
    "encode_output_slices",
    "load_contract",
    "parse_output_slices",
    "read_contract",
    "safe_unpickle",
    "zero_inputs",
]

INPUT_IMG = "input_img"
CALIB = "calib"
MODEL_FRAME = (960, 1440)
"""The model's input image: rows, columns (DM_INPUT_SIZE 1440x960)."""
INPUT_IMG_SHAPE = (1, MODEL_FRAME[0] * MODEL_FRAME[1])
CALIB_SHAPE = (1, 3)


class ContractMismatch(ModelContractError):
    """The model's graph does not match the contract (inputs, shapes, dtypes, output length, heads)."""


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output. ``shape`` uses 0 for a symbolic dimension (as openpilot's metadata
    script does); ``None`` when the graph declares no shape at all."""

    name: str
    shape: tuple[int, ...] | None
    dtype: str
    """numpy's name for the element type: ``"uint8"``, ``"float32"``."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": None if self.shape is None else list(self.shape),
            "dtype": self.dtype,
        }

    def __str__(self) -> str:
        shape = "unknown shape" if self.shape is None else str(self.shape)
        return f"{self.name!r} {shape} {self.dtype}"


EXPECTED_INPUTS: Mapping[str, TensorSpec] = MappingProxyType(
    {
        INPUT_IMG: TensorSpec(INPUT_IMG, INPUT_IMG_SHAPE, "uint8"),
        CALIB: TensorSpec(CALIB, CALIB_SHAPE, "float32"),
    }
)


# -- the contract -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelContract:
    """A model's inputs, its one float32 output and the head table over it, checked against what
    the DMS chain feeds and the decoder reads."""

    inputs: tuple[TensorSpec, ...]
    output: TensorSpec
    output_slices: Mapping[str, slice]
    model_checkpoint: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    """Every ``metadata_props`` entry, ``output_slices`` included, as stored."""
    path: Path | None = None
    measured_output_length: int | None = None
    """The output's length in a run on zero inputs (:func:`check_real_output`); ``None`` until the
    model has been run."""

    @property
    def declared_output_length(self) -> int | None:
        """The output's length from its declared shape, ``None`` if it has symbolic dimensions."""
        shape = self.output.shape
        if shape is None or any(d <= 0 for d in shape):
            return None
        return math.prod(shape)

    @property
    def output_length(self) -> int:
        """The length measured by a run, else the declared length, else (for a symbolic shape)
        the least length the slices need."""
        if self.measured_output_length is not None:
            return self.measured_output_length
        declared = self.declared_output_length
        return declared if declared is not None else self.slices_end

    @property
    def slices_end(self) -> int:
        return int(max(s.stop for s in self.output_slices.values()))

    def input(self, name: str) -> TensorSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """The contract as plain JSON data (slices as [start, stop])."""
        return {
            "path": None if self.path is None else str(self.path),
            "model_checkpoint": self.model_checkpoint,
            "inputs": [spec.to_json() for spec in self.inputs],
            "output": {**self.output.to_json(), "length": self.output_length},
            "output_slices": {h: [s.start, s.stop] for h, s in self.output_slices.items()},
            "metadata": {k: v for k, v in self.metadata.items() if k != "output_slices"},
        }


def _dtype_name(elem_type: int) -> str:
    try:
        return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)))
    except (KeyError, TypeError, ValueError):
        return str(onnx.TensorProto.DataType.Name(elem_type)).lower()


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    if not value.type.HasField("tensor_type"):
        return TensorSpec(value.name, None, "not a tensor")
    tensor = value.type.tensor_type
    shape = (
        tuple(d.dim_value if d.HasField("dim_value") else 0 for d in tensor.shape.dim)
        if tensor.HasField("shape")
        else None
    )
    return TensorSpec(value.name, shape, _dtype_name(tensor.elem_type))


def _check_input(spec: TensorSpec, expected: TensorSpec) -> None:
    if spec.dtype != expected.dtype:
        raise ContractMismatch(f"model input {spec}; expected {expected}")
    if spec.shape is None:
        return  # undeclared: the runner feeds the expected shape, onnxruntime checks it
    fits = len(spec.shape) == len(expected.shape or ()) and all(
        d in (0, e) for d, e in zip(spec.shape, expected.shape or (), strict=True)
    )
    if not fits:
        raise ContractMismatch(f"model input {spec}; expected {expected}")


def _check_heads(slices: Mapping[str, slice], length: int | None, output: TensorSpec) -> None:
    for head, least in REQUIRED_HEADS.items():
        if head not in slices:
            raise ContractMismatch(
                f"output_slices has no head {head!r}; the decoder needs every one of "
                f"{sorted(REQUIRED_HEADS)}"
            )
        width = slices[head].stop - slices[head].start
        if width < least:
            raise ContractMismatch(
                f"output head {head!r} has {width} value(s); expected at least {least}"
            )
    if length is not None:
        for head, s in slices.items():
            if s.stop > length:
                raise ContractMismatch(
                    f"output head {head!r} is [{s.start}, {s.stop}), past the end of output "
                    f"{output} ({length} values)"
                )


def contract_from_onnx(model: onnx.ModelProto, path: Path | None = None) -> ModelContract:
    """Read and check the contract of a loaded ONNX model; see :func:`load_contract`."""
    metadata = {prop.key: prop.value for prop in model.metadata_props}
    inputs, output = _inputs(model.graph), _output(model.graph)
    if "output_slices" not in metadata:
        raise MetadataError(
            "model metadata has no 'output_slices' entry; expected openpilot's base64 pickle of "
            "{head name: slice} (or JSON {head name: [start, stop]})"
        )
    slices = parse_output_slices(metadata["output_slices"])
    contract = ModelContract(
        inputs=inputs,
        output=output,
        output_slices=MappingProxyType(slices),
        model_checkpoint=metadata.get("model_checkpoint", ""),
        metadata=MappingProxyType(metadata),
        path=path,
    )
    _check_heads(slices, contract.declared_output_length, output)
    return contract


def _inputs(graph: onnx.GraphProto) -> tuple[TensorSpec, ...]:
    """The graph's inputs (initializers aside), checked: exactly the two the contract names."""
    initializers = {init.name for init in graph.initializer}
    inputs = tuple(_spec(v) for v in graph.input if v.name not in initializers)
    names = [spec.name for spec in inputs]
    missing = [name for name in EXPECTED_INPUTS if name not in names]
    extra = [name for name in names if name not in EXPECTED_INPUTS]
    if missing or extra:
        expected = ", ".join(str(spec) for spec in EXPECTED_INPUTS.values())
        raise ContractMismatch(
            f"model inputs are {names}; expected exactly {expected}"
            + (f" (missing {missing})" if missing else "")
            + (f" (unexpected {extra})" if extra else "")
        )
    for spec in inputs:
        _check_input(spec, EXPECTED_INPUTS[spec.name])
    return inputs


def _output(graph: onnx.GraphProto) -> TensorSpec:
    """The graph's one output, checked: float32."""
    if len(graph.output) != 1:
        raise ContractMismatch(
            f"model has {len(graph.output)} outputs {[o.name for o in graph.output]}; "
            "expected one float32 output"
        )
    output = _spec(graph.output[0])
    if output.dtype != "float32":
        raise ContractMismatch(f"model output {output}; expected a float32 output")
    return output


def read_contract(path: str | Path) -> ModelContract:
    """An ONNX model's contract from its graph and metadata alone (nothing is run): inputs
    ``input_img`` (1, 1382400) uint8 and ``calib`` (1, 3) float32 (symbolic dimensions accepted),
    one float32 output, ``output_slices`` metadata that is safe to read within
    :data:`DEFAULT_LIMITS`, covers every head the decoder needs with enough values and lies within
    the declared output. Raises :class:`ModelContractError` (or a subclass), or
    :class:`FileNotFoundError`."""
    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except FileNotFoundError:
        raise
    except Exception as exc:  # onnx raises DecodeError and friends for a file that is not ONNX
        raise ModelContractError(f"{path} is not a readable ONNX model: {exc}") from exc
    return contract_from_onnx(model, path)


def zero_inputs() -> dict[str, np.ndarray[Any, Any]]:
    """The feeds of a check run: both inputs, zeros, in the contract's shapes and dtypes."""
    return {
        INPUT_IMG: np.zeros(INPUT_IMG_SHAPE, dtype=np.uint8),
        CALIB: np.zeros(CALIB_SHAPE, dtype=np.float32),
    }


def _check_session(path: Path) -> Any:
    # Imported here: reading a contract's types needs no onnxruntime, checking a model does.
    import onnxruntime as ort  # type: ignore[import-untyped]

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: what matters about the output, the check says
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelContractError(f"onnxruntime cannot load {path}: {exc}") from exc


def check_real_output(contract: ModelContract, session: Any = None) -> ModelContract:
    """Run the model once on :func:`zero_inputs` and check what it really gives: as many values
    as its output declares (if it declares a length), and no output slice stopping past them.

    ``session``: an onnxruntime session of the model (a runner's, so the model is loaded once);
    by default one is made for the check from ``contract.path``. One run of the reference model
    costs about 10 ms. Returns the contract with :attr:`~ModelContract.measured_output_length`.
    Raises :class:`ContractMismatch` naming the slice, its stop and the real length, or
    :class:`ModelContractError` if the model cannot be loaded or run.
    """
    where = contract.path.name if contract.path is not None else "the model"
    if session is None:
        if contract.path is None:
            raise ValueError("check_real_output needs a session or a contract read from a file")
        session = _check_session(contract.path)
    try:
        (result,) = session.run([contract.output.name], zero_inputs())
        length = int(np.asarray(result).size)
    except Exception as exc:  # onnxruntime's own errors: the model cannot run on these inputs
        raise ModelContractError(f"{where} fails when run on zero inputs: {exc}") from exc
    declared = contract.declared_output_length
    if declared is not None and length != declared:
        raise ContractMismatch(
            f"model output {contract.output} declares {declared} values, but a run on zero "
            f"inputs gave {length}"
        )
    for head, s in contract.output_slices.items():
        if s.stop > length:
            raise ContractMismatch(
                f"output slice {head!r} is [{s.start}, {s.stop}): it stops at {s.stop}, past the "
                f"model's real output length {length} (measured by a run on zero inputs)"
            )
    return dataclasses.replace(contract, measured_output_length=length)


def load_contract(path: str | Path) -> ModelContract:
    """Read an ONNX model's contract and check it (:func:`read_contract`), then run the model
    once on zero inputs to check that its output slices fit the output it really produces
    (:func:`check_real_output`, on a session made for the check).

    Raises :class:`ContractMismatch`, :class:`MetadataError` (:class:`UnsafeMetadata`,
    :class:`MetadataLimitExceeded`) or :class:`ModelContractError` (all ``ValueError``), or
    :class:`FileNotFoundError`. Blocks (tens of milliseconds): call it off the event loop.
    """
    return check_real_output(read_contract(path))
