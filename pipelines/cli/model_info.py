"""``aio-dms model-info``: a DMS model's contract as JSON, the model checked as the service would
load it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..dms.config.values import readable_file
from ..dms.model.contract import load_contract
from ..dms.model.limits import ModelContractError
from ..dms.model.reference import reference_model_path
from ..exit_codes import ExitCode
from ..stopping import Stopping

__all__ = ["add_arguments", "main", "single_value_flags"]


def add_arguments(parser: argparse.ArgumentParser, command: str = "model-info") -> None:
    """``aio-dms model-info``'s options."""
    parser.add_argument(
        "--model",
        metavar="PATH",
        help="an ONNX model with openpilot's driver-monitoring contract (default: the untrained "
        "reference model, built on first use)",
    )


def single_value_flags() -> set[str]:
    """The options that take one value (which may begin with ``-``)."""
    return {"--model"}


def main(args: argparse.Namespace, stopping: Stopping | None = None) -> int:
    """The contract on standard output; the exit code: 2 for a model path refused before it is
    read, 1 for a model that fails its check."""
    model: str | None = args.model
    if model is not None:
        try:  # as run and replay check it: refused before any work
            readable_file("model", Path(model), "expected an ONNX model file")
        except ValueError as exc:
            print(f"aio-dms model-info: {exc}", file=sys.stderr)
            return ExitCode.REFUSED
    try:
        contract = load_contract(model if model is not None else reference_model_path())
    except (ModelContractError, OSError) as exc:
        print(f"aio-dms model-info: {exc}", file=sys.stderr)
        return ExitCode.FAILED  # the model was checked, and fails
    print(json.dumps(contract.to_json(), indent=2))
    return ExitCode.OK
