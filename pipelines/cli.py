"""The ``aio-dms`` command."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version


def _version() -> str:
    try:
        return version("aio-dms")
    except PackageNotFoundError:
        return "unknown"


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
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import main as demo_main

        return demo_main()
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
