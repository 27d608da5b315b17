"""Signals at chosen moments of an ``aio-dms`` process, for the tests of stopping it
(``tests/test_cli_signals.py``): a child started with this directory on its ``PYTHONPATH`` imports
this module as ``site`` ends — after the interpreter's own start-up, which no code of the
command's can cover — and signals itself at the moment its environment names:

- ``AIO_DMS_SIGNAL_AT=import:MODULE``: as ``MODULE`` is first imported (a moment of the start-up);
- ``AIO_DMS_SIGNAL_AT=exit``: once the main thread has finished and the interpreter waits for the
  other threads (the exit functions, the interpreter's finalisation come after);
- ``AIO_DMS_SIGNAL_AT=teardown``: as the interpreter finalises its modules (a moment a process
  that leaves before it never reaches).

``AIO_DMS_SIGNALS`` names the signals, sent one after the other (``SIGTERM``, ``SIGINT,SIGTERM``,
``SIGTERM,SIGTERM``). Sent from the main thread (at an import), each is handled before the next
is sent: ``os.kill`` runs the handler of a signal to its own process before it returns. Each one
is written to standard error as it is sent (``sent SIGTERM``): the test sees the moment came.
"""

import os
import signal
import sys
import threading

_AT = os.environ.get("AIO_DMS_SIGNAL_AT", "")
_SIGNALS = [
    signal.Signals[name] for name in os.environ.get("AIO_DMS_SIGNALS", "").split(",") if name
]


def _send_all() -> None:
    for signum in _SIGNALS:
        os.write(2, f"sent {signum.name}\n".encode())
        os.kill(os.getpid(), signum)


class _AtImport:
    """A finder that finds nothing, and signals as the named module is first looked for."""

    def __init__(self, module: str) -> None:
        self.module = module

    def find_spec(self, name, path=None, target=None):
        if name == self.module:
            sys.meta_path.remove(self)
            _send_all()
        return None


class _AtTeardown:
    def __del__(self) -> None:
        _send_all()


if _AT.startswith("import:"):
    sys.meta_path.insert(0, _AtImport(_AT.removeprefix("import:")))
elif _AT == "exit":

    def _after_main() -> None:
        threading.main_thread().join()  # returns as the interpreter begins to shut down
        _send_all()

    threading.Thread(target=_after_main, name="signals at exit").start()  # joined at exit
elif _AT == "teardown":
    _teardown = _AtTeardown()
