"""The Ray cluster a fleet runs on: a local one started for the run, or one joined at an address.

**Local** (no ``--address``): a one-node cluster on this machine, started for the run and ended
with it — its node address 127.0.0.1, no dashboard, Ray's usage statistics off, its workers at
this process's priority (not Ray's niceness 15), an object store
of :data:`OBJECT_STORE_BYTES` (a replay hands back its summary only: the rows go to files), and
token authentication with a fresh token held in this process's environment (and its children's,
Ray's processes) only, so that nothing is written to the user's home. Ray's own processes listen
on all interfaces whatever the node address (an exception to the service's loopback rule that
cannot be removed from here): run fleets on a trusted host.

**Joined** (``--address HOST:PORT``, the head's GCS address, or ``ray://HOST:PORT`` through Ray
Client): nothing is started or ended. A cluster with token authentication takes its token as
Ray's own tools do: ``RAY_AUTH_MODE=token`` with ``RAY_AUTH_TOKEN`` (the token) or
``RAY_AUTH_TOKEN_PATH`` (a file holding it) in the environment, or the file
``~/.ray/auth_token``. An address that does not answer within :data:`CONNECT_TIMEOUT` is refused
in one line.

Ray reads some settings from the environment as it is imported: :func:`ray_environment` sets
them, and must come first (:class:`FleetCluster` calls it).
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import MutableMapping
from pathlib import Path
from types import TracebackType
from typing import Any

from ...echo import shown

__all__ = [
    "CONNECT_TIMEOUT",
    "OBJECT_STORE_BYTES",
    "ClusterError",
    "FleetCluster",
    "local_cpus",
    "ray_environment",
]

OBJECT_STORE_BYTES = 128 << 20
CONNECT_TIMEOUT = 10.0
"""Seconds an address given may take to accept a connection."""


class ClusterError(Exception):
    """The cluster could not be started or joined (one line: why)."""


def ray_environment(environ: MutableMapping[str, str] | None = None, *, local: bool) -> None:
    """Set what Ray reads from the environment, unless set already: usage statistics off; for
    a local cluster, its workers at this process's priority (Ray's default is niceness 15, at
    which a replay beside two busy processes ran at 3 frames a second instead of 45), its node
    address the loopback one, and token authentication with a fresh token — those two only
    before Ray is imported (Ray reads them as it is imported; imported already,
    Ray's own defaults stand for those two)."""
    env = os.environ if environ is None else environ
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if local:  # Ray's workers run at niceness 15: beside any busy process, they would crawl
        env.setdefault("RAY_worker_niceness", "0")
    if local and "ray" in sys.modules and environ is None:
        return  # read as Ray was imported: a token set now would not reach this process's Ray
    if local:
        env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # the node's address: loopback
        if "RAY_AUTH_MODE" not in env:
            env["RAY_AUTH_MODE"] = "token"
            env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)


def local_cpus() -> int:
    """The CPUs this process may use: a local cluster's."""
    return len(os.sched_getaffinity(0))


def _reachable(address: str) -> None:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"--address {shown(address)}: expected HOST:PORT or ray://HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT):
            pass
    except OSError as exc:
        raise ClusterError(
            f"--address {shown(address)}: no Ray cluster answers there: {exc}"
        ) from None


def _signal_handlers() -> dict[int, Any]:
    """This process's SIGINT and SIGTERM handlers (none off the main thread: only it sets them)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}


def _restore(handlers: dict[int, Any]) -> None:
    for signum, handler in handlers.items():
        if handler is not None:
            signal.signal(signum, handler)


class FleetCluster:
    """``with FleetCluster(address, cpus) as cluster:`` — the cluster to run on (see the
    module's description); ``cpus``: a local cluster's CPUs (None: the ones this process may
    use); ``temp_dir``: where a local cluster keeps its sockets and logs (None: Ray's default,
    ``/tmp/ray``). :class:`ClusterError` where it cannot be had."""

    def __init__(
        self, address: str | None = None, cpus: int | None = None, temp_dir: Path | None = None
    ) -> None:
        self.address = address
        self._cpus = cpus
        self._temp_dir = temp_dir
        self.start_seconds: float | None = None
        """How long starting (or joining) it took."""
        self._connected = False

    def __enter__(self) -> FleetCluster:
        ray_environment(local=self.address is None)
        if self.address is not None:
            _reachable(self.address)
        import ray

        started = time.monotonic()
        options: dict[str, Any] = {
            "include_dashboard": False,
            "logging_level": logging.WARNING,
            "log_to_driver": False,
            "configure_logging": False,
        }
        if self.address is None:
            options["num_cpus"] = self._cpus or local_cpus()
            options["object_store_memory"] = OBJECT_STORE_BYTES
            if self._temp_dir is not None:
                options["_temp_dir"] = str(self._temp_dir)
        else:
            options["address"] = self.address
        handlers = _signal_handlers()
        try:
            ray.init(**options)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
            ray.shutdown()
            where = f"at {self.address}" if self.address else "on this machine"
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ClusterError(f"no Ray cluster could be had {where}: {text}") from None
        finally:
            _restore(handlers)  # Ray's own SIGTERM handler would abort this process
        self._connected = True
        self.start_seconds = time.monotonic() - started
        return self

    def cpus(self) -> int:
        """The cluster's CPUs, as Ray counts them."""
        import ray

        return int(ray.cluster_resources().get("CPU", 0))  # type: ignore[no-untyped-call]

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._connected:
            import ray

            ray.shutdown()  # a local cluster's processes end with it; a joined one's stay
            self._connected = False
