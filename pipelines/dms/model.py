"""The model contract: what a DMS model takes and gives, read from its ONNX file.

openpilot's driver-monitoring model (spec/dms-contract.md §1.2, §1.6, §4) takes two inputs,
``input_img`` (1, 1382400) uint8 — the warped 1440x960 luma, row-major — and ``calib`` (1, 3)
float32 — (roll, pitch, yaw) — and returns one flat float32 vector. Which values mean what lives in
the ONNX metadata: the entry ``output_slices`` maps head names to ``slice(start, stop)`` over that
vector, as base64 text of a Python pickle. This module reads and checks all of that when a model is
loaded, so a model that does not fit is refused with a message naming what was expected, not
discovered frame by frame.

The pickle is never unpickled (design C8): :func:`safe_unpickle`
(:mod:`pipelines.dms.model_metadata`, re-exported here) plays its opcodes itself and admits plain
data (dict, list, tuple, str, int, float, bool, None) and ``builtins.slice``, within
:class:`MetadataLimits`; any other global, a persistent id or an extension code is refused before
anything is called. ``output_slices`` may also be JSON, ``{"name": [start, stop], ...}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx

from .decode import REQUIRED_HEADS
from .model_metadata import (
    DEFAULT_LIMITS,
    MAX_METADATA_BYTES,
    MetadataError,
    MetadataLimitExceeded,
    MetadataLimits,
    ModelContractError,
    UnsafeMetadata,
    encode_output_slices,
    parse_output_slices,
    safe_unpickle,
)

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
    "contract_from_onnx",
    "encode_output_slices",
    "load_contract",
    "parse_output_slices",
    "safe_unpickle",
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

    @property
    def declared_output_length(self) -> int | None:
        """The output's length from its declared shape, ``None`` if it has symbolic dimensions."""
        shape = self.output.shape
        if shape is None or any(d <= 0 for d in shape):
            return None
        return math.prod(shape)

    @property
    def output_length(self) -> int:
        """The declared length, or (for a symbolic shape) the least length the slices need."""
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


def load_contract(path: str | Path) -> ModelContract:
    """Read an ONNX model's contract and check it: inputs ``input_img`` (1, 1382400) uint8 and
    ``calib`` (1, 3) float32 (symbolic dimensions accepted), one float32 output, ``output_slices``
    metadata that is safe to read within :data:`DEFAULT_LIMITS`, covers every head the decoder
    needs with enough values, and lies within the output.

    Raises :class:`ContractMismatch`, :class:`MetadataError` (:class:`UnsafeMetadata`,
    :class:`MetadataLimitExceeded`) or :class:`ModelContractError` (all ``ValueError``), or
    :class:`FileNotFoundError`.
    """
    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except FileNotFoundError:
        raise
    except Exception as exc:  # onnx raises DecodeError and friends for a file that is not ONNX
        raise ModelContractError(f"{path} is not a readable ONNX model: {exc}") from exc
    return contract_from_onnx(model, path)
