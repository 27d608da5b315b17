"""pipelines — applications built on the runtime: the driver-monitoring (DMS) service and its CLI."""

from aio_runtime import __version__ as __version__
