"""The benchmarks' plain loops: the reference model's onnxruntime session as the service sets
its own (one intra-op thread, no spinning), run frame after frame on the calling thread."""

from __future__ import annotations

from typing import Any

import onnxruntime as ort

from pipelines.dms.model.reference import reference_model_path


def one_thread_session(path: str | None = None) -> Any:
    """An onnxruntime session of ``path`` (default: the reference model) on one thread."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = path or str(reference_model_path())
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
