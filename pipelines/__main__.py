"""The ``aio-dms`` process: its console script, ``python -m pipelines`` and
``python -m pipelines.cli`` all start here.

SIGINT and SIGTERM are this process's from the first line of :func:`main`, before the command's
modules are imported (:mod:`pipelines.stopping`); the process ends through
:meth:`~pipelines.stopping.Stopping.finish`, so that a signal at its very end still exits as the
exit-code table says.

What remains before that first line, and no code of ours can cover: the interpreter starting (a
SIGINT or SIGTERM there has its default effect: the process is killed by the signal), then
``site`` importing the installation's path hooks (Python's own SIGINT handler is in place by
then: a SIGINT raises ``KeyboardInterrupt`` in ``site``, a SIGTERM still kills), then the console
script's ``import sys`` and the import of this module, which imports nothing but
:mod:`pipelines.stopping` and the few standard modules it needs (typing is not among them).
Measured on an idle 2-core machine: about 7 ms of interpreter, 15 ms of ``site`` (most of it an
editable installation's path finder), 2-3 ms from this module's import to the handlers. A signal
sent right as the process is spawned lands in that window.
"""

from __future__ import annotations

import sys

from .exit_codes import ExitCode, stopped_exit_code
from .stopping import Interrupted, Stopping

TYPE_CHECKING = False  # typing is not imported before the handlers are in (see stopping)
if TYPE_CHECKING:
    from typing import NoReturn

__all__ = ["main"]


def main() -> NoReturn:
    stopping = Stopping.for_process()  # a signal from here on is held until the command arms it
    try:
        from .cli import main as command  # what reporting a stop needs, imported whole

        code = command(sys.argv[1:], stopping)
    except Interrupted:  # a first signal just as the command returned, before it had ended
        code = stopped_exit_code(sys.argv[1] if len(sys.argv) > 1 else None)
    except SystemExit as exc:  # argparse's own exits: --help, --version, a bad option
        code = _code(exc.code)
    except Exception:  # a fault of ours: its traceback, as the interpreter would print it
        sys.excepthook(*sys.exc_info())
        code = ExitCode.FAILED
    stopping.finish(code)


def _code(given: object) -> int:
    if given is None or isinstance(given, int):
        return int(given or 0)
    print(given, file=sys.stderr)  # as the interpreter prints a SystemExit's message
    return 1


if __name__ == "__main__":
    main()
