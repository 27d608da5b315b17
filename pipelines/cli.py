"""The ``aio-dms`` command."""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import PackageNotFoundError, version

__all__ = ["main"]


def _version() -> str:
    try:
        return version("aio-dms")
    except PackageNotFoundError:
        return "unknown"


def _model_info(model: str | None) -> int:
    from .dms.model import ModelContractError, load_contract
    from .dms.reference_model import reference_model_path

    try:
        contract = load_contract(model if model is not None else reference_model_path())
    except (ModelContractError, OSError) as exc:
        print(f"aio-dms model-info: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(contract.to_json(), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="aio-dms",
        description="Driver monitoring on in-car inference hardware, with no unbounded wait.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "demo",
        help="a short demonstration of the runtime core: bounded waits, a mailbox timeout, "
        "availability going unavailable and recovering",
    )
    run_parser = commands.add_parser(
        "run",
        help="run the DMS service (defaults: synthetic camera, the bundled reference model, "
        "the simulated accelerator)",
    )
    from .dms.run import add_arguments

    add_arguments(run_parser)
    model_info = commands.add_parser(
        "model-info",
        help="print a DMS model's contract as JSON: inputs with shapes and dtypes, the output, "
        "the output slices as [start, stop]; the model is checked as the service would load it",
    )
    model_info.add_argument(
        "--model",
        metavar="PATH",
        help="an ONNX model with openpilot's driver-monitoring contract (default: the untrained "
        "reference model, built on first use)",
    )
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import main as demo_main

        return demo_main()
    if args.command == "run":
        from .dms.run import run

        return run(args)
    if args.command == "model-info":
        return _model_info(args.model)
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
