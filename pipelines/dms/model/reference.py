"""A reference DMS model with openpilot's exact I/O contract — UNTRAINED.

openpilot's real model (``dmonitoring_model.onnx``, spec/dms-contract.md §4) lives in Git LFS and is
not available here. This module builds a stand-in with the same interface, so the whole chain (warp
-> model -> decode -> publish) runs, costs about what a real frame costs on a CPU, and can be
tested:

* inputs ``input_img`` (1, 1382400) uint8 and ``calib`` (1, 3) float32;
* one float32 output ``outputs`` (1, 553): per side (``lhd``, then ``rhd``) ``face_descs`` (12)
  and the eight probability heads (1 each), then ``wheel_on_right`` (1), then a 512-wide feature
  tail ``features`` — 2 x (12 + 8) + 1 + 512 = 553, the length a third-party fork asserts for the
  current model;
* ``output_slices`` in the metadata in openpilot's format (base64 of a pickled {name: slice}),
  ``model_checkpoint`` naming it, and ``description`` saying it is untrained.

Network: the flat image reshaped to (1, 1, 960, 1440), four strided convolutions with ReLU —
4x4/4 to 32 channels (normalising the raw 0..255 bytes folded into its weights), then 3x3/2 to 32,
64 and 128 channels — global average pooling, ``calib`` appended, a 131 -> 512 fully connected
layer with ReLU (the features), and 512 -> 41 for the heads: 0.44 G multiply-adds
(:func:`reference_model_macs`), about 6 ms on one core of the development machine with
onnxruntime 1.32, about 3 ms on two. Weights are
drawn from a fixed seed: the same bytes every time, but they were never trained, so the outputs
mean nothing about a face.

Built with the ``onnx.helper`` API (opset 17), in well under a second; :func:`reference_model_path`
builds it on first use into a cache folder, under a name keyed by the content's hash, rather than
shipping 750 KB of random weights in the repository: the recipe is the source of truth and is
reviewable; the file is reproducible from it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import numpy as np
import onnx
from numpy.random import default_rng  # imported with the module, not by the first build
from onnx import TensorProto, helper, numpy_helper

from ..files import replace_whole
from .contract import CALIB, CALIB_SHAPE, INPUT_IMG, INPUT_IMG_SHAPE, MODEL_FRAME
from .decode import PROBABILITY_HEADS, SIDES, WHEEL_ON_RIGHT_HEAD, face_descs_head
from .metadata import encode_output_slices

__all__ = [
    "CACHE_ENV",
    "FACE_DESCS_WIDTH",
    "FEATURES_HEAD",
    "FEATURES_WIDTH",
    "OPSET",
    "OUTPUT_NAME",
    "REFERENCE_CHECKPOINT",
    "REFERENCE_SEED",
    "REFERENCE_SLICES",
    "build_reference_model",
    "build_shifted_model",
    "build_stalling_model",
    "default_cache_dir",
    "reference_model_macs",
    "reference_model_path",
    "write_model",
]

OPSET = 17
IR_VERSION = 8  # the IR version of opset 17; any onnxruntime that runs opset 17 reads it
OUTPUT_NAME = "outputs"
FACE_DESCS_WIDTH = 12
FEATURES_HEAD = "features"
FEATURES_WIDTH = 512
REFERENCE_SEED = 20260701
REFERENCE_CHECKPOINT = "aio-dms reference v1 (untrained, seed 20260701)"
CACHE_ENV = "AIO_DMS_CACHE_DIR"
"""Overrides where :func:`reference_model_path` keeps built models."""

# (out channels, kernel, stride, padding) of the convolutions, input 1 channel.
_CONVS = ((32, 4, 4, 0), (32, 3, 2, 1), (64, 3, 2, 1), (128, 3, 2, 1))


def _layout() -> dict[str, slice]:
    heads: list[tuple[str, int]] = []
    for side in SIDES:
        heads.append((face_descs_head(side), FACE_DESCS_WIDTH))
        heads.extend((f"{head}_{side}", 1) for head in PROBABILITY_HEADS)
    heads.append((WHEEL_ON_RIGHT_HEAD, 1))
    heads.append((FEATURES_HEAD, FEATURES_WIDTH))
    table: dict[str, slice] = {}
    start = 0
    for name, width in heads:
        table[name] = slice(start, start + width)
        start += width
    return table


REFERENCE_SLICES: Mapping[str, slice] = MappingProxyType(_layout())
"""The reference model's head table: 553 values, heads first, features last."""
_HEADS_WIDTH: int = REFERENCE_SLICES[FEATURES_HEAD].start
_OUTPUT_LENGTH: int = REFERENCE_SLICES[FEATURES_HEAD].stop


def _conv_sizes() -> list[tuple[int, int, int, int, int]]:
    """(in channels, out channels, kernel, out rows, out cols) of each convolution."""
    rows, cols = MODEL_FRAME
    channels = 1
    sizes = []
    for out, kernel, stride, pad in _CONVS:
        rows = (rows + 2 * pad - kernel) // stride + 1
        cols = (cols + 2 * pad - kernel) // stride + 1
        sizes.append((channels, out, kernel, rows, cols))
        channels = out
    return sizes


def reference_model_macs() -> int:
    """Multiply-adds of one run of the reference model (convolutions and fully connected layers)."""
    convs = sum(i * o * k * k * r * c for i, o, k, r, c in _conv_sizes())
    features_in = _CONVS[-1][0] + CALIB_SHAPE[1]
    return convs + features_in * FEATURES_WIDTH + FEATURES_WIDTH * _HEADS_WIDTH


def _metadata(model: onnx.ModelProto, checkpoint: str, description: str) -> None:
    for key, value in (
        ("model_checkpoint", checkpoint),
        ("output_slices", encode_output_slices(REFERENCE_SLICES)),
        ("description", description),
    ):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value


def _inputs() -> list[onnx.ValueInfoProto]:
    return [
        helper.make_tensor_value_info(INPUT_IMG, TensorProto.UINT8, list(INPUT_IMG_SHAPE)),
        helper.make_tensor_value_info(CALIB, TensorProto.FLOAT, list(CALIB_SHAPE)),
    ]


def _output() -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [1, _OUTPUT_LENGTH])


def _finish(
    nodes: list[onnx.NodeProto],
    initializers: list[onnx.TensorProto],
    name: str,
    checkpoint: str,
    description: str,
    *,
    check: bool,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, _inputs(), [_output()], initializer=initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="aio-dms",
        ir_version=IR_VERSION,
        doc_string=description,
    )
    _metadata(model, checkpoint, description)
    if check:
        onnx.checker.check_model(model)
    return model


def build_reference_model(seed: int = REFERENCE_SEED, *, check: bool = True) -> onnx.ModelProto:
    """The reference model (see the module docstring): untrained, weights drawn from ``seed``;
    ``check``: validated by onnx's checker (whose first run in a process holds the interpreter
    for about 20 ms)."""
    rng = default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    const("image_shape", np.array([1, 1, *MODEL_FRAME], dtype=np.int64))
    nodes.append(helper.make_node("Cast", [INPUT_IMG], ["pixels"], to=TensorProto.FLOAT))
    nodes.append(helper.make_node("Reshape", ["pixels", "image_shape"], ["image"]))
    x = "image"
    for index, (in_ch, out_ch, kernel, _, _) in enumerate(_conv_sizes()):
        _, _, stride, pad = _CONVS[index]
        fan_in = in_ch * kernel * kernel
        w = rng.standard_normal((out_ch, in_ch, kernel, kernel)) * np.sqrt(2.0 / fan_in)
        b = rng.standard_normal(out_ch) * 0.1
        if index == 0:  # fold (pixel - 128) / 64 into the first layer (no padding: exact)
            b = b - 128.0 / 64.0 * w.sum(axis=(1, 2, 3))
            w = w / 64.0
        wn = const(f"conv{index}.weight", w.astype(np.float32))
        bn = const(f"conv{index}.bias", b.astype(np.float32))
        conv = helper.make_node(
            "Conv",
            [x, wn, bn],
            [f"conv{index}"],
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
        )
        nodes += [conv, helper.make_node("Relu", [f"conv{index}"], [f"relu{index}"])]
        x = f"relu{index}"
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"]))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["pooled_flat"], axis=1))
    nodes.append(helper.make_node("Concat", ["pooled_flat", CALIB], ["embedding"], axis=1))
    width_in = _CONVS[-1][0] + CALIB_SHAPE[1]
    w1 = rng.standard_normal((width_in, FEATURES_WIDTH)) * np.sqrt(2.0 / width_in)
    b1 = rng.standard_normal(FEATURES_WIDTH) * 0.1
    w2 = rng.standard_normal((FEATURES_WIDTH, _HEADS_WIDTH)) * (0.5 / np.sqrt(FEATURES_WIDTH))
    b2 = rng.standard_normal(_HEADS_WIDTH) * 0.5
    fc1 = [const("fc1.weight", w1.astype(np.float32)), const("fc1.bias", b1.astype(np.float32))]
    fc2 = [const("fc2.weight", w2.astype(np.float32)), const("fc2.bias", b2.astype(np.float32))]
    nodes.append(helper.make_node("Gemm", ["embedding", *fc1], ["fc1"]))
    nodes.append(helper.make_node("Relu", ["fc1"], ["linear"]))
    nodes.append(helper.make_node("Gemm", ["linear", *fc2], ["heads"]))
    nodes.append(helper.make_node("Concat", ["heads", "linear"], [OUTPUT_NAME], axis=1))
    return _finish(
        nodes,
        inits,
        "dms_reference",
        REFERENCE_CHECKPOINT if seed == REFERENCE_SEED else f"aio-dms reference (seed {seed})",
        "UNTRAINED reference model with openpilot's driver-monitoring I/O contract: deterministic "
        f"random weights (seed {seed}); its outputs carry no information about the driver.",
        check=check,
    )


def build_shifted_model(
    head: str, shift: float, seed: int = REFERENCE_SEED, *, check: bool = True
) -> onnx.ModelProto:
    """The reference model of ``seed`` with the bias of one output head moved by ``shift``: every
    value of ``head`` (a name of :data:`REFERENCE_SLICES` other than the features) comes out
    ``shift`` larger, the rest of the output as the reference model's. A probability head's
    published value becomes ``sigmoid(logit + shift)``, so which frames cross a threshold is
    known from the reference model's own outputs: a second model for comparisons whose
    differences are known. :class:`ValueError` for another head name or a shift that is not a
    finite number."""
    if head not in REFERENCE_SLICES or head == FEATURES_HEAD:
        heads = sorted(name for name in REFERENCE_SLICES if name != FEATURES_HEAD)
        raise ValueError(f"head: expected one of {heads}, got {head!r}")
    if isinstance(shift, bool) or not isinstance(shift, int | float) or not np.isfinite(shift):
        raise ValueError(f"shift: expected a finite number, got {shift!r}")
    model = build_reference_model(seed, check=False)
    bias = next(tensor for tensor in model.graph.initializer if tensor.name == "fc2.bias")
    values = numpy_helper.to_array(bias).copy()
    values[REFERENCE_SLICES[head]] += np.float32(shift)
    bias.CopyFrom(numpy_helper.from_array(values, bias.name))
    checkpoint = f"aio-dms reference (seed {seed}, {head} shifted by {shift:+g})"
    for entry in model.metadata_props:
        if entry.key == "model_checkpoint":
            entry.value = checkpoint
    if check:
        onnx.checker.check_model(model)
    return model


def build_stalling_model(matmuls: int = 400, size: int = 512) -> onnx.ModelProto:
    """A model with the reference contract that runs long: a chain of ``matmuls`` products with a
    ``size`` x ``size`` orthogonal matrix (onnxruntime checks its terminate flag between nodes, so
    a run of it stops promptly when asked). Its output is ``calib``'s sum in every value. For tests
    of overruns; untrained."""
    if matmuls < 1 or size < 1 or INPUT_IMG_SHAPE[1] % size or INPUT_IMG_SHAPE[1] // size < size:
        raise ValueError(
            f"need matmuls >= 1 and a size that divides {INPUT_IMG_SHAPE[1]} with at least size "
            f"rows; got matmuls={matmuls}, size={size}"
        )
    rng = default_rng(1)
    orthogonal, _ = np.linalg.qr(rng.standard_normal((size, size)))
    tiles = -(-_OUTPUT_LENGTH // size)
    inits = [
        numpy_helper.from_array(orthogonal.astype(np.float32), "weight"),
        numpy_helper.from_array(np.array([-1, size], dtype=np.int64), "rows_shape"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
        numpy_helper.from_array(np.array([size], dtype=np.int64), "size"),
        numpy_helper.from_array(np.array([1, tiles], dtype=np.int64), "tiles"),
        numpy_helper.from_array(np.array([_OUTPUT_LENGTH], dtype=np.int64), "length"),
        numpy_helper.from_array(np.array(0.0, dtype=np.float32), "nothing"),
    ]
    nodes = [
        helper.make_node("Cast", [INPUT_IMG], ["pixels"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["pixels", "rows_shape"], ["rows"]),
        helper.make_node("Slice", ["rows", "zero", "size", "zero"], ["x0"]),
    ]
    nodes += [
        helper.make_node("MatMul", [f"x{i}", "weight"], [f"x{i + 1}"]) for i in range(matmuls)
    ]
    nodes += [
        helper.make_node("ReduceMean", [f"x{matmuls}"], ["mean"], axes=[0], keepdims=1),
        helper.make_node("Tile", ["mean", "tiles"], ["tiled"]),
        helper.make_node("Slice", ["tiled", "zero", "length", "one"], ["cut"]),
        helper.make_node("Mul", ["cut", "nothing"], ["zeros"]),
        helper.make_node("ReduceSum", [CALIB], ["calib_sum"], keepdims=1),
        helper.make_node("Add", ["zeros", "calib_sum"], [OUTPUT_NAME]),
    ]
    return _finish(
        nodes,
        inits,
        "dms_stalling",
        "aio-dms stalling test model (untrained)",
        f"UNTRAINED test model with the DMS contract that spends its time in {matmuls} matrix "
        "products; for overrun tests.",
        check=True,
    )


def _write_bytes(data: bytes, path: Path) -> Path:
    """Write ``data`` to ``path`` whole (a reader never sees half a file), its folder made if
    missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return replace_whole(path, lambda target: target.write_bytes(data))


def write_model(model: onnx.ModelProto, path: str | Path) -> Path:
    """Write ``model`` to ``path`` atomically."""
    return _write_bytes(model.SerializeToString(deterministic=True), Path(path))


def default_cache_dir() -> Path:
    """``$AIO_DMS_CACHE_DIR``, else ``$XDG_CACHE_HOME/aio-dms``, else ``~/.cache/aio-dms``."""
    if override := os.environ.get(CACHE_ENV):
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aio-dms"


def reference_model_path(cache_dir: str | Path | None = None) -> Path:
    """The reference model's file, built on first use (a fraction of a second) into ``cache_dir``
    (default :func:`default_cache_dir`) as ``dms-reference-<sha256 prefix>.onnx``.

    The name is keyed by the hash of the bytes the builder produces now, so a changed recipe (or a
    numpy whose random stream differs) never picks up a stale file, and a file whose bytes do not
    match its name is rebuilt. The model is checked (onnx's checker) as it is written: a file
    that holds the same bytes was checked then.
    """
    model = build_reference_model(check=False)
    data = model.SerializeToString(deterministic=True)
    digest = hashlib.sha256(data).hexdigest()
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = folder / f"dms-reference-{digest[:16]}.onnx"
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == digest:
        return path
    onnx.checker.check_model(model)
    return _write_bytes(data, path)
